"""What the phases of one validator step share (quasar/validator/loop.py): the step's summary, and
the rule that one item's failure (a submission, a report) holds up none of the others."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from quasar.validator.records import EvaluationKey

logger = logging.getLogger(__name__)


@dataclass
class StepSummary:
    """What one step did (for logs and tests)."""

    fetched: int = 0
    started: list[EvaluationKey] = field(default_factory=list)
    retried: list[EvaluationKey] = field(default_factory=list)
    reported: int = 0
    imported: int = 0
    weights_set: bool = False
    failed_phases: list[str] = field(default_factory=list)


@contextlib.contextmanager
def one_item(what: str) -> Iterator[None]:
    """Log an exception in one item of a phase and go on with the next item."""
    try:
        yield
    except Exception:  # one submission's failure must not hold up the others
        logger.exception("validator step: %s failed; going on", what)
