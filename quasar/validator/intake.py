"""What a validator takes in from the submission API (quasar/validator/loop.py, phases 5 and 7):
the work items it fetches, checked against the API's own limits and this validator's fork rules
before they are recorded in its state, and, for a primary, the results its hotkey's other
processes reported (quasar/validator/report_cursor.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, Field, StringConstraints, ValidationError

from quasar.api.client import ApiClient
from quasar.api.schemas import (
    MAX_ID,
    MAX_REASONS,
    CommitHash,
    ForkUrl,
    Hotkey,
    MeasuredBenchmarks,
    MeasuredTokensPerSec,
    Reason,
    ReportedWork,
    SequenceLength,
    Sha256Hex,
    SubmissionId,
    TokensPerSec,
    WorkItem,
)
from quasar.forks import ForkError, normalize_fork_url, validate_commit_hash
from quasar.validator.records import EvaluationResult, Submission
from quasar.validator.report_cursor import ReportCursor
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import FAILED, PASSED, SKIPPED
from quasar.validator.steps import StepSummary, one_item

logger = logging.getLogger(__name__)

IMPORT_BATCH = 100

_PRINTABLE = r"^[!-~]+$"  # printable ASCII, no space: every form of a URL or commit the API takes
_Count = Annotated[int, Field(ge=0, le=MAX_ID)]


class _Bounded(BaseModel):
    """A work item's fields within the limits the API's own requests hold (quasar/api/schemas.py):
    an honest API hands out nothing beyond them. Beyond them (a claim of inf, a target of 0, an id
    SQLite cannot store, a hotkey of megabytes) an item can be neither ranked nor reported, and
    would fail the report phase every step or grow the state file by whatever the API sends."""

    submission_id: SubmissionId
    hotkey: Hotkey
    fork_url: Annotated[ForkUrl, StringConstraints(pattern=_PRINTABLE)]
    commit_hash: Annotated[CommitHash, StringConstraints(pattern=_PRINTABLE)]
    target_sequence_length: SequenceLength
    claimed_tokens_per_sec: TokensPerSec
    submitted_at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    round_id: _Count
    counts_from_block: _Count


class _BoundedReport(_Bounded):
    """A report's figures within the limits the API takes them in (``schemas.ReportRequest``): a
    primary imports them as results of its own, which are ranked at every weights phase and whose
    hotkeys are logged; its id one the API can be asked for the reports after."""

    report_id: Annotated[int, Field(ge=1, le=MAX_ID)]
    measured_tokens_per_sec: MeasuredTokensPerSec | None
    benchmarks: MeasuredBenchmarks | None
    reasons: Annotated[list[Reason], Field(max_length=MAX_REASONS)]
    content_hash: Sha256Hex | None


def bounds_problem(item: WorkItem | ReportedWork) -> str | None:
    """Why the work item or report ``item`` breaks the API's own limits (its first wrong field, in
    a few words), or None."""
    model = _BoundedReport if isinstance(item, ReportedWork) else _Bounded
    try:
        model.model_validate(item.model_dump(include=set(model.model_fields)))
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"
    return None


def submission_from_work(item: WorkItem | ReportedWork, allow_local: bool) -> tuple[Submission, str | None]:
    """The submission of a work item (or of a report), with its URL normalized and commit checked by
    this validator's own rules; the second value says why it breaks them (None when it does not)."""
    try:
        url, commit = normalize_fork_url(item.fork_url, allow_local), validate_commit_hash(item.commit_hash)
        problem = None
    except ForkError as error:
        url, commit, problem = item.fork_url, item.commit_hash, str(error)
    fetched = item.model_dump(include=set(Submission.model_fields))
    return Submission(**{**fetched, "fork_url": url, "commit_hash": commit}), problem


def record_work(
    state: ValidatorState, item: WorkItem, allow_local: bool, clock: Callable[[], float], summary: StepSummary
) -> None:
    """Record the work item ``item`` in ``state``: not at all beyond the API's own limits
    (:func:`bounds_problem`), failed at once when it breaks the fork rules, and made to be reported
    again when the API hands out again a submission this validator reported."""
    beyond = bounds_problem(item)
    if beyond is not None:
        logger.warning("the API sent a work item beyond its own limits (%s); not recorded", beyond)
        return
    submission, problem = submission_from_work(item, allow_local)
    if problem is None:
        added = state.add_submission(submission, clock())
    else:
        logger.warning("submission %d from %s breaks the fork rules: %s", item.submission_id, item.hotkey, problem)
        added = state.add_refused_submission(submission, problem, clock())
    if added:
        summary.fetched += 1
        logger.debug(
            "fetched submission %d from %s: %s (claims %.0f tokens/s)",
            submission.submission_id,
            submission.hotkey,
            submission.key,
            submission.claimed_tokens_per_sec,
        )
    elif state.report_again(submission.submission_id):
        logger.warning(
            "the API handed out submission %d again, which this validator reported: it holds no report of it "
            "(its database was restored from a backup); reporting it again",
            submission.submission_id,
        )


def import_results(
    api: ApiClient,
    state: ValidatorState,
    hotkey: str,
    allow_local: bool,
    clock: Callable[[], float],
    summary: StepSummary,
) -> None:
    """Add to ``state`` what ``hotkey``'s other processes reported to ``api`` since the last look."""
    cursor = ReportCursor(state)
    batch = api.validator_reports(hotkey, cursor.asked_after, IMPORT_BATCH)
    for item in cursor.unread(batch.reports):
        beyond = bounds_problem(item)
        if beyond is not None:
            logger.warning("the API sent report %d beyond its own limits (%s); not imported", item.report_id, beyond)
            cursor.read(item)
            continue
        with one_item(f"importing report {item.report_id}"):
            submission, _ = submission_from_work(item, allow_local)
            result = EvaluationResult(
                correct=item.correct,
                measured_tokens_per_sec=item.measured_tokens_per_sec,
                benchmarks=item.benchmarks or {},
                reasons=tuple(item.reasons),
                content_hash=item.content_hash,
            )
            logits = {True: PASSED, False: FAILED, None: SKIPPED}[item.logits_ok]
            if state.import_result(submission, result, logits, f"report {item.report_id}", clock()):
                summary.imported += 1
        cursor.read(item)
    cursor.save()
    if summary.imported:
        logger.info("added %d result(s) reported by this hotkey's other processes", summary.imported)
