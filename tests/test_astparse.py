"""quasar/astparse.py: a parse that another thread's parse cannot break (CPython 3.11 shares the
AST constructor's recursion counter between threads), and parses held while a block runs."""

from __future__ import annotations

import ast
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from quasar import astparse

SOURCE = "\n".join(f"def f{i}(a, b):\n    return [x * {i} for x in range(a) if x % b]\n" for i in range(300))


class _Finalized:
    """Garbage whose collection runs Python code, which may hand the interpreter lock to another thread."""

    def __del__(self) -> None:
        sum(range(50))


def _make_cyclic_garbage(count: int) -> None:
    for _ in range(count):
        item = _Finalized()
        item.cycle = item  # type: ignore[attr-defined]


@contextmanager
def _a_thread_parsing_meanwhile() -> Iterator[None]:
    """Another thread parsing ``SOURCE`` with plain ``ast.parse`` without pause (a library
    importing) while the block runs, collections running finalizers and the interpreter lock
    switching as often as it can."""
    stop = threading.Event()

    def library() -> None:
        while not stop.is_set():
            try:
                ast.parse(SOURCE)
            except SystemError:
                pass  # the other side of the same fault: the test checks only the parses beside it

    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50)
    sys.setswitchinterval(1e-6)
    other = threading.Thread(target=library, daemon=True)
    other.start()
    try:
        yield
    finally:
        stop.set()
        other.join()
        sys.setswitchinterval(interval)
        gc.set_threshold(*thresholds)


class _ParsesWhenCollected:
    """Garbage whose finalizer parses, from deeper in the stack: collected while a parse builds its
    tree, it moves the counter that parse checks, as another thread's parse does when a finalizer
    hands it the interpreter lock."""

    finalized = 0

    def __del__(self) -> None:
        _parse_from_depth(40)
        _ParsesWhenCollected.finalized += 1


def _parse_from_depth(levels: int) -> None:
    if levels:
        _parse_from_depth(levels - 1)
    else:
        ast.parse("y = [1, 2]\n")


def _parse_with_garbage_that_parses(parse: Callable[[str], ast.Module]) -> ast.Module:
    """``parse(SOURCE)`` with five such objects waiting to be collected: the tree's construction
    allocates far more than the collector's threshold, so they are collected during it unless the
    collector is paused."""
    was = gc.isenabled()
    gc.enable()
    gc.collect()
    _ParsesWhenCollected.finalized = 0
    for _ in range(5):
        item = _ParsesWhenCollected()
        item.cycle = item  # type: ignore[attr-defined]
    del item
    try:
        return parse(SOURCE)
    finally:
        gc.collect()
        assert _ParsesWhenCollected.finalized == 5
        if not was:
            gc.disable()


def test_a_parse_inside_the_construction_of_the_tree_cannot_break_it():
    """What this stops: the import check of one fork failing with "AST constructor recursion depth
    mismatch" while other threads evaluate other forks (tests/test_upstream_fork.py runs three
    evaluations at once) or torch parses its source at import (a validator's worker)."""
    assert len(_parse_with_garbage_that_parses(astparse.parse).body) == 300
    if sys.version_info[:2] == (3, 11):
        # The fault is live on this Python: the same garbage breaks a plain ast.parse.
        with pytest.raises(SystemError, match="recursion depth mismatch"):
            _parse_with_garbage_that_parses(ast.parse)


def test_a_parse_survives_another_thread_parsing_meanwhile():
    """The same beside a thread parsing without pause, the interpreter lock switching as often as it
    can (how often the other thread runs in the middle depends on the machine's load): no parse
    raises "recursion depth mismatch"."""
    parses = 0
    with _a_thread_parsing_meanwhile():
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            _make_cyclic_garbage(20)
            assert len(astparse.parse(SOURCE).body) == 300
            parses += 1
    assert parses > 0


@pytest.mark.parametrize("collecting", [True, False])
def test_the_collector_is_left_as_it_was_found(collecting):
    was = gc.isenabled()
    try:
        gc.enable() if collecting else gc.disable()
        assert isinstance(astparse.parse("x = 1\n"), ast.Module)
        assert gc.isenabled() is collecting
        with pytest.raises(SyntaxError):
            astparse.parse("def f(:\n")
        assert gc.isenabled() is collecting
    finally:
        gc.enable() if was else gc.disable()


def test_parses_wait_while_they_are_held():
    parsed = threading.Event()

    def parse_elsewhere() -> None:
        astparse.parse("x = 1\n")
        parsed.set()

    with astparse.parses_held():
        elsewhere = threading.Thread(target=parse_elsewhere)
        elsewhere.start()
        assert not parsed.wait(0.3)
        assert isinstance(astparse.parse("y = 2\n"), ast.Module)  # the holding thread itself may parse
    elsewhere.join(10)
    assert parsed.is_set()
