"""The required-imports rule (quasar/imports/required.py): ``chunk.py`` imports every name of the
profile at module level; combined lines, aliases and relative forms count, imports that do not run
when the module is imported do not."""

from __future__ import annotations

import textwrap

import pytest

from quasar.imports import validate_repo
from quasar.imports.findings import Rule
from quasar.imports.required import check_required_imports
from tests.import_forks import CHUNK, CORE_ONE_LINE, STRICT_CHUNK, make_fork


def test_core_profile_accepts_one_combined_line_and_strict_names_what_is_missing(tmp_path):
    fork = make_fork(tmp_path, {CHUNK: CORE_ONE_LINE})
    assert validate_repo(fork, profile="core").ok
    report = validate_repo(fork, profile="strict")
    missing = [f for f in report.errors if f.rule is Rule.MISSING_REQUIRED_IMPORT]
    assert [f.path for f in missing] == [CHUNK] * 7
    assert {f.message.split("`")[1] for f in missing} == {
        "import torch",
        "import torch.nn.functional as F",
        "import triton",
        "import triton.language as tl",
        "from fla.ops.utils.index import prepare_chunk_indices",
        "from fla.ops.quasar.forward_substitution import forward_substitution_kernel",
        "from fla.utils import IS_AMD",
    }


@pytest.mark.parametrize(
    "source",
    [
        CORE_ONE_LINE,
        "from fla.utils import autocast_custom_bwd as bwd, autocast_custom_fwd as fwd\n"
        "from fla.utils import autotune_cache_kwargs, check_shared_mem\nfrom fla.utils import input_guard as guard\n",
        "from ...utils import autocast_custom_bwd, autocast_custom_fwd, autotune_cache_kwargs\n"
        "from fla.utils import check_shared_mem, input_guard\n",
        "try:\n" + textwrap.indent(CORE_ONE_LINE, "    ") + "except ImportError:\n    raise\n",
        "import sys\nif sys.version_info >= (3, 8):\n" + textwrap.indent(CORE_ONE_LINE, "    "),
    ],
    ids=["combined", "aliases", "relative", "module-level-try", "module-level-if"],
)
def test_required_imports_that_count(source):
    assert check_required_imports(source, "fla.ops.quasar.chunk", CHUNK, "core") == []


@pytest.mark.parametrize(
    ("source", "line"),
    [
        (CORE_ONE_LINE.replace("input_guard", "other"), None),
        (CORE_ONE_LINE.replace("input_guard", "other") + "def f():\n    from fla.utils import input_guard\n", 4),
        (CORE_ONE_LINE.replace("input_guard", "other") + "class C:\n    from fla.utils import input_guard\n", 4),
        (CORE_ONE_LINE.replace("input_guard", "other") + "S = 'from fla.utils import input_guard'\n", None),
        (CORE_ONE_LINE.replace("input_guard", "other") + "# from fla.utils import input_guard\n", None),
        (CORE_ONE_LINE.replace("input_guard", "other") + "import fla.utils\n", None),
        (CORE_ONE_LINE.replace("input_guard", "other") + "from fla.utils import *\n", None),
        (
            CORE_ONE_LINE.replace("input_guard", "other")
            + "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fla.utils import input_guard\n",
            5,
        ),
        (
            CORE_ONE_LINE.replace("input_guard", "other")
            + "try:\n    pass\nexcept ImportError:\n    from fla.utils import input_guard\n",
            6,
        ),
    ],
    ids=[
        "absent",
        "in-function",
        "in-class",
        "in-string",
        "in-comment",
        "module-only",
        "star",
        "type-checking",
        "except",
    ],
)
def test_required_imports_that_do_not_count(source, line):
    findings = check_required_imports(source, "fla.ops.quasar.chunk", CHUNK, "core")
    assert [(f.rule, f.line) for f in findings] == [(Rule.MISSING_REQUIRED_IMPORT, line)]
    assert "`from fla.utils import input_guard`" in findings[0].message


def test_strict_accepts_equivalent_module_imports():
    source = STRICT_CHUNK.replace("import torch.nn.functional as F", "from torch.nn import functional").replace(
        "import triton.language as tl", "from triton import language"
    )
    assert check_required_imports(source, "fla.ops.quasar.chunk", CHUNK, "strict") == []


def test_unknown_profile_is_refused(tmp_path):
    refusal = "unknown profile 'loose'; choose one of core, strict"
    with pytest.raises(ValueError, match=refusal):
        validate_repo(make_fork(tmp_path), profile="loose")
    with pytest.raises(ValueError, match=refusal):
        check_required_imports(STRICT_CHUNK, "fla.ops.quasar.chunk", CHUNK, "loose")
