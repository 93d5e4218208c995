"""The stand-in for ``fla.ops.gla`` and ``fla.ops.kda`` in the sandbox's copy of a fork
(docs/rules.md section 4 step 2). sandbox_contents.copy_tree writes this file as their
``__init__.py`` in place of whatever the fork has there; it is never imported by the parent.

Importing the package or any submodule (``fla.ops.kda.chunk``, ``fla.ops.kda.backends.x``)
succeeds, and every name looked up on them, or on a name so found, is a stand-in class: a real
fla tree, whose other modules import gla and kda at import time, can bind, subclass, subscript
or pass one on at import. Calling or instantiating one raises :class:`UnavailableError`."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, NoReturn

PACKAGE = __name__
MESSAGE = f"{PACKAGE} is not available to an evaluated fork (docs/rules.md section 4 step 2)"


class UnavailableError(RuntimeError):
    """A stand-in of the forbidden package was called or instantiated."""


def _is_dunder(name: str) -> bool:
    # Protocols (__all__, __wrapped__, __set_name__ ...) must find nothing, not a stand-in.
    return name.startswith("__") and name.endswith("__")


class _StandInType(type):
    """The stand-ins' type: a name found on a stand-in is another; a call raises."""

    def __getattr__(cls, name: str) -> Any:
        if _is_dunder(name):
            raise AttributeError(name)
        return stand_in(f"{cls.__module__}.{cls.__qualname__}.{name}")

    def __getitem__(cls, key: object) -> Any:
        # A Triton kernel is launched as kernel[grid](...): the launch is the call that raises.
        return cls

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        raise UnavailableError(f"{cls.__module__}.{cls.__qualname__} was called: {MESSAGE}")


def stand_in(qualified: str) -> Any:
    """A stand-in class for the name ``qualified`` (``module.name``)."""
    module, _, name = qualified.rpartition(".")
    return _StandInType(name, (), {"__module__": module, "__qualname__": name, "__doc__": MESSAGE})


class _StandInModule(types.ModuleType):
    """The package and its submodules: every name looked up on them is a stand-in, kept."""

    def __getattr__(self, name: str) -> Any:
        if _is_dunder(name):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        found = stand_in(f"{self.__name__}.{name}")
        setattr(self, name, found)
        return found


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds every submodule of :data:`PACKAGE` (an empty package of stand-ins), before any
    other finder can find a file for it."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(PACKAGE + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StandInModule(spec.name, MESSAGE)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.modules[PACKAGE].__class__ = _StandInModule
sys.meta_path.insert(0, _SubmoduleFinder())
