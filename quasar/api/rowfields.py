"""What the API's responses show straight from a stored row, one mapping per kind of row, so that
every route showing a submission to evaluate or a validator's report shows the same fields the
same way (``**`` them into the route's response model, with the fields of that route)."""

from __future__ import annotations

from typing import TypedDict

from quasar.api import schemas
from quasar.api.tables import EvaluationReport, Submission, Verdict


def evaluated_submission(submission: Submission) -> schemas.EvaluatedSubmission:
    """A revealed ``submission`` as a validator evaluates it; raises ValueError for a commitment
    not revealed (it has no fork, commit or claim yet)."""
    submission.revealed()
    return schemas.EvaluatedSubmission.model_validate(submission, from_attributes=True)


class FindingFields(TypedDict):
    """What a validator's report found, as every response showing a report gives it."""

    verdict: Verdict
    correct: bool
    logits_ok: bool | None
    measured_tokens_per_sec: float | None
    reasons: list[str]
    content_hash: str | None
    reported_at: float


def finding_fields(report: EvaluationReport) -> FindingFields:
    """The findings of a stored ``report`` (its per-length figures are shown by each route its own way)."""
    return FindingFields(
        verdict=report.verdict,
        correct=report.correct,
        logits_ok=report.logits_ok,
        measured_tokens_per_sec=report.measured_tokens_per_sec,
        reasons=list(report.reasons),
        content_hash=report.content_hash,
        reported_at=report.reported_at,
    )
