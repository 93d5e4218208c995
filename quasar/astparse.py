"""``ast.parse`` that another thread cannot break: every parse of Python source in quasar goes here.

CPython 3.11 keeps the counter with which the AST constructor guards its recursion per interpreter,
not per thread, and checks at the end of a parse that it came back to where it started. A garbage
collection during the construction may run Python code (a finalizer), and Python code may hand the
interpreter lock to another thread; a parse on that thread then moves the shared counter, and one
of the two parses fails with ``SystemError: AST constructor recursion depth mismatch`` (CPython
gh-106905; a validator's worker parses a fork while torch, on its head-start thread, parses its own
source at import). So a parse here

- runs with the collector paused: nothing in it runs Python code, so it ends before any other
  thread runs, and no other thread's parse can move its counter;
- holds a lock, so that two of these parses cannot pause and resume the collector across each
  other.

:func:`parses_held` keeps these parses waiting while a block runs, for an import that parses its
own source (torch's), which a parse here could otherwise interrupt.
"""

from __future__ import annotations

import ast
import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_LOCK = threading.RLock()


def parse(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source, filename)``, safe beside parses on other threads; raises what
    ``ast.parse`` raises (``SyntaxError``, ``ValueError`` for a null byte, ``RecursionError``,
    ``MemoryError``)."""
    with _LOCK:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return ast.parse(source, filename=filename)
        finally:
            if collecting:
                gc.enable()


@contextmanager
def parses_held() -> Iterator[None]:
    """Parses through :func:`parse` on other threads wait until the block ends."""
    with _LOCK:
        yield
