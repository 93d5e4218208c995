"""A validator's verdicts sent to the submission API (quasar/validator/loop.py, phase 4): each
submission evaluated and logit-checked is reported once, within a time budget a step; an answer
that refuses it for good (:data:`FINAL_REPORT_STATUSES`) is recorded and never sent again, any
other failure waits for a later step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from quasar.api.client import ApiClient, ApiClientError
from quasar.log import Repeats
from quasar.validator.records import SubmissionRecord
from quasar.validator.results import api_report
from quasar.validator.state import REPORT_KEPT_S, ValidatorState
from quasar.validator.state_files import REFUSED, REPORTED
from quasar.validator.steps import StepSummary, one_item

logger = logging.getLogger(__name__)

# Seconds one step may spend reporting; the rest wait for the next step. An API answering each
# report slowly (each within the client's timeout) otherwise held the loop, its collecting and
# weights included, for as long as the backlog of reports times the answer's delay.
REPORT_BUDGET_S = 60.0
# API answers after which a report is never sent again: unknown submission, already reported or
# conflicting, invalid. Anything else (unreachable, 5xx, 401/403, 429) is retried next step.
FINAL_REPORT_STATUSES = (404, 409, 422)


def report_ready(
    api: ApiClient,
    state: ValidatorState,
    repeats: Repeats,
    clock: Callable[[], float],
    budget_s: float,
    stopping: Callable[[], bool],
    summary: StepSummary,
) -> None:
    """Report the submissions of ``state`` ready to report, in order, for at most ``budget_s``; the
    rest, and all after a failure of the API itself, wait for a later step. A condition that holds
    reports back is said through ``repeats`` (its key "reports")."""
    deadline = time.monotonic() + budget_s
    ready = state.ready_to_report()
    for index, record in enumerate(ready):
        if stopping():
            return
        if time.monotonic() > deadline:
            logger.warning(
                "reporting took over %g s this step; %d report(s) wait for the next",
                budget_s,
                len(ready) - index,
            )
            break
        with one_item(f"reporting submission {record.submission.submission_id}"):
            if not _report_one(api, state, repeats, clock, record, summary):
                return  # the API is unreachable or failing: the rest waits for the next step
    if summary.reported:  # reports grow the file only as evaluations are reported: prune then, not every step
        state.forget_reports(clock() - REPORT_KEPT_S)


def _report_one(
    api: ApiClient,
    state: ValidatorState,
    repeats: Repeats,
    clock: Callable[[], float],
    record: SubmissionRecord,
    summary: StepSummary,
) -> bool:
    """Report one submission; False when the API cannot take reports now."""
    report = api_report(record)
    try:
        accepted = api.report(
            report.submission_id,
            report.verdict,
            report.correct,
            report.logits_ok,
            report.measured_tokens_per_sec,
            report.benchmarks,
            report.reasons,
            report.lengths,
            report.content_hash,
        )
    except ApiClientError as error:
        if error.status in FINAL_REPORT_STATUSES:
            done = error.status == 409 and "already reported" in error.detail
            state.record_report(report.submission_id, REPORTED if done else REFUSED, str(error), clock())
            logger.warning("report on submission %d: the API answered %s; not sent again", report.submission_id, error)
            return True
        repeats.say("reports", logging.WARNING, f"reports wait for a later step: {error}")
        return not (error.status == 0 or error.status >= 500)
    state.record_report(report.submission_id, REPORTED, f"report {accepted.report_id}", clock())
    summary.reported += 1
    logger.debug(
        "reported submission %d: %s%s",
        report.submission_id,
        report.verdict,
        "" if report.verdict == "passed" else f" ({'; '.join(report.reasons)})",
    )
    return True
