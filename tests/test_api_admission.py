"""The API's one submission rule (quasar/api/admission.py): its two paths, the checks in one statement
and the checks one at a time, agree on each check, on SQLite and PostgreSQL.

For each check, a database where that check alone refuses a signed direct submission (a banned
address, a hotkey at its rate limit, the same submission already waiting, another hotkey's commit):
the fused statement records nothing, the check's own statement refuses and no other does, and the
service refuses the submission with the check's status whichever path it takes. Leaving one check
out of the fused statement lets its attack through: the test that compares the paths fails then.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import delete

from api_fixtures import api_config, commit_of
from quasar import auth
from quasar.api import admission, schemas
from quasar.api.db import Database, IpBan, Submission
from quasar.api.errors import ApiError
from quasar.api.service import NONCE_RETENTION_S, Authenticated, SubmissionService

FORK = "https://github.com/miner/flash-linear-attention"
TARGET = 1_000_000
LIMIT = 3
CLIENT = "10.0.0.9"
STATUS = {"not banned": 403, "under the rate limit": 429, "not already waiting": 409, "not a copy": 409}


def stored_submission(hotkey: str, commit: str, now: float, state: str = "ready", fork: str = FORK) -> dict:
    """A submission row as the API stores one (admission.INSERT_SUBMISSION's parameters)."""
    return {
        "hotkey": hotkey,
        "method": "direct",
        "state": state,
        "commitment_hash": None,
        "target_sequence_length": TARGET,
        "submitted_at": now - 60,
        "submitted_block": 1,
        "ready_at": now - 60,
        "ready_block": 1,
        "round_id": 0,
        "fork_url": fork,
        "commit_hash": commit,
        "claimed_tokens_per_sec": 1e5,
        "vram_mb": None,
        "benchmarks": None,
        "client_ip": "10.0.0.1",
    }


def make_refuse(database: Database, check: str, miner: str, other: str, now: float) -> None:
    """Write what makes ``check`` (a name of admission.SUBMISSION_CHECKS) refuse ``miner``'s
    submission of ``commit_of(1)`` from ``CLIENT``, and nothing else refuse it."""

    def write(session) -> None:
        connection = session.connection()
        if check == "not banned":
            session.add(IpBan(client_ip=CLIENT, banned_at=now, banned_until=now + 600, reason="five failures"))
        elif check == "under the rate limit":
            for n in range(LIMIT):  # commitments: neither waiting nor a commit anyone made ready
                admission.INSERT_SUBMISSION.scalar(
                    connection, stored_submission(miner, commit_of(50 + n), now, state="committed")
                )
        elif check == "not already waiting":
            admission.INSERT_SUBMISSION.scalar(connection, stored_submission(miner, commit_of(1), now))
        elif check == "not a copy":
            admission.INSERT_SUBMISSION.scalar(
                connection,
                stored_submission(other, commit_of(1), now, fork="https://github.com/author/flash-linear-attention"),
            )

    database.write(write)


class Undone(Exception):
    """Raised to undo a write; its argument is what the write saw."""


def params_of(miner: str, now: float) -> dict:
    return {
        "client_ip": CLIENT,
        "now": now,
        "hotkey": miner,
        "limit": LIMIT,
        "fork_url": FORK,
        "commit_hash": commit_of(1),
        "target_sequence_length": TARGET,
        "counts_from": admission.AFTER_EVERY_SUBMISSION,
        "before_id": admission.AFTER_EVERY_SUBMISSION,
        "blocks_until_reveal": 100,
    }


def test_the_rule_is_the_four_checks_in_order():
    assert [check.name for check in admission.SUBMISSION_CHECKS] == list(STATUS)


@pytest.mark.parametrize("check", [None, *STATUS])
def test_each_check_refuses_alike_in_one_statement_and_one_by_one(database, chain, wallets, check):
    now = time.time()
    miner, other = wallets["a"].hotkey.ss58_address, wallets["b"].hotkey.ss58_address
    if check is not None:
        make_refuse(database, check, miner, other, now)
    params = params_of(miner, now)

    def one_by_one(session) -> list[str]:
        return [
            each.name for each in admission.SUBMISSION_CHECKS if each.refusal(session.connection(), params) is not None
        ]

    def fused(checks=admission.SUBMISSION_CHECKS):
        statement = admission.fused_statement(database.dialect, checks, retention_s=NONCE_RETENTION_S)

        def run(session) -> None:
            recorded = statement.run(session.connection(), {**params, "nonce_hotkey": miner, "nonce": time.time_ns()})
            raise Undone(recorded.rowcount)  # the write is undone: the nonce table stays as it was

        with pytest.raises(Undone) as undone:
            database.write(run)
        return undone.value.args[0]

    with database.read() as session:
        assert one_by_one(session) == ([] if check is None else [check])
    assert fused() == (1 if check is None else 0)
    if check is not None:
        # A fused statement that left this check out would let this submission through: the paths
        # would disagree, as this test requires them not to.
        assert fused(tuple(each for each in admission.SUBMISSION_CHECKS if each.name != check)) == 1

    # The service, both ways: the same answer, the check's refusal.
    config = api_config(wallets["api"].hotkey.ss58_address, submissions_per_hour=LIMIT)
    request = schemas.SubmitKernelRequest(
        fork_url=FORK, commit_hash=commit_of(1), target_sequence_length=TARGET, tokens_per_sec=1e5
    )
    answers = []
    for flag in (True, False):
        service = SubmissionService(config, chain, database, lambda: now, fused_checks=flag)
        caller = Authenticated(miner, time.time_ns(), CLIENT, miner=True, authorize=auth.require_registered(chain))
        try:
            accepted = service.submit_direct(miner, CLIENT, request, caller)
            answers.append(("accepted", None))
            # Gone again, so the other path meets the same database.
            database.write(
                lambda session, sid=accepted.submission_id: session.execute(
                    delete(Submission).where(Submission.id == sid)
                )
            )
        except ApiError as error:
            answers.append((error.status, error.detail))
    assert answers[0] == answers[1]
    assert answers[0][0] == ("accepted" if check is None else STATUS[check])


def test_two_hotkeys_submitting_one_commit_at_once_are_never_both_accepted(postgres, chain, wallets):
    """The attack: two hotkeys (a copier racing the author, or a miner with two hotkeys) submit the
    same commit at the same instant on PostgreSQL. Each write locks only its own hotkey unless it
    also locks the commit, and under READ COMMITTED neither sees the other's row: both would be
    accepted, and neither would be the copy."""
    database = Database(postgres.create_database(f"quasar_{uuid.uuid4().hex[:12]}"))
    database.upgrade()
    service = SubmissionService(api_config(wallets["api"].hotkey.ss58_address), chain, database)
    miners = [wallets[name].hotkey.ss58_address for name in ("a", "b")]
    barrier = threading.Barrier(2)

    def submit(miner: str, commit: str) -> str:
        request = schemas.SubmitKernelRequest(
            fork_url=f"https://github.com/{miner[:8]}/fla",
            commit_hash=commit,
            target_sequence_length=TARGET,
            tokens_per_sec=1e5,
        )
        caller = Authenticated(miner, time.time_ns(), CLIENT, miner=True, authorize=auth.require_registered(chain))
        barrier.wait()
        try:
            service.submit_direct(miner, CLIENT, request, caller)
            return "accepted"
        except ApiError as error:
            assert error.status == 409 and "a copy is not accepted" in error.detail, error.detail
            return "copy"

    try:
        with ThreadPoolExecutor(2) as pool:
            for trial in range(200):
                commit = commit_of(1000 + trial)
                outcomes = sorted(pool.map(submit, miners, [commit, commit]))
                assert outcomes == ["accepted", "copy"], f"trial {trial}: {outcomes}"
    finally:
        database.dispose()
