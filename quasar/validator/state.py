"""The validator's own record of its work: one SQLite file per (network, subnet, hotkey).

It holds the submissions fetched from the API and the evaluations run for them, so a restarted
validator goes on where it stopped:

- an evaluation is keyed by (normalized fork URL, commit, target length): the measurement at the
  target is what ranks a submission, so the same commit at another target is another evaluation,
  while a second submission of the same key (another hotkey copying a fork) reuses the finished
  result; ranking then gives the tie to the earlier submission;
- an evaluation is ``pending``, ``in_progress``, ``finished`` (a result: never run again) or
  ``abandoned`` (this validator failed to evaluate it :data:`MAX_ATTEMPTS` times, each retry
  :data:`EVALUATION_RETRY_DELAYS_S` after the failed attempt began: nothing is reported, nothing
  ranked, the miner is not blamed). An ``in_progress`` row left by a crash is made ``pending``
  again when the file is opened; each start counts as an attempt, so a fork that crashes the
  validator cannot keep it busy forever;
- a submission's logit check and its report to the API are recorded when done;
- a submission is known by its API id and its content: an id the API gives another submission (its
  database replaced or restored) sets the earlier record aside (:meth:`ValidatorState.add_submission`);
- a finished evaluation keeps the content hash of the fork's kernel files (quasar/originality.py),
  and :meth:`ValidatorState.scored` leaves out copies of another hotkey's submission that counts
  earlier (from the block the API sends with each, docs/rules.md section 5), so the weights this
  validator sets never rank a copy, as the API's leaderboard does not.

Every change is one ``BEGIN IMMEDIATE`` transaction (WAL mode), so a kill at any moment leaves a
consistent file. One process at a time: :meth:`ValidatorState.open` takes an exclusive lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from quasar import originality
from quasar.api.schemas import MAX_ID
from quasar.errors import QuasarError
from quasar.lock_files import lock_for_this_process, lock_refusal
from quasar.validator.records import (
    EVALUATION_COLUMNS,
    EVALUATION_COLUMNS_WITHOUT_REPORT,
    SUBMISSION_COLUMNS,
    EvaluationKey,
    EvaluationRecord,
    EvaluationResult,
    Submission,
    SubmissionRecord,
    evaluation_from_row,
    fingerprint,
    result_columns,
    submission_from_row,
)
from quasar.validator.state_files import (
    ABANDONED,
    API_IDENTITY,
    FAILED,
    FINISHED,
    IN_PROGRESS,
    PASSED,
    PENDING,
    REFUSED,
    REPORTED,
    SCHEMA,
    SCHEMA_VERSION,
    SKIPPED,
    UNCHECKED,
    UNREPORTED,
    upgrade_schema,
)

logger = logging.getLogger(__name__)

MAX_ATTEMPTS = 3
# After an attempt failed on this validator's side (the first, the second), the wait from its start to
# the next: a fault of minutes (GitHub down, a full disk) is over by then, not met three times at once.
EVALUATION_RETRY_DELAYS_S = (120.0, 900.0)
# How long a finished evaluation keeps its harness report once every submission of it is reported:
# a copy of the same commit submitted meanwhile still reports the per-length figures.
REPORT_KEPT_S = 14 * 24 * 3600.0
BUSY_TIMEOUT_S = 30.0
SET_ASIDE = (
    "the API's submission %d is %s's %s now, not %s: its database was replaced or restored from a backup; "
    "this validator keeps the earlier one as %d (ranked, never reported if it was not yet)"
)


class StateError(QuasarError, RuntimeError):
    """The state file cannot be used (locked by another process, unreadable, another schema)."""


# Who the state's lock file refuses, and the setting of its folder (quasar/lock_files.py's cures).
_LOCK_FILE_OWNER = ("this validator", "VALIDATOR_DATA_DIR")


class ValidatorState:
    """The state file, opened by one process; use :meth:`open` (or as a context manager)."""

    def __init__(self, path: Path, connection: sqlite3.Connection, lock_fd: int):
        self.path = path
        self._connection = connection
        self._lock_fd = lock_fd

    @classmethod
    def open(cls, path: str | os.PathLike) -> ValidatorState:
        """Open (creating it if missing) the state at ``path``; in-progress evaluations left by a
        crash become pending again. Raises :class:`StateError` if another process holds it."""
        path = Path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StateError(f"cannot create the folder of the validator state {path}: {error}") from None
        lock_fd = cls._lock(path)
        try:
            connection = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA foreign_keys=ON")
            connection.executescript(SCHEMA)
            state = cls(path, connection, lock_fd)
            with state._write() as db:
                upgraded_from, unreadable = upgrade_schema(db)
                if unreadable is not None:
                    raise StateError(
                        f"validator state {path} has schema version {unreadable}, this validator "
                        f"reads version {SCHEMA_VERSION}"
                    )
                if upgraded_from is not None:
                    kept = db.execute("SELECT COUNT(*) FROM submissions").fetchone()[0]
            if upgraded_from is not None:
                # Said once, as the API says its migration: the older validator refuses the file now.
                logger.info(
                    "validator state %s: migrated from schema version %s to %s, its %d submissions kept; "
                    "a validator older than this one refuses the file now",
                    path,
                    upgraded_from,
                    SCHEMA_VERSION,
                    kept,
                )
            state._recover()
            return state
        except sqlite3.Error as error:
            os.close(lock_fd)
            raise StateError(f"cannot open the validator state {path}: {error}") from None
        except BaseException:
            os.close(lock_fd)
            raise

    @staticmethod
    def _lock(path: Path) -> int:
        lock_path = path.with_name(path.name + ".lock")
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:  # another Unix user's folder (VALIDATOR_DATA_DIR's default is in the checkout)
            raise StateError(lock_refusal(error, str(lock_path), *_LOCK_FILE_OWNER, doing="open")) from None
        try:
            holder = lock_for_this_process(fd)  # writes this process's pid into the file
        except OSError as error:  # a file system that cannot lock (NFS), a full disk
            os.close(fd)
            raise StateError(lock_refusal(error, str(lock_path), *_LOCK_FILE_OWNER)) from None
        if holder is not None:
            os.close(fd)
            raise StateError(
                f"another validator process (pid {holder}) is using {path}; stop it first, or give this "
                "one its own VALIDATOR_DATA_DIR (several processes of one hotkey each need their own)"
            )
        return fd

    def close(self) -> None:
        self._connection.close()
        os.close(self._lock_fd)

    def __enter__(self) -> ValidatorState:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction; one opened inside another is part of it (one commit for both)."""
        db = self._connection
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _recover(self) -> None:
        with self._write() as db:
            rows = db.execute(
                "SELECT fork_url, commit_hash, target_sequence_length FROM evaluations WHERE status = ?", (IN_PROGRESS,)
            ).fetchall()
            db.execute("UPDATE evaluations SET status = ? WHERE status = ?", (PENDING, IN_PROGRESS))
        for row in rows:
            logger.warning(
                "evaluation of %s was interrupted (validator stopped or crashed): it runs again", EvaluationKey(*row)
            )

    # --- meta ---

    def get_meta(self, key: str) -> str | None:
        row = self._connection.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as db:
            db.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    # --- submissions and evaluations ---

    def add_submission(self, submission: Submission, now: float) -> bool:
        """Record a fetched submission (and a pending evaluation for its key, unless one exists).
        Returns False when it was already known; a record of its id with other content
        (:data:`API_IDENTITY`) is another submission's, from before the API's database was replaced
        or restored from a backup: it is set aside (:meth:`_set_aside`)."""
        key = submission.key
        with self._write() as db:
            known = db.execute(
                f"SELECT {', '.join(API_IDENTITY)} FROM submissions WHERE submission_id = ?",
                (submission.submission_id,),
            ).fetchone()
            if known == tuple(getattr(submission, name) for name in API_IDENTITY):
                return False
            if known is not None:
                self._set_aside(db, submission, known, now)
            db.execute(
                "INSERT OR IGNORE INTO evaluations (fork_url, commit_hash, target_sequence_length, status, "
                "created_at) VALUES (?, ?, ?, ?, ?)",
                (key.fork_url, key.commit_hash, key.target_sequence_length, PENDING, now),
            )
            db.execute(
                f"INSERT INTO submissions ({', '.join(Submission.model_fields)}, fetched_at) "
                f"VALUES ({', '.join('?' * len(Submission.model_fields))}, ?)",
                (*submission.model_dump().values(), now),
            )
        return True

    @staticmethod
    def _set_aside(db: sqlite3.Connection, submission: Submission, known: tuple, now: float) -> None:
        """Give the record of ``submission``'s id, another submission's, an id above any the API hands
        out (:data:`SET_ASIDE`)."""
        (top,) = db.execute("SELECT MAX(submission_id) FROM submissions").fetchone()
        own_id, api_id = max(top, MAX_ID) + 1, submission.submission_id
        db.execute(
            "UPDATE submissions SET report_state = ?, report_detail = ?, reported_at = ? "
            "WHERE submission_id = ? AND report_state = ?",
            (REFUSED, f"not reported: the API's submission {api_id} is another one now", now, api_id, UNREPORTED),
        )
        db.execute("UPDATE submissions SET submission_id = ? WHERE submission_id = ?", (own_id, api_id))
        earlier = f"{known[0]}'s {EvaluationKey(*known[1:4])}"
        logger.warning(SET_ASIDE, api_id, submission.hotkey, submission.key, earlier, own_id)

    def report_again(self, submission_id: int) -> bool:
        """The API handed out again ``submission_id``, which this validator reported: it holds no
        report of it (restored from a backup older than the report), so it is reported again."""
        with self._write() as db:
            reopened = db.execute(
                "UPDATE submissions SET report_state = ?, report_detail = NULL, reported_at = NULL "
                "WHERE submission_id = ? AND report_state = ?",
                (UNREPORTED, submission_id, REPORTED),
            ).rowcount
        return bool(reopened)

    def add_refused_submission(self, submission: Submission, reason: str, now: float) -> bool:
        """Record a submission that cannot be evaluated at all (its URL or commit breaks the rules):
        its evaluation is finished at once, failed with ``reason`` (one transaction)."""
        with self._write():
            if not self.add_submission(submission, now):
                return False
            if self.evaluation(submission.key).status == PENDING:
                self.start_evaluation(submission.key, "none", now)
                result = EvaluationResult(correct=False, measured_tokens_per_sec=None, reasons=(reason,))
                self.finish_evaluation(submission.key, result, now)
        return True

    def import_result(
        self, submission: Submission, result: EvaluationResult, logits: str, detail: str, now: float
    ) -> bool:
        """Record a submission that another process of this validator's hotkey evaluated and
        reported (its ``result`` and ``logits`` outcome): it ranks as this process's own results do.
        False when the submission is known here already (this process fetched it)."""
        if logits not in (PASSED, FAILED, SKIPPED):
            raise ValueError(f"logit outcome must be passed, failed or skipped, got {logits!r}")
        with self._write():  # one transaction: a kill leaves it imported whole or not at all
            if not self.add_submission(submission, now):
                return False
            if self.evaluation(submission.key).status == PENDING:
                self.start_evaluation(submission.key, "another process", now)
                self.finish_evaluation(submission.key, result, now)
            self.record_logits(submission.submission_id, logits, "checked by another process of this hotkey", now)
            self.record_report(submission.submission_id, REPORTED, detail, now)
        return True

    def pending_evaluations(self, now: float | None = None) -> list[EvaluationKey]:
        """Evaluations to run, in the order of their earliest submission; with ``now``, one whose last
        attempt failed on this validator's side EVALUATION_RETRY_DELAYS_S after it began (or after now)."""
        rows = self._connection.execute(
            "SELECT e.fork_url, e.commit_hash, e.target_sequence_length FROM evaluations e "
            "JOIN submissions s USING (fork_url, commit_hash, target_sequence_length) WHERE e.status = ? "
            "AND (? IS NULL OR e.last_error IS NULL OR e.started_at IS NULL OR e.started_at > ? "  # clock stepped back
            "OR e.started_at + (CASE WHEN e.attempts >= 2 THEN ? ELSE ? END) <= ?) "
            "GROUP BY e.fork_url, e.commit_hash, e.target_sequence_length ORDER BY MIN(s.submission_id)",
            (PENDING, now, now, EVALUATION_RETRY_DELAYS_S[1], EVALUATION_RETRY_DELAYS_S[0], now),
        ).fetchall()
        return [EvaluationKey(*row) for row in rows]

    def start_evaluation(self, key: EvaluationKey, device: str, now: float) -> int:
        """Mark ``key`` in progress on ``device``; returns its attempt number (1 for the first)."""
        with self._write() as db:
            updated = db.execute(
                "UPDATE evaluations SET status = ?, attempts = attempts + 1, device = ?, started_at = ? "
                "WHERE fork_url = ? AND commit_hash = ? AND target_sequence_length = ? AND status = ?",
                (IN_PROGRESS, device, now, *_key(key), PENDING),
            ).rowcount
            if not updated:
                raise StateError(f"evaluation of {key} is not pending")
            (attempts,) = db.execute(
                "SELECT attempts FROM evaluations WHERE fork_url = ? AND commit_hash = ? "
                "AND target_sequence_length = ?",
                _key(key),
            ).fetchone()
        return int(attempts)

    def finish_evaluation(self, key: EvaluationKey, result: EvaluationResult, now: float) -> None:
        """Store the result of the in-progress evaluation ``key``; it never runs again."""
        with self._write() as db:
            updated = db.execute(
                "UPDATE evaluations SET status = ?, correct = ?, measured_tokens_per_sec = ?, benchmarks = ?, "
                "reasons = ?, notes = ?, report = ?, content_hash = ?, last_error = NULL, finished_at = ? "
                "WHERE fork_url = ? AND commit_hash = ? AND target_sequence_length = ? AND status = ?",
                (FINISHED, *result_columns(result), now, *_key(key), IN_PROGRESS),
            ).rowcount
            if not updated:
                raise StateError(f"evaluation of {key} is not in progress")

    def fail_attempt(self, key: EvaluationKey, error: str, now: float, max_attempts: int = MAX_ATTEMPTS) -> str:
        """The in-progress evaluation ``key`` failed on this validator's side (not the fork's):
        pending again, or abandoned after ``max_attempts``. Returns the new status."""
        with self._write() as db:
            row = db.execute(
                "SELECT attempts FROM evaluations WHERE fork_url = ? AND commit_hash = ? AND "
                "target_sequence_length = ? AND status = ?",
                (*_key(key), IN_PROGRESS),
            ).fetchone()
            if row is None:
                raise StateError(f"evaluation of {key} is not in progress")
            status = ABANDONED if row[0] >= max_attempts else PENDING
            db.execute(
                "UPDATE evaluations SET status = ?, last_error = ?, finished_at = ? WHERE fork_url = ? AND "
                "commit_hash = ? AND target_sequence_length = ?",
                (status, error, now if status == ABANDONED else None, *_key(key)),
            )
        return status

    def cancel_evaluation(self, key: EvaluationKey) -> None:
        """The validator stopped the in-progress evaluation ``key`` itself: pending again, and the
        attempt is not counted."""
        with self._write() as db:
            db.execute(
                "UPDATE evaluations SET status = ?, attempts = MAX(attempts - 1, 0) WHERE fork_url = ? AND "
                "commit_hash = ? AND target_sequence_length = ? AND status = ?",
                (PENDING, *_key(key), IN_PROGRESS),
            )

    def evaluation(self, key: EvaluationKey) -> EvaluationRecord:
        row = self._connection.execute(
            f"SELECT {EVALUATION_COLUMNS} FROM evaluations e WHERE fork_url = ? AND commit_hash = ? "
            "AND target_sequence_length = ?",
            _key(key),
        ).fetchone()
        if row is None:
            raise StateError(f"no evaluation of {key}")
        return evaluation_from_row(row)

    def evaluations(self) -> list[EvaluationRecord]:
        rows = self._connection.execute(f"SELECT {EVALUATION_COLUMNS} FROM evaluations e ORDER BY created_at")
        return [evaluation_from_row(row) for row in rows]

    def record_logits(self, submission_id: int, outcome: str, reason: str, now: float) -> None:
        if outcome not in (PASSED, FAILED, SKIPPED):
            raise ValueError(f"logit outcome must be passed, failed or skipped, got {outcome!r}")
        with self._write() as db:
            db.execute(
                "UPDATE submissions SET logits = ?, logits_reason = ?, logits_checked_at = ? WHERE submission_id = ?",
                (outcome, reason, now, submission_id),
            )

    def record_report(self, submission_id: int, report_state: str, detail: str, now: float) -> None:
        if report_state not in (REPORTED, REFUSED):
            raise ValueError(f"report state must be reported or refused, got {report_state!r}")
        with self._write() as db:
            db.execute(
                "UPDATE submissions SET report_state = ?, report_detail = ?, reported_at = ? WHERE submission_id = ?",
                (report_state, detail, now, submission_id),
            )

    def forget_reports(self, finished_before: float) -> int:
        """Drop the harness reports (most of the file) of evaluations finished before
        ``finished_before`` whose submissions are all reported or refused; verdicts, figures,
        reasons and content hashes stay, all that ranking and originality read. Returns how many."""
        with self._write() as db:
            return db.execute(
                "UPDATE evaluations SET report = NULL WHERE report IS NOT NULL AND status = ? AND finished_at < ? "
                "AND NOT EXISTS (SELECT 1 FROM submissions s WHERE s.fork_url = evaluations.fork_url "
                "AND s.commit_hash = evaluations.commit_hash "
                "AND s.target_sequence_length = evaluations.target_sequence_length AND s.report_state = ?)",
                (FINISHED, finished_before, UNREPORTED),
            ).rowcount

    def submissions(self, where: str = "", parameters: tuple = (), reports: bool = True) -> list[SubmissionRecord]:
        """Submissions with their evaluations, by id; ``where`` is an SQL condition on s./e. columns.
        ``reports`` False: each result without the harness's report (None), much the largest part."""
        columns = EVALUATION_COLUMNS if reports else EVALUATION_COLUMNS_WITHOUT_REPORT
        rows = self._connection.execute(
            f"SELECT {SUBMISSION_COLUMNS}, s.logits, s.logits_reason, s.report_state, "
            f"s.report_detail, {columns} FROM submissions s JOIN evaluations e "
            f"USING (fork_url, commit_hash, target_sequence_length) "
            f"{'WHERE ' + where if where else ''} ORDER BY s.submission_id",
            parameters,
        ).fetchall()
        return [submission_from_row(row) for row in rows]

    def needing_logit_check(self) -> list[SubmissionRecord]:
        """Submissions whose evaluation finished and whose logits are not checked yet."""
        return self.submissions("e.status = ? AND s.logits = ?", (FINISHED, UNCHECKED))

    def ready_to_report(self) -> list[SubmissionRecord]:
        """Submissions evaluated and logit-checked, not reported to the API yet."""
        return self.submissions(
            "e.status = ? AND s.logits != ? AND s.report_state = ?", (FINISHED, UNCHECKED, UNREPORTED)
        )

    def scored(self) -> list[SubmissionRecord]:
        """Submissions with a complete result (evaluated, logits decided) that are not a copy of
        another hotkey's earlier submission (quasar/originality.py): what ranking uses. Read once
        an epoch over every finished submission, so without the harness's reports."""
        known = self.submissions("e.status = ?", (FINISHED,), reports=False)
        copies = originality.find_copies(fingerprint(record) for record in known)
        return [
            record for record in known if record.logits != UNCHECKED and record.submission.submission_id not in copies
        ]

    def open_submissions(self) -> int:
        """Submissions still waiting for an evaluation, a logit check or a report."""
        (count,) = self._connection.execute(
            "SELECT COUNT(*) FROM submissions s JOIN evaluations e USING (fork_url, commit_hash, "
            "target_sequence_length) WHERE e.status != ? AND s.report_state = ?",
            (ABANDONED, UNREPORTED),
        ).fetchone()
        return int(count)


def _key(key: EvaluationKey) -> tuple[str, str, int]:
    return key.fork_url, key.commit_hash, key.target_sequence_length
