"""The index of re-exports across the fork: names that a module of the fork binds from
``fla.ops.gla``/``fla.ops.kda``, followed through chains of imports and ``*`` imports.

Upstream's ``fla/ops/__init__.py`` imports ``chunk_kda`` from ``.kda``, so ``from fla.ops import
chunk_kda`` in a checked file is a forbidden import although it names no forbidden module. The
rest of the fork is read only for this; it is never checked itself.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

from quasar import astparse
from quasar.imports.budget import Deadline
from quasar.imports.layout import forbidden_root, has_prefix, is_package_file, module_paths, resolve_relative
from quasar.imports.parsing import module_level_statements


@dataclass
class _ModuleBindings:
    imported: dict[str, str]  # module-level name -> the dotted thing it is bound to
    defined: set[str]  # module-level names bound by def, class or assignment
    star_from: list[str]  # modules star-imported at module level


def _dotted_path(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted_path(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class ReexportIndex:
    """Finds names that a module of the fork binds from ``fla.ops.gla``/``fla.ops.kda``.

    ``locate(module)`` returns ``(repo-relative path, source text)`` of a module of the fork, or
    None when it has no such module. ``root_of("fla.ops.chunk_kda")`` is ``"fla.ops.kda"`` when
    ``fla/ops/__init__.py`` imports ``chunk_kda`` from ``.kda``; chains of re-exports are followed.
    With a ``deadline``, look-ups raise :class:`~quasar.imports.budget.OverBudget` once it has passed.
    """

    _MAX_DEPTH = 16

    def __init__(self, locate: Callable[[str], tuple[str, str] | None], deadline: Deadline | None = None):
        self._locate = locate
        self._deadline = deadline
        self._bindings: dict[str, _ModuleBindings | None] = {}
        self._roots: dict[str, str | None] = {}

    @classmethod
    def from_files(cls, files: dict[str, str]) -> ReexportIndex:
        """An index over in-memory files, ``{"fla/ops/__init__.py": "from .kda import chunk_kda"}``."""

        def locate(module: str) -> tuple[str, str] | None:
            for path in module_paths(module):
                if path in files:
                    return path, files[path]
            return None

        return cls(locate)

    def root_of(self, dotted: str, depth: int = 0) -> str | None:
        """The forbidden module ``dotted`` comes from, directly or through re-exports; else None."""
        direct = forbidden_root(dotted)
        if direct or depth > self._MAX_DEPTH or not has_prefix(dotted, "fla"):
            return direct
        if self._deadline:
            self._deadline.check()
        if dotted not in self._roots:
            self._roots[dotted] = None  # guards against import cycles
            self._roots[dotted] = self._lookup(dotted, depth)
        return self._roots[dotted]

    def star_root(self, module: str, depth: int = 0) -> str | None:
        """The forbidden module whose names ``from module import *`` may bind, if any (conservative:
        every name the module binds by import counts, ``__all__`` or not)."""
        direct = forbidden_root(module)
        bindings = self._module_bindings(module) if not direct and depth <= self._MAX_DEPTH else None
        if direct or bindings is None:
            return direct
        for target in bindings.imported.values():
            if root := self.root_of(target, depth + 1):
                return root
        for source in bindings.star_from:
            if root := self.star_root(source, depth + 1):
                return root
        return None

    def _lookup(self, dotted: str, depth: int) -> str | None:
        if self._locate(dotted) is not None:
            return None  # a module of the fork other than gla/kda
        parts = dotted.split(".")
        for split in range(len(parts) - 1, 0, -1):
            module = ".".join(parts[:split])
            bindings = self._module_bindings(module)
            if bindings is None:
                continue
            name, rest = parts[split], parts[split + 1 :]
            if name in bindings.imported:
                return self.root_of(".".join([bindings.imported[name], *rest]), depth + 1)
            if name in bindings.defined:
                return None
            for source in bindings.star_from:
                root = forbidden_root(source) or self.root_of(".".join([source, name, *rest]), depth + 1)
                if root:
                    return root
            return None
        return None

    def _module_bindings(self, module: str) -> _ModuleBindings | None:
        if module not in self._bindings:
            if self._deadline:
                self._deadline.check()
            self._bindings[module] = self._parse_bindings(module)
        return self._bindings[module]

    def _parse_bindings(self, module: str) -> _ModuleBindings | None:
        located = self._locate(module)
        if located is None:
            return None
        path, source = located
        try:
            tree = astparse.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        is_package = is_package_file(path)
        bindings = _ModuleBindings({}, set(), [])
        for statement in module_level_statements(tree.body):
            if isinstance(statement, ast.Import):
                for alias in statement.names:
                    if alias.asname:
                        bindings.imported[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        bindings.imported[top] = top
            elif isinstance(statement, ast.ImportFrom):
                base = resolve_relative(statement.module, statement.level, module, is_package)
                if base is None:
                    continue
                for alias in statement.names:
                    if alias.name == "*":
                        bindings.star_from.append(base)
                    else:
                        bindings.imported[alias.asname or alias.name] = f"{base}.{alias.name}"
            elif isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bindings.defined.add(statement.name)
            elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                value = _dotted_path(statement.value) if statement.value is not None else None
                for target in targets:
                    if isinstance(target, ast.Name):
                        if value and value.split(".")[0] in bindings.imported:
                            head, _, tail = value.partition(".")
                            bindings.imported[target.id] = ".".join(filter(None, [bindings.imported[head], tail]))
                        else:
                            bindings.defined.add(target.id)
        return bindings
