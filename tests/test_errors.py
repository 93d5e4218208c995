"""Every error the package raises for its callers derives from QuasarError."""

from __future__ import annotations

import importlib
import pkgutil

import quasar
from quasar.errors import QuasarError

# Loaded by file path inside the sandbox, or written into the fork's copy there, importing nothing
# of the package (quasar/errors.py says so).
CHILD_MODULES = {
    "quasar.evaluate.child",
    "quasar.evaluate.ops_stand_in",
    "quasar.evaluate.protocol",
    "quasar.evaluate.sandbox_init",
    "quasar.evaluate.syscall_filter",
}


def package_modules():
    for info in pkgutil.walk_packages(quasar.__path__, "quasar."):
        name = info.name
        if name.endswith("__main__") or name.startswith("quasar.starter_fork.tree") or name in CHILD_MODULES:
            continue
        yield importlib.import_module(name)


def test_every_public_error_class_derives_from_quasar_error():
    errors = []
    for module in package_modules():
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.__name__
                and not value.__name__.startswith("_")
            ):
                errors.append(value)
    assert len(errors) >= 30
    strays = sorted(f"{error.__module__}.{error.__name__}" for error in errors if not issubclass(error, QuasarError))
    assert strays == []
