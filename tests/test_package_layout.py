"""The shape of the quasar package a maintainer relies on: its modules import each other without a
cycle (counting imports inside functions and under TYPE_CHECKING: a cycle there is still two
modules that cannot be read one after the other; a ``__main__`` block, which runs only as a
script, is not a dependency of its module), and no file of it is longer than 600 lines."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

import quasar

PACKAGE = Path(quasar.__file__).parent
# The starter fork's template is miners' code, copied out verbatim: not modules of this package.
TEMPLATE = PACKAGE / "starter_fork" / "tree"
MAX_LINES = 600


def package_files() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*")
        if path.is_file() and TEMPLATE not in path.parents and "__pycache__" not in path.parts
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_main_block(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def module_nodes(tree: ast.Module) -> list[ast.AST]:
    """Every node of ``tree`` but those of its ``if __name__ == "__main__":`` blocks."""
    found: list[ast.AST] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        found.append(node)
        pending.extend(child for child in ast.iter_child_nodes(node) if not is_main_block(child))
    return found


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports anywhere in it: ``from a.b import c`` names
    ``a.b.c`` when that is a module, else ``a.b``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in module_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names}
    found = set()
    for target in targets:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    files = [path for path in package_files() if path.suffix == ".py"]
    modules = {module_name(path) for path in files}
    return {module_name(path): imported_modules(path, modules) for path in files}


def test_the_import_graph_sees_imports_inside_functions_and_relative_ones():
    graph = import_graph()
    assert "quasar.errors" in graph["quasar.evaluate.sandbox_contents"]  # a module-level absolute import
    assert "quasar.imports.findings" in graph["quasar.imports.validate"]  # from a sibling
    # A function-level import: the validator's worker builds the sandbox policy lazily.
    assert "quasar.evaluate.sandbox" in graph["quasar.validator.worker"]
    # The dev chain's module runs its CLI as a script; the CLI builds on the dev chain.
    assert "quasar.chain.devchain" in graph["quasar.chain.devchain_cli"]
    assert "quasar.chain.devchain_cli" not in graph["quasar.chain.devchain"]


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    cycles = []
    sorter = graphlib.TopologicalSorter(graph)
    try:
        sorter.prepare()
    except graphlib.CycleError as error:
        cycles.append(" -> ".join(error.args[1]))
    assert not cycles, f"modules that import each other: {cycles}"


@pytest.mark.parametrize("path", package_files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_no_file_of_the_package_is_longer_than_600_lines(path):
    lines = len(path.read_bytes().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE.parent)} has {lines} lines: split it along its jobs"
