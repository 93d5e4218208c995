"""Parsing a fork's source: the ``encoding`` rule for coding cookies, the ``syntax-error`` rule, and
which statements of a module run when it is imported (its module level)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence

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


def _never_runs(test: ast.expr) -> bool:
    """Tests whose body never runs: ``if TYPE_CHECKING:``, ``if typing.TYPE_CHECKING:``, ``if False:``."""
    if isinstance(test, ast.Constant):
        return not test.value
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def module_level_statements(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run when the module is imported: those of ``body``, and of the blocks in it
    that run on import (a module-level ``if`` unless its test never holds, its ``else``, a ``with``,
    the body, ``else`` and ``finally`` of a ``try``), never a function's, class's or ``except``'s."""
    try_types = (ast.Try, getattr(ast, "TryStar", ast.Try))
    for statement in body:
        yield statement
        if isinstance(statement, ast.If):
            if not _never_runs(statement.test):
                yield from module_level_statements(statement.body)
            yield from module_level_statements(statement.orelse)
        elif isinstance(statement, try_types):
            for block in (statement.body, statement.orelse, statement.finalbody):
                yield from module_level_statements(block)
        elif isinstance(statement, ast.With):
            yield from module_level_statements(statement.body)
