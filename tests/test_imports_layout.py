"""The fork's layout (quasar/imports/layout.py): paths to module names, relative imports resolved
as Python resolves them, and which names are forbidden by name alone."""

from __future__ import annotations

import pytest

from quasar.imports.layout import forbidden_root, module_name_for, module_paths, resolve_relative


def test_module_names_and_relative_resolution():
    assert module_name_for("fla/ops/quasar/chunk.py") == "fla.ops.quasar.chunk"
    assert module_name_for("fla/ops/quasar/__init__.py") == "fla.ops.quasar"
    assert resolve_relative(None, 2, "fla.ops.quasar.chunk", False) == "fla.ops"
    assert resolve_relative("kda", 2, "fla.ops.quasar", True) == "fla.ops.kda"
    assert resolve_relative("x", 4, "fla.ops.quasar.chunk", False) is None
    assert module_paths("fla.ops.kda") == ["fla/ops/kda.py", "fla/ops/kda/__init__.py"]


@pytest.mark.parametrize(
    ("dotted", "root"),
    [
        ("fla.ops.kda", "fla.ops.kda"),
        ("fla.ops.gla.chunk.chunk_gla", "fla.ops.gla"),
        ("fla.ops.gla_utils", None),  # a look-alike: only whole dotted parts count
        ("fla.ops.kdax.chunk", None),
        ("fla.ops", None),
        ("other.fla.ops.kda", None),
    ],
)
def test_forbidden_by_name(dotted, root):
    assert forbidden_root(dotted) == root
