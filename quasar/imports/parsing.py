"""Parsing a fork's source: the ``encoding`` rule for coding cookies, the ``syntax-error`` rule, and
which statements of a module run when it is imported (its module level)."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from quasar import astparse
from quasar.imports.findings import Finding, Rule

_CODING_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")


def _is_utf8_name(encoding: str) -> bool:
    name = encoding.lower().replace("_", "-")
    return name in ("utf-8", "utf8") or name.startswith("utf-8-")


def parse_source(source: str, filename: str) -> ast.Module | Finding:
    """The module's AST, or the finding that says why it cannot be had.

    A PEP 263 cookie naming another encoding than UTF-8 is an ``encoding`` finding (``utf-7`` can
    hide code in what reads as a comment); a null byte, a syntax error or nesting too deep for the
    parser are ``syntax-error`` findings.
    """
    for number, line in enumerate(re.split(r"\r\n|\r|\n", source, maxsplit=2)[:2], start=1):
        cookie = _CODING_COOKIE.match(line)
        if cookie and not _is_utf8_name(cookie.group(1)):
            message = f"declares the source encoding {cookie.group(1)!r}; only UTF-8 is accepted"
            return Finding(filename, number, Rule.ENCODING, message)
    if "\0" in source:  # a ValueError or a SyntaxError without a line, depending on the Python version
        line = source.count("\n", 0, source.find("\0")) + 1
        return Finding(filename, line, Rule.SYNTAX_ERROR, "does not parse: the source contains a null byte")
    try:
        return astparse.parse(source, filename)
    except SyntaxError as error:
        return Finding(filename, error.lineno, Rule.SYNTAX_ERROR, f"does not parse: {error.msg}")
    except (RecursionError, MemoryError):
        return Finding(filename, None, Rule.SYNTAX_ERROR, "does not parse: nested too deeply")


_COMPARISONS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}


def _truth(test: ast.expr) -> bool | None:
    """Whether a test always holds (True) or never does (False): constants, ``not``, ``and``/``or``
    and comparisons of constants; ``TYPE_CHECKING`` never holds on import. None when it depends."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _truth(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [_truth(value) for value in test.values]
        decisive = isinstance(test.op, ast.Or)  # the value that ends an `or` (True) or an `and` (False)
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _COMPARISONS:
        left, right = test.left, test.comparators[0]
        if isinstance(left, ast.Constant) and isinstance(right, ast.Constant):
            try:
                return bool(_COMPARISONS[type(test.ops[0])](left.value, right.value))
            except TypeError:
                return None
    return None


def module_level_statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported: those of ``body``, and of the blocks in it
    that run on import (a module-level ``if`` unless its test never holds, its ``else`` unless the
    test always holds, a ``with``, the body, ``else`` and ``finally`` of a ``try``), never a
    function's, class's or ``except``'s, nor one after a ``raise`` of its block."""
    try_types = (ast.Try, getattr(ast, "TryStar", ast.Try))
    for statement in body:
        yield statement
        if isinstance(statement, ast.Raise):
            return
        if isinstance(statement, ast.If):
            truth = _truth(statement.test)
            if truth is not False:
                yield from module_level_statements(statement.body)
            if truth is not True:
                yield from module_level_statements(statement.orelse)
        elif isinstance(statement, try_types):
            raises = any(isinstance(inner, ast.Raise) for inner in statement.body)  # then `else` never runs
            for block in (statement.body, [] if raises else statement.orelse, statement.finalbody):
                yield from module_level_statements(block)
        elif isinstance(statement, ast.With):
            yield from module_level_statements(statement.body)
