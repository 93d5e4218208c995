"""A validator's state file: where it lives, its tables, their upgrade from an earlier version and
the states their rows go through, and reading it from another process while the validator runs
(quasar/validator/state.py keeps the state, quasar/validator/records.py reads its rows)."""

from __future__ import annotations

import contextlib
import os
import sqlite3
from pathlib import Path

SCHEMA_VERSION = 3

PENDING, IN_PROGRESS, FINISHED, ABANDONED = "pending", "in_progress", "finished", "abandoned"
# A submission's logit check: not done yet, passed, failed, or skipped (its evaluation failed).
UNCHECKED, PASSED, FAILED, SKIPPED = "unchecked", "passed", "failed", "skipped"
# A submission's report to the API: not sent yet, accepted, or refused for good (404/409/422).
UNREPORTED, REPORTED, REFUSED = "unreported", "reported", "refused"
# The meta key of the API's id of the last report of this hotkey that a primary has looked at.
IMPORTED_AFTER = "imported_reports_after"
# The meta key of which report that was: "REPORT_ID SUBMISSION_ID REPORTED_AT" (quasar/validator/report_cursor.py;
# a file of a validator before this key has IMPORTED_AFTER alone, whose report is known by its id).
IMPORTED_LAST = "imported_report"
# What makes a submission the one a validator fetched under its id. The API's id alone names a
# submission only within one database, which may be replaced (its ids start at 1 again) or restored
# from a backup (its ids go back, and are given to other submissions).
API_IDENTITY = ("hotkey", "fork_url", "commit_hash", "target_sequence_length", "submitted_at")

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS evaluations (
    fork_url TEXT NOT NULL,
    commit_hash TEXT NOT NULL,
    target_sequence_length INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('{PENDING}', '{IN_PROGRESS}', '{FINISHED}', '{ABANDONED}')),
    attempts INTEGER NOT NULL DEFAULT 0,
    device TEXT,
    last_error TEXT,
    correct INTEGER,
    measured_tokens_per_sec REAL,
    benchmarks TEXT,
    reasons TEXT,
    notes TEXT,
    report TEXT,
    content_hash TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    PRIMARY KEY (fork_url, commit_hash, target_sequence_length)
);
CREATE TABLE IF NOT EXISTS submissions (
    submission_id INTEGER PRIMARY KEY,
    hotkey TEXT NOT NULL,
    fork_url TEXT NOT NULL,
    commit_hash TEXT NOT NULL,
    target_sequence_length INTEGER NOT NULL,
    claimed_tokens_per_sec REAL NOT NULL,
    submitted_at REAL NOT NULL,
    round_id INTEGER NOT NULL,
    counts_from_block INTEGER NOT NULL,
    fetched_at REAL NOT NULL,
    logits TEXT NOT NULL DEFAULT '{UNCHECKED}'
        CHECK (logits IN ('{UNCHECKED}', '{PASSED}', '{FAILED}', '{SKIPPED}')),
    logits_reason TEXT,
    logits_checked_at REAL,
    report_state TEXT NOT NULL DEFAULT '{UNREPORTED}'
        CHECK (report_state IN ('{UNREPORTED}', '{REPORTED}', '{REFUSED}')),
    report_detail TEXT,
    reported_at REAL,
    FOREIGN KEY (fork_url, commit_hash, target_sequence_length)
        REFERENCES evaluations (fork_url, commit_hash, target_sequence_length)
);
CREATE INDEX IF NOT EXISTS submissions_by_evaluation
    ON submissions (fork_url, commit_hash, target_sequence_length);
-- What each step looks for among every evaluation and submission ever fetched: the evaluations to
-- run, the logit checks and the reports not done yet (docs/validator.md, on its state).
CREATE INDEX IF NOT EXISTS evaluations_by_status ON evaluations (status);
CREATE INDEX IF NOT EXISTS submissions_by_logits ON submissions (logits);
CREATE INDEX IF NOT EXISTS submissions_by_report_state ON submissions (report_state);
"""


def default_state_path(data_dir: str | os.PathLike, network: str, netuid: int, hotkey: str) -> Path:
    """The state file of ``hotkey`` validating subnet ``netuid`` on ``network``, under ``data_dir``."""
    return Path(os.path.expanduser(data_dir)) / f"state-{network}-{netuid}-{hotkey}.sqlite3"


def upgrade_schema(db: sqlite3.Connection) -> tuple[str | None, str | None]:
    """Bring a state file whose tables SCHEMA created (or found) to SCHEMA_VERSION, within ``db``'s
    transaction. Returns (the version it brought up, the version of a file this validator cannot
    read: a later one, or no number); each None when there is none."""
    row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        db.execute("INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        return None, None
    version = str(row[0])  # compared as text: a file edited by hand may hold no number
    if version in ("1", "2"):
        if version == "1":  # version 2 added the kernel content hash; older results have none
            db.execute("ALTER TABLE evaluations ADD COLUMN content_hash TEXT")
        # Version 3 added the block a submission counts from for originality, which the
        # API did not send before: those fetched before count from block 0, so they keep
        # the order they had among themselves (by id) and come before any fetched since.
        db.execute("ALTER TABLE submissions ADD COLUMN counts_from_block INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))
        return version, None
    if version != str(SCHEMA_VERSION):
        return None, version
    return None, None


def read_meta(path: str | os.PathLike, key: str) -> str | None:
    """The ``meta`` value ``key`` of the state file at ``path``, read by another process while the
    validator runs: read-only and without the validator's lock (WAL: the validator is never
    blocked). None when the file, its schema or the key is not there yet."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5)) as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    except sqlite3.Error:  # being created
        return None
    return None if row is None else row[0]
