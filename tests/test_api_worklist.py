"""The work list's SQL (quasar/api/worklist.py) against a slow reference that reads every row and
applies the schedule's rules (quasar/scheduling.py) in plain Python, on random databases, on SQLite
and PostgreSQL: which submissions a validator is handed and in what order, and which ones a newer
submission supersedes."""

from __future__ import annotations

import random
import time

from sqlalchemy import insert, select

from api_fixtures import api_config, commit_of
from quasar import scheduling
from quasar.api import rules
from quasar.api.db import EvaluationLease, EvaluationReport, Submission
from quasar.api.service import MAX_FETCHES_PER_VALIDATOR, SubmissionService
from quasar.api.worklist import supersede_older


def random_database(service: SubmissionService, rng: random.Random, hotkeys: list[str], validators: list[str]) -> None:
    """Submissions of the given hotkeys in the rounds around the current one, in every state the
    schedule reads, with reports and leases of the given validators."""
    round_id = rules.round_of_block(service.current_block(), service.config.round_blocks).round_id
    now = service.clock()

    def fill(session) -> None:
        connection = session.connection()
        for n in range(rng.randint(5, 30)):
            result = connection.execute(
                insert(Submission.__table__),
                {
                    "hotkey": rng.choice(hotkeys),
                    "method": "direct",
                    "state": rng.choice(["ready", "ready", "ready", "superseded"]),
                    "target_sequence_length": rng.choice([1000, 250_000, 1_000_000]),
                    "submitted_at": now - 100 + n,
                    "submitted_block": 1,
                    "ready_at": now - rng.randrange(50),  # often equal: the id breaks the tie
                    "ready_block": 1,
                    "round_id": rng.randint(max(0, round_id - 3), round_id),
                    "fork_url": "https://github.com/a/fla",
                    "commit_hash": commit_of(n),
                    "claimed_tokens_per_sec": float(rng.randint(1, 5)),
                    "client_ip": "10.0.0.1",
                },
            )
            submission_id = result.inserted_primary_key[0]
            for validator in validators:
                if rng.random() < 0.25:
                    connection.execute(
                        insert(EvaluationReport.__table__),
                        {
                            "submission_id": submission_id,
                            "validator_hotkey": validator,
                            "reported_at": now,
                            "verdict": rng.choice(["passed", "failed"]),
                            "correct": True,
                            "logits_ok": True,
                            "measured_tokens_per_sec": float(rng.randint(1, 5)),
                            "reasons": [],
                        },
                    )
                elif rng.random() < 0.3:
                    connection.execute(
                        insert(EvaluationLease.__table__),
                        {
                            "submission_id": submission_id,
                            "validator_hotkey": validator,
                            "leased_until": now + rng.choice([-10.0, 100.0]),
                            "fetch_count": rng.randint(1, MAX_FETCHES_PER_VALIDATOR),
                            "first_round": rng.choice([None, round_id - 1, round_id]),
                        },
                    )

    service.database.write(fill)


def reference_work(service: SubmissionService, validator: str, limit: int) -> list[int]:
    """The ids the work endpoint should hand ``validator``: every row read, the rules applied in Python."""
    round_id = rules.round_of_block(service.current_block(), service.config.round_blocks).round_id
    now = service.clock()
    electorate = service.electorate()
    registered = set(service.registered_hotkeys())

    def read(session):
        return (
            session.scalars(select(Submission)).all(),
            session.scalars(select(EvaluationReport)).all(),
            session.scalars(select(EvaluationLease)).all(),
        )

    with service.database.read() as session:
        submissions, reports, leases = read(session)
    reporters = {s.id: {r.validator_hotkey for r in reports if r.submission_id == s.id} for s in submissions}
    mine = {lease.submission_id: lease for lease in leases if lease.validator_hotkey == validator}
    candidates = [
        scheduling.Queued(
            s.id,
            s.hotkey,
            s.ready_at,
            s.target_sequence_length,
            s.claimed_tokens_per_sec,
            any(electorate.weight(v) > 0 for v in reporters[s.id]),
        )
        for s in submissions
        if s.state == "ready"
        and s.round_id >= round_id - scheduling.SCHEDULED_ROUNDS + 1
        and s.hotkey in registered
        and validator not in reporters[s.id]
        and not (
            s.id in mine and (mine[s.id].leased_until > now or mine[s.id].fetch_count >= MAX_FETCHES_PER_VALIDATOR)
        )
    ]
    hotkey_of = {s.id: s.hotkey for s in submissions}
    taken: dict[str, int] = {}
    for lease in mine.values():
        if lease.first_round == round_id:
            taken[hotkey_of[lease.submission_id]] = taken.get(hotkey_of[lease.submission_id], 0) + 1
    order = scheduling.order_work(candidates, taken, service.standing(round_id), limit)
    return [item.submission_id for item in order]


def test_the_work_list_query_hands_out_what_the_rules_read_from_every_row(database, chain, wallets):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    chain.advance(rng.randrange(4 * 360))
    config = api_config(wallets["api"].hotkey.ss58_address)
    service = SubmissionService(config, chain, database, clock=time.time)
    hotkeys = [wallets[name].hotkey.ss58_address for name in ("a", "b", "c", "stranger")]
    validators = [wallets[name].hotkey.ss58_address for name in ("v1", "v2", "v3")]
    random_database(service, rng, hotkeys, validators)
    limit = rng.randint(1, 40)
    expected = reference_work(service, validators[0], limit)
    handed = [item.submission_id for item in service.fetch_work(validators[0], limit).items]
    assert handed == expected, seed


def test_supersession_leaves_exactly_what_the_rule_reads_from_every_row(database, chain, wallets):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    config = api_config(wallets["api"].hotkey.ss58_address)
    service = SubmissionService(config, chain, database, clock=time.time)
    hotkeys = [wallets[name].hotkey.ss58_address for name in ("a", "b")]
    validators = [wallets[name].hotkey.ss58_address for name in ("v1", "v2", "v3")]  # v3: no weight
    random_database(service, rng, hotkeys, validators)
    round_id = rules.round_of_block(service.current_block(), config.round_blocks).round_id
    electorate = service.electorate()

    def ready(session) -> list[scheduling.Queued]:
        rows = session.scalars(
            select(Submission).where(
                Submission.state == "ready", Submission.round_id >= scheduling.first_scheduled_round(round_id)
            )
        ).all()
        counted = {
            r.submission_id
            for r in session.scalars(select(EvaluationReport)).all()
            if electorate.weight(r.validator_hotkey) > 0
        }
        return [
            scheduling.Queued(s.id, s.hotkey, s.ready_at, s.target_sequence_length, 1.0, s.id in counted) for s in rows
        ]

    with database.read() as session:
        before = ready(session)
    expected = {
        item.submission_id: newest
        for hotkey in hotkeys
        for item in before
        if item.hotkey == hotkey
        and not item.reported
        and (newest := max((o for o in before if o.hotkey == hotkey), key=lambda o: o.age_key).submission_id)
        != item.submission_id
    }
    for hotkey in hotkeys:
        database.write(
            lambda session, hotkey=hotkey: supersede_older(session, database.dialect, hotkey, round_id, electorate)
        )
    with database.read() as session:
        after = {s.id: (s.state, s.superseded_by) for s in session.scalars(select(Submission))}
    assert {i: by for i, (state, by) in after.items() if by is not None and i in {q.submission_id for q in before}} == (
        expected
    ), seed
    assert {q.submission_id for q in before} - set(expected) == {
        i for i, (state, _) in after.items() if state == "ready"
    } & {q.submission_id for q in before}, seed
