"""The evaluation harness: sandboxed, tamper-evident benchmark and correctness check of a fork.

``evaluate(repo, target_seq_len, claimed, options)`` returns an :class:`EvaluationReport`; the
design and the threat model are in docs/evaluation.md, the sandbox in sandbox.py, and the command
line in ``quasar evaluate --help`` (cli.py).

The names below load on first use, so that start.py (a validator's worker starts the sandboxed
child before anything imports torch) and sandbox.py can be imported without the harness.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DEFAULT_SEQ_LENS": "options",
    "EvaluationInputError": "options",
    "EvaluationOptions": "options",
    "NotOnThisMachine": "options",
    "ProgressEvent": "options",
    "options_from_settings": "options",
    "REL_ERROR_THRESHOLD": "verification",
    "ReferenceWork": "references",
    "start_references": "references",
    "evaluate": "harness",
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
