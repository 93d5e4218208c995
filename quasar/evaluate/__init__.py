"""The evaluation harness: sandboxed, tamper-evident benchmark and correctness check of a fork.

``evaluate(repo, target_seq_len, claimed, options)`` returns an :class:`EvaluationReport`; see
harness.py for the design and threat model, sandbox.py for the isolation, and
``python -m quasar.evaluate --help`` for the command line.

The names below load on first use, so that start.py (a validator's worker starts the sandboxed
child before anything imports torch) and sandbox.py can be imported without the harness.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DEFAULT_SEQ_LENS": "harness",
    "REL_ERROR_THRESHOLD": "harness",
    "EvaluationInputError": "harness",
    "EvaluationOptions": "harness",
    "ProgressEvent": "harness",
    "ReferenceWork": "harness",
    "evaluate": "harness",
    "options_from_settings": "harness",
    "start_references": "harness",
    "EvaluationReport": "report",
    "ImportCheck": "report",
    "LengthResult": "report",
    "Timings": "report",
    "SandboxPolicy": "sandbox",
    "SandboxUnavailable": "sandbox",
    "SandboxStart": "start",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
