"""Constant folding: the value an expression always has, when it is built only from literals.

A dynamic import whose target folds to a constant is checked like a plain import; one whose target
does not is unverifiable. Strings fold from literals, ``+`` of literals, f-strings of literals and
``"sep".join([literals])``; file paths also from ``__file__`` and ``os.path`` / ``pathlib`` joins.
"""

from __future__ import annotations

import ast
import posixpath
from collections.abc import Callable


def fold_str(node: ast.AST | None) -> str | None:
    """The string an expression always evaluates to, when it is built only from string literals."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif (
                isinstance(value, ast.FormattedValue)
                and value.format_spec is None
                and value.conversion in (-1, ord("s"))
                and (inner := fold_str(value.value)) is not None
            ):
                parts.append(inner)
            else:
                return None
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = fold_str(node.left), fold_str(node.right)
        return None if left is None or right is None else left + right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "join"
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], (ast.List, ast.Tuple))
    ):
        separator = fold_str(node.func.value)
        items = [fold_str(element) for element in node.args[0].elts]
        if separator is None or any(item is None for item in items):
            return None
        return separator.join(items)  # type: ignore[arg-type]
    return None


def fold_str_list(node: ast.AST | None) -> list[str] | None:
    """A list/tuple of foldable strings; ``None`` (the constant) and a missing argument are ``[]``."""
    if node is None or (isinstance(node, ast.Constant) and node.value is None):
        return []
    if isinstance(node, (ast.List, ast.Tuple)):
        items = [fold_str(element) for element in node.elts]
        return None if any(item is None for item in items) else items  # type: ignore[return-value]
    return None


def fold_int(node: ast.AST | None, default: int) -> int | None:
    """An integer literal's value; ``default`` for a missing argument; None for anything else."""
    if node is None:
        return default
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


_PATH_FUNCTIONS = ("os.path.", "posixpath.", "pathlib.", "builtins.str", "os.fspath")


def fold_path(node: ast.AST, filename: str, resolve: Callable[[ast.AST], frozenset[str]]) -> str | None:
    """A file path built from literals and ``__file__`` (which is ``filename``) with ``os.path`` /
    ``pathlib`` operations. ``resolve`` names the dotted functions a call's callee may stand for."""
    text = fold_str(node)
    if text is not None:
        return text
    if isinstance(node, ast.Name) and node.id == "__file__":
        return filename
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = fold_path(node.left, filename, resolve), fold_path(node.right, filename, resolve)
        return None if left is None or right is None else posixpath.join(left, right)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = fold_path(node.value, filename, resolve)
        return None if inner is None else posixpath.dirname(posixpath.normpath(inner))
    if not isinstance(node, ast.Call) or node.keywords:
        return None
    functions = resolve(node.func)
    parts = [part for argument in node.args if (part := fold_path(argument, filename, resolve)) is not None]
    if len(parts) != len(node.args):
        return None
    if isinstance(node.func, ast.Attribute) and node.func.attr in ("resolve", "absolute") and not parts:
        return fold_path(node.func.value, filename, resolve)
    if not any(f.startswith(_PATH_FUNCTIONS) for f in functions) or not parts:
        return None
    if any(f.endswith(".dirname") for f in functions):
        return posixpath.dirname(posixpath.normpath(parts[0]))
    return posixpath.join(*parts)
