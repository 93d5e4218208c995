"""A primary's place in its hotkey's reports on the API (``GET /validators/{hotkey}/reports``, read
after every step: quasar/validator/loop.py, phase 7).

It keeps the id of the last report it read and which report that was (its submission and the API's
time of it), and asks for the reports from that one on, that one included. The API's report ids
name reports only within its database: one replaced (its ids start at 1 again) or restored from an
older backup (its ids go back, and are given to other reports) no longer answers that report first,
and the reports are read again from the first; those already imported are known by their
submissions' content and skipped (``ValidatorState.add_submission``)."""

from __future__ import annotations

import logging

from quasar.api.schemas import MAX_ID, ReportedWork
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import IMPORTED_AFTER, IMPORTED_LAST

logger = logging.getLogger(__name__)


def _which(report: ReportedWork) -> str:
    """The value of IMPORTED_LAST for ``report``."""
    return f"{report.report_id} {report.submission_id} {report.reported_at!r}"


class ReportCursor:
    """Where ``state``'s primary stands in its hotkey's reports; :meth:`save` stores it."""

    def __init__(self, state: ValidatorState):
        self.state = state
        self.after = int(state.get_meta(IMPORTED_AFTER) or 0)
        if not 0 <= self.after <= MAX_ID:
            # Kept by a version that took a lying API's report id as the last one read.
            logger.warning(
                "this validator's place in its hotkey's reports, report %d, is past any an API can be asked "
                "after (a lying API's id, which an earlier version kept); the reports are read again from the first",
                self.after,
            )
            self.after = 0
        last = state.get_meta(IMPORTED_LAST)
        self.last = last if last is not None and last.split(" ")[0] == str(self.after) else None

    @property
    def asked_after(self) -> int:
        """The id to ask for the reports after: the last one read is asked for again."""
        return max(self.after - 1, 0)

    def unread(self, reports: list[ReportedWork]) -> list[ReportedWork]:
        """The ``reports`` (asked after :attr:`asked_after`, oldest first) past the last one read; none
        when the API no longer answers that one first, the cursor then back at the first report."""
        if not self.after:
            return reports
        if reports and reports[0].report_id == self.after and self.last in (None, _which(reports[0])):
            return reports[1:]
        logger.warning(
            "the API no longer holds report %d of this hotkey, the last one read: its database was replaced "
            "or restored from a backup; the hotkey's reports are read again from the first",
            self.after,
        )
        self.after, self.last = 0, None
        return []

    def read(self, report: ReportedWork) -> None:
        """``report`` is read (imported or known already). One whose id is past MAX_ID, which no API
        takes as the id to ask after, leaves the cursor where it is: a lying API's would have every
        API after it refuse the next question."""
        if 0 < report.report_id <= MAX_ID:
            self.after, self.last = report.report_id, _which(report)

    def save(self) -> None:
        self.state.set_meta(IMPORTED_AFTER, str(self.after))
        self.state.set_meta(IMPORTED_LAST, self.last or "")
