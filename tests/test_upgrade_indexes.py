"""Upgrading in place from 190fede: what that version stored is read by this one. Its API database
(revision 0005, before the indexes of 0006-0008) on both backends, its validator state file (schema
3, before the step's indexes) and its dev chain file (hyperparameters without activity_cutoff_factor)
are opened as the processes open them at start, and what they held is still there."""

from __future__ import annotations

import json
import sqlite3
import time

import httpx
from alembic import command
from sqlalchemy import insert, inspect

from api_fixtures import ApiServer, api_config
from quasar.api.db import Database, EvaluationReport, Submission
from quasar.chain.devchain import DevChain
from quasar.chain.subtensor_rules import FINNEY
from quasar.validator.records import EvaluationResult
from quasar.validator.records import Submission as FetchedSubmission
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import PASSED
from test_api_status import old_ready_submission

# What 0006, 0007 and 0008 add: (table, index).
NEW_API_INDEXES = {
    ("submissions", "ix_submissions_hotkey_state_round_id"),
    ("evaluation_reports", "ix_evaluation_reports_validator_id"),
    ("submissions", "ix_submissions_state_submitted_block"),
}
NEW_STATE_INDEXES = ("evaluations_by_status", "submissions_by_logits", "submissions_by_report_state")


def api_indexes(database: Database) -> set[tuple[str, str]]:
    found = inspect(database.engine)
    return {
        (table, index["name"]) for table in ("submissions", "evaluation_reports") for index in found.get_indexes(table)
    }


def test_an_api_database_at_revision_0005_upgrades_with_its_rows_read(database_url, chain, wallets):
    miner, validator = wallets["a"].hotkey.ss58_address, wallets["v1"].hotkey.ss58_address
    old = Database(database_url)
    try:
        command.upgrade(old._alembic(), "0005")
        assert not api_indexes(old) & NEW_API_INDEXES
        with old.engine.begin() as connection:
            connection.execute(
                insert(Submission.__table__).values(id=1, **old_ready_submission(miner, "10.0.0.1", 1.7e9))
            )
            connection.execute(
                insert(EvaluationReport.__table__).values(
                    id=1,
                    submission_id=1,
                    validator_hotkey=validator,
                    reported_at=1.7e9,
                    verdict="passed",
                    correct=True,
                    logits_ok=True,
                    measured_tokens_per_sec=990.0,
                    benchmarks={"1024": 990.0},
                    reasons=["ok"],
                    lengths=[{"seq_len": 1024, "status": "ok", "tokens_per_sec": 990.0, "correct": True}],
                    content_hash="c" * 64,
                )
            )
    finally:
        old.dispose()
    with ApiServer(api_config(wallets["api"].hotkey.ss58_address), chain, database_url) as server:
        assert NEW_API_INDEXES <= api_indexes(server.database)
        reports = httpx.get(f"{server.url}/validators/{validator}/reports").json()["reports"]
        assert [(r["report_id"], r["submission_id"], r["verdict"]) for r in reports] == [(1, 1, "passed")]
        page = httpx.get(f"{server.url}/miners/{miner}/submissions").json()
        assert [(s["submission_id"], s["state"]) for s in page["submissions"]] == [(1, "passed")]
        assert httpx.get(f"{server.url}/submissions/1").json()["reports"][0]["reasons"] == ["ok"]


def fetched(n: int, now: float) -> FetchedSubmission:
    values = (n, f"5Hot{n}", f"https://github.com/m{n}/fla", f"{n:040x}", 1024, 1000.0, now, 7, 10 * n)
    return FetchedSubmission(**dict(zip(FetchedSubmission.model_fields, values, strict=True)))


def test_a_validator_state_file_without_the_steps_indexes_keeps_its_work(tmp_path):
    """190fede's state file: the same schema version 3, without the step's indexes. Opened, it gains
    them, and its pending, interrupted, unchecked and unreported work and its last weights stay."""
    path, now = tmp_path / "state.sqlite3", time.time()
    with ValidatorState.open(path) as state:
        for n in (1, 2, 3, 4):
            state.add_submission(fetched(n, now), now)
        for n in (2, 3, 4):
            state.start_evaluation(fetched(n, now).key, "cuda:0", now)
        for n in (3, 4):
            state.finish_evaluation(fetched(n, now).key, EvaluationResult(True, 1200.0, {1024: 1200.0}), now)
        state.record_logits(4, PASSED, "ok", now)
        state.set_meta("last_weights_block", "500")
    with sqlite3.connect(path) as connection:
        for name in NEW_STATE_INDEXES:
            connection.execute(f"DROP INDEX {name}")
    with ValidatorState.open(path) as state:
        assert [key.fork_url for key in state.pending_evaluations(now + 1e6)] == [
            "https://github.com/m1/fla",
            "https://github.com/m2/fla",
        ]
        assert [record.submission.submission_id for record in state.needing_logit_check()] == [3]
        assert [record.submission.submission_id for record in state.ready_to_report()] == [4]
        assert state.get_meta("last_weights_block") == "500"
        assert [(e.status, e.attempts) for e in state.evaluations()] == [
            ("pending", 0),
            ("pending", 1),
            ("finished", 1),
            ("finished", 1),
        ]
    with sqlite3.connect(path) as connection:
        indexes = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert set(NEW_STATE_INDEXES) <= indexes


def test_a_dev_chain_file_from_before_activity_cutoff_factor_reads_the_chains_default(tmp_path):
    path = tmp_path / "devchain.sqlite3"
    DevChain(path, netuid=24).set_hyperparameters(tempo=20)
    with sqlite3.connect(path) as connection:
        (stored,) = connection.execute("SELECT value FROM meta WHERE key = 'hyperparameters'").fetchone()
        older = {name: value for name, value in json.loads(stored).items() if name != "activity_cutoff_factor"}
        connection.execute("UPDATE meta SET value = ? WHERE key = 'hyperparameters'", (json.dumps(older),))
    chain = DevChain(path)
    hyperparameters = chain.hyperparameters()
    assert (hyperparameters.tempo, hyperparameters.activity_cutoff_factor) == (20, FINNEY.activity_cutoff_factor)
    assert hyperparameters.activity_cutoff == 277  # 13,889 thousandths of 20 blocks
    # The owner's next change writes the field, keeping the rest.
    assert chain.set_hyperparameters(weights_rate_limit=6).activity_cutoff_factor == FINNEY.activity_cutoff_factor
