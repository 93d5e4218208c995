"""The evaluation harness: sandboxed, tamper-evident benchmark and correctness check of a fork.

``evaluate(repo, target_seq_len, claimed, options)`` returns an :class:`EvaluationReport`; see
harness.py for the design and threat model, sandbox.py for the isolation, and
``python -m quasar.evaluate --help`` for the command line.
"""

from quasar.evaluate.harness import (
    DEFAULT_SEQ_LENS,
    REL_ERROR_THRESHOLD,
    EvaluationInputError,
    EvaluationOptions,
    ProgressEvent,
    evaluate,
)
from quasar.evaluate.report import EvaluationReport, ImportCheck, LengthResult, Timings
from quasar.evaluate.sandbox import SandboxPolicy, SandboxUnavailable

__all__ = [
    "DEFAULT_SEQ_LENS",
    "REL_ERROR_THRESHOLD",
    "EvaluationInputError",
    "EvaluationOptions",
    "EvaluationReport",
    "ImportCheck",
    "LengthResult",
    "ProgressEvent",
    "SandboxPolicy",
    "SandboxUnavailable",
    "Timings",
    "evaluate",
]
