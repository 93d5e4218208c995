"""Constant folding (quasar/imports/folding.py): what a dynamic import's argument always evaluates
to. Folding too much would check the wrong module name and let an import through; what does not
fold is refused by the checker, so each shape that changes the text must not fold."""

from __future__ import annotations

import ast

import pytest

from quasar.imports.folding import fold_int, fold_path, fold_str, fold_str_list


def expression(text: str) -> ast.expr:
    return ast.parse(text, mode="eval").body


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'fla.ops.kda'", "fla.ops.kda"),
        ("'fla.ops.' + 'kda'", "fla.ops.kda"),
        ("f\"{'fla'}.ops.{'kda'}\"", "fla.ops.kda"),
        ("f\"fla.ops.{'kda'!s}\"", "fla.ops.kda"),
        ("'.'.join(['fla', 'ops', 'kda'])", "fla.ops.kda"),
        ("'.'.join(('fla', 'ops' + '', f'{\"kda\"}'))", "fla.ops.kda"),
        # Shapes whose value is not the text written: a format spec or !r changes it, a method call,
        # a variable, a number or a join of something else cannot be read off the source.
        ("f\"fla.ops.{'kda':>4}\"", None),
        ("f\"fla.ops.{'kda'!r}\"", None),
        ("'fla.ops.' + 'KDA'.lower()", None),
        ("'fla.ops.' + name", None),
        ("'fla.ops.' + 1", None),
        ("'.'.join(parts)", None),
        ("'.'.join(['fla', 'ops', kda])", None),
        ("sep.join(['fla', 'ops', 'kda'])", None),
        ("'.'.join(['fla', 'ops', 'kda'], extra)", None),
        # Only join folds: format takes a list too and ignores it, so this is 'fla.ops.kda', not 'x'.
        ("'fla.ops.kda'.format(['x'])", None),
    ],
)
def test_fold_str(text, value):
    assert fold_str(expression(text)) == value


def test_fold_str_list_and_int():
    assert fold_str_list(None) == [] and fold_str_list(expression("None")) == []
    assert fold_str_list(expression("['gla', 'k' + 'da']")) == ["gla", "kda"]
    assert fold_str_list(expression("['gla', name]")) is None
    assert fold_str_list(expression("names")) is None
    assert fold_int(None, 0) == 0 and fold_int(expression("2"), 0) == 2
    assert fold_int(expression("True"), 0) is None  # a bool is an int to Python, not a level written as one
    assert fold_int(expression("level"), 0) is None


# What the callees below stand for in a file that did `import os, pathlib` and `from pathlib import Path`
# (the checker's name resolution, in miniature).
CALLEES = {"Path": "pathlib.Path", "str": "builtins.str", "open": "builtins.open"}


def resolve_callee(node: ast.AST) -> frozenset[str]:
    written = ast.unparse(node)
    return frozenset({CALLEES.get(written, written)})


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("__file__", "fla/ops/quasar/chunk.py"),
        ("os.path.join(os.path.dirname(__file__), '..', 'kda', 'chunk.py')", "fla/ops/quasar/../kda/chunk.py"),
        ("Path(__file__).parent.parent / 'kda'", "fla/ops/kda"),
        ("pathlib.Path(__file__).resolve().parent / 'x.so'", "fla/ops/quasar/x.so"),
        ("Path(__file__).absolute().parent / 'x.so'", "fla/ops/quasar/x.so"),
        ("str(Path('fla') / 'ops' / 'gla.py')", "fla/ops/gla.py"),
        ("os.path.join(base, 'kda')", None),
        ("os.path.join(__file__, name='kda')", None),
        ("open(__file__)", None),
    ],
)
def test_fold_path(text, path):
    assert fold_path(expression(text), "fla/ops/quasar/chunk.py", resolve_callee) == path
