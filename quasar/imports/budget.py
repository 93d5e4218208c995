"""The import check's time budget (docs/rules.md section 4 step 2): the whole check of a fork must
end within :data:`CHECK_BUDGET_S` seconds, or the fork is refused as ``unverifiable-import``.

The check's loops call :meth:`Deadline.check`, so a file that makes some path of the check slow
(one found or not yet found) ends in a clear failure instead of holding the validator's GPU slot
for hours. The check of a real fla tree takes well under a second; the budget is far above that,
so that only a pathological file reaches it, on every validator alike.
"""

from __future__ import annotations

import time

from quasar.errors import QuasarError
from quasar.imports.findings import Finding, Rule

CHECK_BUDGET_S = 60.0


class OverBudget(QuasarError):
    """Raised by :meth:`Deadline.check` once the budget is spent."""


class Deadline:
    """The end of a check's budget of ``seconds``, counted from its creation (monotonic clock)."""

    def __init__(self, seconds: float = CHECK_BUDGET_S):
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def check(self) -> None:
        """Raises :class:`OverBudget` once the budget is spent."""
        if time.monotonic() > self._end:
            raise OverBudget

    def finding(self, path: str) -> Finding:
        """The error of a check that ran out of time while on ``path``."""
        message = (
            f"cannot be verified: the import check ran past its time budget of {self.seconds:g} s "
            "(a real fla tree needs well under a second)"
        )
        return Finding(path, None, Rule.UNVERIFIABLE_IMPORT, message)
