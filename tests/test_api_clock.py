"""The submission API's nonce ledger under a clock that steps back (NTP correcting a clock that ran
ahead, a VM resumed): a request it accepted is never accepted again.

The service runs on both backends with a clock the test moves; each request carries the nonce
``btauth/1`` verification would have let through at that moment (signed by a clock agreeing with
the API's), as tests/test_api_fused_checks.py drives it. Direct submissions take the fused checks
and the checks one by one; a commitment takes only the latter.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from api_fixtures import api_config, commit_of
from quasar import auth
from quasar.api import schemas
from quasar.api.db import Submission
from quasar.api.rules import commitment_hash, new_salt
from quasar.api.service import Authenticated, SubmissionService

IP = "10.0.0.1"


def submit(service, wallets, name: str, nonce_ns: int, kind: str, n: int):
    """One signed request of ``kind`` (direct, commit) from miner ``name`` with ``nonce_ns``."""
    hotkey = wallets[name].hotkey.ss58_address
    caller = Authenticated(hotkey, nonce_ns, IP, miner=True, authorize=auth.require_registered(service.chain))
    if kind == "commit":
        request = schemas.CommitRequest(
            commitment_hash=commitment_hash(new_salt(), "https://github.com/x/fla", commit_of(n)),
            target_sequence_length=1_000_000,
        )
        return service.commit(hotkey, IP, request, caller)
    claim = schemas.SubmitKernelRequest(
        fork_url="https://github.com/x/fla",
        commit_hash=commit_of(n),
        target_sequence_length=1_000_000,
        tokens_per_sec=1e5,
    )
    return service.submit_direct(hotkey, IP, claim, caller)


@pytest.mark.parametrize(("kind", "fused"), [("direct", True), ("direct", False), ("commit", False)])
def test_a_step_back_of_the_apis_clock_lets_no_replay_through(chain, wallets, database, kind, fused):
    now = [time.time()]
    service = SubmissionService(
        api_config(wallets["api"].hotkey.ss58_address), chain, database, lambda: now[0], fused_checks=fused
    )
    captured = int(now[0] * 1e9)
    submit(service, wallets, "a", captured, kind, 1)
    now[0] += 30.0  # half a minute later the ledger forgets what is older than its retention
    submit(service, wallets, "b", int(now[0] * 1e9), kind, 2)
    now[0] -= 29.0  # the clock steps back: the captured request is fresh again (1 s old)
    with pytest.raises(auth.AuthFailure) as replay:
        submit(service, wallets, "a", captured, kind, 1)
    assert replay.value.status_code == 401, replay.value.reason
    assert "30.0 s before the newest request this API accepted" in replay.value.reason
    assert "clock" in replay.value.reason and "stepped back" in replay.value.reason
    # A smaller step (signed 8 s before the newest accepted nonce) still goes through.
    submit(service, wallets, "c", int((now[0] + 22.0) * 1e9), kind, 3)


def test_a_step_back_of_the_apis_clock_does_not_supersede_a_miners_newer_submission(chain, wallets, database):
    """A miner's newer submission supersedes its older ones not yet reported on (docs/rules.md
    section 3), the newer by ready time: made ready after the clock stepped back ten minutes, the
    newer one was the older, superseded by the one it followed and never handed out."""
    now = [time.time()]
    service = SubmissionService(api_config(wallets["api"].hotkey.ss58_address), chain, database, lambda: now[0])
    first = submit(service, wallets, "a", int(now[0] * 1e9), "direct", 1)
    now[0] -= 20.0
    newer = submit(service, wallets, "a", int(now[0] * 1e9), "direct", 2)
    with database.read() as session:
        states = {row.id: (row.state, row.superseded_by) for row in session.scalars(select(Submission))}
    assert states == {first.submission_id: ("superseded", newer.submission_id), newer.submission_id: ("ready", None)}


def test_a_reveal_after_a_step_back_of_the_apis_clock_is_the_miners_newest_submission(chain, wallets, database):
    """A commitment revealed after a direct submission of its hotkey is the newer (it became ready
    later) and supersedes it; revealed after the clock stepped back 20 s, it was the older and was
    superseded instead."""
    now = [time.time()]
    service = SubmissionService(api_config(wallets["api"].hotkey.ss58_address), chain, database, lambda: now[0])
    hotkey, salt, fork = wallets["a"].hotkey.ss58_address, new_salt(), "https://github.com/x/fla"

    def caller() -> Authenticated:
        return Authenticated(hotkey, int(now[0] * 1e9), IP, miner=True, authorize=auth.require_registered(chain))

    committed = service.commit(
        hotkey,
        IP,
        schemas.CommitRequest(
            commitment_hash=commitment_hash(salt, fork, commit_of(1)), target_sequence_length=1_000_000
        ),
        caller(),
    )
    chain.advance(100)
    now[0] += 30.0
    direct = submit(service, wallets, "a", int(now[0] * 1e9), "direct", 2)
    now[0] -= 20.0
    reveal = schemas.RevealRequest(
        submission_id=committed.submission_id,
        commitment_salt=salt,
        fork_url=fork,
        commit_hash=commit_of(1),
        tokens_per_sec=1e5,
    )
    service.reveal(hotkey, IP, reveal, caller())
    with database.read() as session:
        states = {row.id: (row.state, row.superseded_by) for row in session.scalars(select(Submission))}
    assert states == {
        committed.submission_id: ("ready", None),
        direct.submission_id: ("superseded", committed.submission_id),
    }
