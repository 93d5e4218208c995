"""A fork's ``fla`` package imported into the test process, and removed from it afterwards: the
starter fork's kernel tests call its ops directly, beside the reference."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from quasar.starter_fork import copy_starter_tree


def _loaded() -> list[str]:
    return [name for name in sys.modules if name == "fla" or name.startswith("fla.")]


@contextlib.contextmanager
def imported_fla(fork: Path) -> Iterator[ModuleType]:
    """``fork``'s ``fla`` with its QuasarAttention layer (which loads the whole tree) imported;
    fails the test where another ``fla`` is already imported, whose modules would be used instead."""
    if _loaded():
        pytest.fail("another 'fla' is already imported in this process")
    sys.path.insert(0, str(fork))
    try:
        import fla as package
        from fla.layers.quasar import QuasarAttention  # noqa: F401

        assert Path(package.__file__).is_relative_to(fork)
        yield package
    finally:
        sys.path.remove(str(fork))
        for name in _loaded():
            del sys.modules[name]


@contextlib.contextmanager
def imported_starter_fla(directory: Path) -> Iterator[ModuleType]:
    """The starter fork's tree copied to ``directory`` (no git), its ``fla`` imported (:func:`imported_fla`)."""
    copy_starter_tree(directory)
    with imported_fla(directory) as package:
        yield package
