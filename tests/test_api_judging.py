"""The standings' copy check (quasar/api/judging.py), which reads only the submissions sharing a
commit or a content hash with the round's, against a slow reference that reads every revealed
submission, takes each one's consensus and runs quasar/originality.py over all of them, on random
databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import random
import time

from sqlalchemy import insert, select

from api_fixtures import api_config, commit_of
from quasar import consensus, originality
from quasar.api import rules
from quasar.api.db import EvaluationReport, Submission
from quasar.api.service import SubmissionService, consensus_reports, evaluated_submissions


def test_the_copies_found_from_the_rows_sharing_a_commit_or_content_match_a_check_of_every_row(
    database, chain, wallets
):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    config = api_config(wallets["api"].hotkey.ss58_address)
    service = SubmissionService(config, chain, database, clock=time.time)
    hotkeys = [wallets[name].hotkey.ss58_address for name in ("a", "b", "c")]
    validators = [wallets[name].hotkey.ss58_address for name in ("v1", "v2")]
    contents = [None, "1" * 64, "2" * 64, "3" * 64]

    def fill(session) -> None:
        connection = session.connection()
        for n in range(rng.randint(4, 40)):
            state = rng.choice(["ready", "ready", "ready", "superseded", "committed"])
            committed = state == "committed"
            result = connection.execute(
                insert(Submission.__table__),
                {
                    "hotkey": rng.choice(hotkeys),
                    "method": rng.choice(["direct", "commit_reveal"]),
                    "state": state,
                    "commitment_hash": "c" * 64,
                    "target_sequence_length": 1_000_000,
                    "submitted_at": float(n),
                    "submitted_block": rng.randrange(30),  # ties and commitments counting later
                    "ready_at": None if committed else float(n),
                    "ready_block": None if committed else 1,
                    "round_id": None if committed else rng.randrange(3),
                    "fork_url": None if committed else "https://github.com/a/fla",
                    "commit_hash": None if committed else commit_of(rng.randrange(4)),
                    "claimed_tokens_per_sec": None if committed else 10.0,
                    "client_ip": "10.0.0.1",
                },
            )
            if state != "ready":
                continue
            for validator in validators:
                if rng.random() < 0.6:
                    connection.execute(
                        insert(EvaluationReport.__table__),
                        {
                            "submission_id": result.inserted_primary_key[0],
                            "validator_hotkey": validator,
                            "reported_at": 1.0,
                            "verdict": rng.choice(["passed", "passed", "failed"]),
                            "correct": True,
                            "logits_ok": True,
                            "measured_tokens_per_sec": 10.0,
                            "reasons": [],
                            "content_hash": rng.choice(contents),
                        },
                    )

    database.write(fill)
    electorate = service.electorate()
    with database.read() as session:
        submissions = session.scalars(select(Submission).where(Submission.state != "committed")).all()
        reports = session.scalars(select(EvaluationReport)).all()
        views = {
            s.id: consensus.decide(
                consensus_reports([r for r in reports if r.submission_id == s.id]), electorate, service.quorum
            )
            for s in submissions
        }
        every = originality.find_copies(
            originality.Fingerprint(
                s.id,
                s.hotkey,
                s.commit_hash,
                views[s.id].content_hash,
                rules.counts_from_block(s.method, s.submitted_block, config.blocks_until_reveal),
            )
            for s in submissions
        )
        reported = {r.submission_id for r in reports}
    for round_id in range(3):
        judged, _ = service.judged_round(round_id)
        evaluated = {s.id for s in submissions if s.round_id == round_id and s.state == "ready" and s.id in reported}
        assert {item.submission.submission_id for item in judged} == evaluated, seed
        found = {item.submission.submission_id: item.copy_of for item in judged if item.copy_of is not None}
        assert found == {i: copy for i, copy in every.items() if i in evaluated}, (seed, round_id)
        # The one joined query's rows grouped into each submission's reports, and their consensus.
        for item in judged:
            mine = consensus_reports([r for r in reports if r.submission_id == item.submission.submission_id])
            assert sorted(item.reports, key=repr) == sorted(mine, key=repr), seed
            assert item.consensus == views[item.submission.submission_id], seed
    # A miner's history and status pages judge other subsets of the submissions (one hotkey's, a page
    # of them): each one's copy verdict must not depend on which others were judged beside it.
    ids = [s.id for s in submissions]
    subsets = [Submission.hotkey == hotkey for hotkey in hotkeys]
    subsets += [Submission.id.in_(rng.sample(ids, rng.randint(0, len(ids)))) for _ in range(3)]
    for condition in subsets:
        with database.read() as session:
            part = evaluated_submissions(session, condition)
            judged_part = service.judge(session, part, electorate)
        found = {item.submission.submission_id: item.copy_of for item in judged_part if item.copy_of is not None}
        evaluated = {item.submission.submission_id for item in judged_part}
        assert evaluated <= {s.id for s in submissions if s.state == "ready" and s.id in reported}, seed
        assert found == {i: copy for i, copy in every.items() if i in evaluated}, (seed, str(condition))
