"""What the API's responses show straight from a stored row, one mapping per kind of row, so that
every route showing a submission to evaluate or a validator's report shows the same fields the
same way (``**`` them into the route's response model, with the fields of that route)."""

from __future__ import annotations

from typing import TypedDict

from quasar.api import rules, schemas
from quasar.api.tables import EvaluationReport, Submission, Verdict


def evaluated_submission(submission: Submission, blocks_until_reveal: int) -> schemas.EvaluatedSubmission:
    """A revealed ``submission`` as a validator evaluates it (``blocks_until_reveal``: the API's, to
    place a commitment for originality); raises ValueError for a commitment not revealed (it has no
    fork, commit or claim yet)."""
    revealed = submission.revealed()
    return schemas.EvaluatedSubmission(
        submission_id=submission.id,
        hotkey=submission.hotkey,
        fork_url=revealed.fork_url,
        commit_hash=revealed.commit_hash,
        target_sequence_length=submission.target_sequence_length,
        claimed_tokens_per_sec=revealed.claimed_tokens_per_sec,
        submitted_at=submission.submitted_at,
        round_id=revealed.round_id,
        counts_from_block=rules.counts_from_block(submission.method, submission.submitted_block, blocks_until_reveal),
    )


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
