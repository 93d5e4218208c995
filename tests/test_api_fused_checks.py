"""A direct submission's checks in one statement (``fused_checks``, quasar/api/service.py) against
the reference, the same checks one statement each.

Two services, each on a fresh database of the same backend, on one chain and one clock, take the
same random sequence of signed direct submissions: three registered miners and a stranger, three
client IPs, fresh and reused nonces (replays), a small pool of commits (duplicates), a rate limit of
four an hour, IP bans (some already over) written into both databases between requests, and the
clock moving on by seconds to hours. Every outcome must be the same (the accepted submission, or
the refusal's type, status, detail and headers), and so must what the two databases hold.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
from sqlalchemy import select

from api_fixtures import api_config, commit_of
from quasar import auth
from quasar.api import schemas
from quasar.api.db import Database, IpBan, Submission, UsedNonce
from quasar.api.service import ApiError, Authenticated, SubmissionService

SUBMISSIONS = 220
IPS = ("10.0.0.1", "10.0.0.2", "2001:db8::7")


@pytest.fixture(params=["sqlite", "postgresql"])
def two_databases(request, tmp_path) -> tuple[Database, Database]:
    """Two fresh databases on one backend, migrated: (fused checks, reference)."""
    if request.param == "sqlite":
        urls = (f"sqlite:///{tmp_path}/fused.sqlite3", f"sqlite:///{tmp_path}/reference.sqlite3")
    else:
        server = request.getfixturevalue("postgres")
        urls = tuple(server.create_database(f"quasar_{uuid.uuid4().hex[:12]}") for _ in range(2))
    databases = tuple(Database(url) for url in urls)
    for database in databases:
        database.upgrade()
    yield databases
    for database in databases:
        database.dispose()


def outcome(call) -> tuple:
    try:
        return ("accepted", call().model_dump())
    except ApiError as error:
        return ("ApiError", error.status, error.detail, error.headers)
    except auth.AuthFailure as error:
        return ("AuthFailure", error.status_code, error.reason)


def contents(database: Database) -> tuple[list, list, list]:
    with database.read() as session:
        submissions = [
            {column: getattr(row, column) for column in Submission.__table__.columns.keys()}
            for row in session.scalars(select(Submission).order_by(Submission.id))
        ]
        nonces = sorted((row.hotkey, row.nonce) for row in session.scalars(select(UsedNonce)))
        bans = sorted((row.client_ip, row.banned_until) for row in session.scalars(select(IpBan)))
    return submissions, nonces, bans


@pytest.mark.parametrize("seed", [1, 2])
def test_the_fused_checks_decide_every_submission_as_the_checks_one_by_one(two_databases, chain, wallets, seed):
    rng = random.Random(seed)
    now = [time.time()]  # both services see the same instant; it moves only below

    def clock() -> float:
        return now[0]

    config = api_config(wallets["api"].hotkey.ss58_address, submissions_per_hour=4)
    fused, reference = (
        SubmissionService(config, chain, database, clock, fused_checks=flag)
        for database, flag in zip(two_databases, (True, False))
    )
    registered = auth.require_registered(chain)
    used: list[tuple[str, int]] = []
    kinds: dict[str, int] = {}
    for _ in range(SUBMISSIONS):
        if rng.random() < 0.05:
            ban = dict(
                client_ip=rng.choice(IPS),
                banned_at=clock(),
                banned_until=clock() + rng.uniform(-60, 900),
                reason="five failed validations",
            )
            for database in two_databases:
                database.write(lambda session: session.add(IpBan(**ban)))
        if rng.random() < 0.1:
            now[0] += rng.choice([1.0, 60.0, 900.0, 4000.0])
        name = "stranger" if rng.random() < 0.04 else rng.choice(("a", "b", "c"))
        hotkey = wallets[name].hotkey.ss58_address
        if used and rng.random() < 0.08:
            hotkey, nonce = rng.choice(used)  # a replay
        else:
            # Another hotkey's nonce is not a replay (a fresh one: btauth/1 refuses stale nonces before this).
            fresh = [time_ns for _, time_ns in used if time_ns > (clock() - auth.MAX_REQUEST_AGE_S) * 1e9]
            nonce = rng.choice(fresh) if fresh and rng.random() < 0.05 else int(clock() * 1e9) + rng.randrange(10**6)
            used.append((hotkey, nonce))
        caller = Authenticated(hotkey, nonce, rng.choice(IPS), miner=True, authorize=registered)
        request = schemas.SubmitKernelRequest(
            fork_url=f"https://github.com/{rng.choice(['x', 'y'])}/flash-linear-attention",
            # A small pool of commits per miner (duplicates happen), and one shared by all (copies happen).
            commit_hash=commit_of(
                rng.randrange(5) + 100 * ("a", "b", "c", "stranger").index(name)
                if rng.random() < 0.85
                else 1000 + rng.randrange(3)
            ),
            target_sequence_length=rng.choice([4096, 1_000_000]),
            tokens_per_sec=round(rng.uniform(1e3, 1e8), 1),
        )
        answers = [
            outcome(lambda service=service: service.submit_direct(hotkey, caller.client_ip, request, caller))
            for service in (fused, reference)
        ]
        assert answers[0] == answers[1], (caller, request)
        kind = answers[0][0] if answers[0][0] == "accepted" else f"{answers[0][1]}"
        kinds[kind] = kinds.get(kind, 0) + 1
        if rng.random() < 0.1:
            assert contents(two_databases[0]) == contents(two_databases[1])
    assert contents(two_databases[0]) == contents(two_databases[1])
    # The sequence reached every outcome: accepted, banned or unregistered, replayed, rate-limited, duplicate.
    assert {"accepted", "403", "401", "429", "409"} <= set(kinds), kinds
