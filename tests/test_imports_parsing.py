"""Parsing a fork's source (quasar/imports/parsing.py): a coding cookie other than UTF-8, a null
byte and a syntax error are findings with their line, never a crash."""

from __future__ import annotations

import ast

import pytest

from quasar.imports import validate_repo
from quasar.imports.findings import Finding, Rule
from quasar.imports.parsing import module_level_statements, parse_source
from tests.import_forks import error_keys, make_fork


@pytest.mark.parametrize(
    ("text", "line", "rule"),
    [
        ("import torch\ndef f(:\n    pass\n", 2, Rule.SYNTAX_ERROR),
        ("import torch\nx = 1\0\n", 2, Rule.SYNTAX_ERROR),
        ("# -*- coding: utf-7 -*-\nx = 1 +AAo-import fla.ops.kda\n", 1, Rule.ENCODING),
        ("#!/usr/bin/env python\n# vim: set fileencoding=latin-1 :\n", 2, Rule.ENCODING),
    ],
    ids=["syntax", "null-byte", "utf-7-cookie", "latin-1-cookie"],
)
def test_broken_source_is_an_error_not_a_crash(tmp_path, text, line, rule):
    report = validate_repo(make_fork(tmp_path, {"fla/ops/quasar/gate.py": text}))
    assert error_keys(report) == {("fla/ops/quasar/gate.py", line, rule)}


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("#!python\r# coding: utf-7\rx = 1 +AAo-y = 2\r", 2),
        ("#!/usr/bin/env python\r\n# coding=utf-7\r\nx = 1\r\n", 2),
        ("\t# vim: set fileencoding=cp1252 :\nx = 1\n", 1),
    ],
    ids=["cr-line-ends", "crlf-line-ends", "indented-cookie"],
)
def test_a_cookie_on_either_of_the_first_two_lines_is_read_whatever_the_line_ends(text, line):
    # Python honours a cookie on line 1 or 2 (PEP 263), also after a lone "\r": it runs the `y = 2`
    # that utf-7 hides in the first case. Lines split on "\n" alone would miss that cookie.
    finding = parse_source(text, "fla/ops/quasar/gate.py")
    assert isinstance(finding, Finding) and (finding.line, finding.rule) == (line, Rule.ENCODING)


def test_a_cookie_below_line_two_is_a_comment():
    assert isinstance(parse_source("import torch\nx = 1\n# -*- coding: utf-7 -*-\n", "gate.py"), ast.Module)


@pytest.mark.parametrize(
    "text",
    [
        "if not True:\n    import x\n",
        "if 0 == 1:\n    import x\n",
        "if False or (1 > 2):\n    import x\n",
        "if True:\n    pass\nelse:\n    import x\n",
        "try:\n    raise ImportError\n    import x\nexcept ImportError:\n    pass\n",
        "try:\n    raise ImportError\nexcept ImportError:\n    pass\nelse:\n    import x\n",
    ],
    ids=["not-true", "constant-comparison", "bool-op", "else-of-true", "after-raise", "else-of-a-raising-try"],
)
def test_an_import_in_a_block_that_never_runs_is_not_at_module_level(text):
    # The required imports must run on import: a test that is constantly false, or a statement after
    # a raise, counted as if it ran.
    statements = module_level_statements(ast.parse(text).body)
    assert not any(isinstance(s, ast.Import) for s in statements)


def test_blocks_whose_test_is_not_constant_or_true_are_module_level():
    text = "import sys\nif sys.platform == 'linux':\n    import a\nif 1 < 2:\n    import b\nelse:\n    pass\n"
    names = [s.names[0].name for s in module_level_statements(ast.parse(text).body) if isinstance(s, ast.Import)]
    assert names == ["sys", "a", "b"]
