"""The records of a validator's state (quasar/validator/state.py): what an evaluation measures
(:class:`EvaluationKey`), a submission as fetched from the API, an evaluation's result, and how
each is written to and read back from the state file's rows (quasar/validator/state_files.py holds
the tables)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ConfigDict

from quasar import originality
from quasar.api.schemas import EvaluatedSubmission
from quasar.validator.state_files import FAILED, FINISHED, PASSED


@dataclass(frozen=True, order=True)
class EvaluationKey:
    """What one evaluation measures: a fork at a commit, at a target length."""

    fork_url: str
    commit_hash: str
    target_sequence_length: int

    def __str__(self) -> str:
        return f"{self.fork_url}@{self.commit_hash[:12]} T={self.target_sequence_length}"


class Submission(EvaluatedSubmission):
    """A submission as fetched from the API: the API's fields (fork URL normalized, commit
    lowercase), frozen; the ``submissions`` table stores them under the same names."""

    model_config = ConfigDict(frozen=True)

    @property
    def key(self) -> EvaluationKey:
        return EvaluationKey(self.fork_url, self.commit_hash, self.target_sequence_length)


@dataclass(frozen=True)
class EvaluationResult:
    """A finished evaluation: ``correct`` is everything but the claim and the logits (imports,
    every length run and matching the reference, the target measured)."""

    correct: bool
    measured_tokens_per_sec: float | None
    benchmarks: dict[int, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    report: dict[str, Any] | None = None  # the harness's EvaluationReport.to_dict(), when it ran
    content_hash: str | None = None  # of the fork's kernel files (quasar/originality.py), when cloned


@dataclass(frozen=True)
class EvaluationRecord:
    key: EvaluationKey
    status: str
    attempts: int
    device: str | None
    last_error: str | None
    result: EvaluationResult | None  # set when finished
    started_at: float | None
    finished_at: float | None


@dataclass(frozen=True)
class SubmissionRecord:
    """A submission with where it stands: its evaluation, logit check and report."""

    submission: Submission
    evaluation: EvaluationRecord
    logits: str
    logits_reason: str | None
    report_state: str
    report_detail: str | None

    @property
    def logits_ok(self) -> bool | None:
        """The logit check as the API and scoring take it: None when not checked."""
        return {PASSED: True, FAILED: False}.get(self.logits)


def fingerprint(record: SubmissionRecord) -> originality.Fingerprint:
    """A submission with a finished evaluation as originality compares it."""
    result = record.evaluation.result
    assert result is not None, f"submission {record.submission.submission_id} is finished without a result"
    submission = record.submission
    return originality.Fingerprint(
        submission.submission_id,
        submission.hotkey,
        submission.commit_hash,
        result.content_hash,
        submission.counts_from_block,
    )


SUBMISSION_COLUMNS = ", ".join(f"s.{name}" for name in Submission.model_fields)
_EVALUATION_FIELDS = (
    "fork_url, commit_hash, target_sequence_length, status, attempts, device, last_error, correct, "
    "measured_tokens_per_sec, benchmarks, reasons, notes, report, content_hash, started_at, finished_at"
).split(", ")
EVALUATION_COLUMNS = ", ".join(f"e.{name}" for name in _EVALUATION_FIELDS)
EVALUATION_COLUMNS_WITHOUT_REPORT = ", ".join(
    "NULL" if name == "report" else f"e.{name}" for name in _EVALUATION_FIELDS
)


def result_columns(result: EvaluationResult) -> tuple:
    """``result`` as the evaluations table stores it: correct, measured_tokens_per_sec, benchmarks,
    reasons, notes, report, content_hash."""
    return (
        int(result.correct),
        result.measured_tokens_per_sec,
        json.dumps({str(k): v for k, v in sorted(result.benchmarks.items())}),
        json.dumps(list(result.reasons)),
        json.dumps(list(result.notes)),
        None if result.report is None else json.dumps(result.report, allow_nan=False),
        result.content_hash,
    )


def submission_from_row(row: tuple) -> SubmissionRecord:
    """A row of SUBMISSION_COLUMNS, the submission's logits, logits_reason, report_state and
    report_detail, then EVALUATION_COLUMNS (or EVALUATION_COLUMNS_WITHOUT_REPORT), as its record."""
    width = len(Submission.model_fields)
    return SubmissionRecord(
        Submission(**dict(zip(Submission.model_fields, row[:width]))),
        evaluation_from_row(row[width + 4 :]),
        *row[width : width + 4],
    )


def evaluation_from_row(row: tuple) -> EvaluationRecord:
    """A row of EVALUATION_COLUMNS (or EVALUATION_COLUMNS_WITHOUT_REPORT) as its record."""
    (
        url,
        commit,
        target,
        status,
        attempts,
        device,
        last_error,
        correct,
        measured,
        benchmarks,
        reasons,
        notes,
        report,
        content_hash,
        started_at,
        finished_at,
    ) = row
    result = None
    if status == FINISHED:
        stored: Mapping[str, float] = json.loads(benchmarks or "{}")
        result = EvaluationResult(
            correct=bool(correct),
            measured_tokens_per_sec=measured,
            benchmarks={int(length): float(tps) for length, tps in stored.items()},
            reasons=tuple(json.loads(reasons or "[]")),
            notes=tuple(json.loads(notes or "[]")),
            report=None if report is None else json.loads(report),
            content_hash=content_hash,
        )
    return EvaluationRecord(
        EvaluationKey(url, commit, int(target)),
        status,
        int(attempts),
        device,
        last_error,
        result,
        started_at,
        finished_at,
    )
