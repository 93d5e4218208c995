"""The package quasar/imports/ as a whole: its modules import each other without a cycle, so each
can be read (and loaded) after the ones it builds on."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import quasar.imports


def imported_siblings(tree: ast.Module) -> set[str]:
    """The modules of the package that a module of it imports (``__init__`` for the package itself)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found |= {node.module} if node.module else {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "quasar.imports":
                found.add("__init__")
            elif node.module.startswith("quasar.imports."):
                found.add(node.module.removeprefix("quasar.imports."))
    return found


def test_the_package_modules_import_each_other_without_a_cycle():
    package = Path(quasar.imports.__file__).parent
    graph = {path.stem: imported_siblings(ast.parse(path.read_text())) for path in package.glob("*.py")}
    assert graph["validate"] >= {"repository", "forbidden_imports", "required"}
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert order.index("findings") < order.index("validate") < order.index("cli") < order.index("__init__")
