"""Import validator: a corpus of small fork trees, clean and adversarial, checked by parsing.

Each test builds a fork in tmp_path (the five target files with the strict-profile imports, the
layer, a fake ``fla`` package with gla/kda beside quasar), changes one thing, and checks the
report names the right file, line and rule. A reference test executes random import statements
for real in a subprocess and compares what got loaded with the static verdict.
"""

from __future__ import annotations

import json
import os
import py_compile
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quasar import imports
from quasar.imports import Finding, ReexportIndex, Rule, check_required_imports, check_source, validate_repo

ROOT = Path(__file__).resolve().parents[1]
CHUNK = "fla/ops/quasar/chunk.py"
LAYER = "fla/layers/quasar.py"
MARK = "# <-"  # marks the line a finding must point at (a comment: the validator ignores it)

STRICT_CHUNK = '''\
"""Chunked QuasarAttention (test fixture)."""
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fla.ops.utils.index import prepare_chunk_indices
from fla.ops.quasar.forward_substitution import forward_substitution_kernel
from fla.utils import IS_AMD
from fla.utils import autocast_custom_bwd
from fla.utils import autocast_custom_fwd
from fla.utils import autotune_cache_kwargs
from fla.utils import check_shared_mem
from fla.utils import input_guard

BS_LIST = [32, 64] if check_shared_mem() else [16, 32]
NUM_WARPS = [2, 4] if IS_AMD else [4, 8]


@input_guard
def chunk_quasar(q, k, v, beta, **kwargs):
    used = (F, tl, triton, torch, prepare_chunk_indices, forward_substitution_kernel)
    return q, used, autocast_custom_bwd, autocast_custom_fwd, autotune_cache_kwargs
'''

FORK_FILES = {
    "fla/__init__.py": "",
    "fla/utils.py": (
        "IS_AMD = False\n"
        "autotune_cache_kwargs = {}\n"
        "def autocast_custom_bwd(f): return f\n"
        "def autocast_custom_fwd(f): return f\n"
        "def check_shared_mem(): return True\n"
        "def input_guard(f): return f\n"
    ),
    "fla/ops/__init__.py": "from .gla import chunk_gla\nfrom .kda import chunk_kda as chunk_kda\n",
    "fla/ops/gla/__init__.py": "def chunk_gla(): return 'gla'\nhelper = 1\n",
    "fla/ops/gla/chunk.py": "helper = 1\n",
    "fla/ops/kda/__init__.py": "def chunk_kda(): return 'kda'\nhelper = 1\n",
    "fla/ops/kda/chunk.py": "from fla.ops.kda import chunk_kda\nhelper = 1\n",
    "fla/ops/gla_utils.py": "helper = 1\n",
    "fla/ops/kda_like.py": "helper = 1\n",
    "fla/ops/utils/__init__.py": "helper = 1\n",
    "fla/ops/utils/index.py": "def prepare_chunk_indices(cu_seqlens, chunk_size): return None\nhelper = 1\n",
    "fla/ops/quasar/__init__.py": "from .chunk import chunk_quasar\nhelper = 1\n",
    CHUNK: STRICT_CHUNK,
    "fla/ops/quasar/chunk_intra_token_parallel.py": "import torch\nimport triton\n\n\ndef intra(x):\n    return x\n",
    "fla/ops/quasar/forward_substitution.py": (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def forward_substitution_kernel(L_ptr, A_ptr, BT: tl.constexpr):\n    pass\n"
    ),
    "fla/ops/quasar/fused_recurrent.py": "import torch\n\n\ndef fused_recurrent_quasar(q):\n    return q\n",
    "fla/ops/quasar/gate.py": '"""Gate; see `from fla.ops.kda import x` in old docs."""\nimport torch\nhelper = 1\n',
    "fla/ops/quasar/quasar_stub.cu": "__global__ void quasar_stub() {}\n",
    "fla/layers/__init__.py": "",
    LAYER: "from fla.ops.quasar import chunk_quasar\n\n\nclass QuasarAttention:\n    mode = 'chunk'\n",
}


def make_fork(root: Path, overrides: dict[str, str | None] | None = None) -> Path:
    """Write the clean fork under ``root``; ``overrides`` replace files (None deletes one)."""
    files = {**FORK_FILES, **(overrides or {})}
    for relative, text in files.items():
        if text is None:
            continue
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def marked_lines(text: str) -> list[int]:
    return [number for number, line in enumerate(text.splitlines(), start=1) if MARK in line]


def error_keys(report) -> set[tuple[str, int | None, Rule]]:
    return {(f.path, f.line, f.rule) for f in report.errors}


def check_one_change(tmp_path: Path, relative: str, snippet: str, rule: Rule, append: bool = True):
    """Put ``snippet`` into ``relative`` of a clean fork; the errors are exactly the marked lines."""
    base = FORK_FILES.get(relative, "") if append else ""
    text = base + textwrap.dedent(snippet)
    report = validate_repo(make_fork(tmp_path, {relative: text}))
    expected = {(relative, line, rule) for line in marked_lines(text)}
    assert expected, "the snippet marks no line"
    assert error_keys(report) == expected, "\n".join(map(str, report.errors))
    assert not report.ok
    return report


# --- the clean fork ---------------------------------------------------------------------------------


def test_clean_fork_passes_both_profiles(tmp_path):
    fork = make_fork(tmp_path)
    for profile in ("core", "strict"):
        report = validate_repo(fork, profile=profile, require_cu=True)
        assert report.ok, report.errors
        assert report.errors == () and report.warnings == ()
    assert set(report.checked_files) >= {CHUNK, LAYER, "fla/ops/quasar/gate.py", "fla/ops/quasar/__init__.py"}


# --- forbidden imports in every form ------------------------------------------------------------------

FORBIDDEN_CASES = {
    "import": "import fla.ops.gla  # <-\n",
    "import-submodule": "import fla.ops.kda.chunk  # <-\n",
    "import-as": "import fla.ops.kda as k  # <-\n",
    "import-among-others": "import os, fla.ops.gla, sys  # <-\n",
    "from-import": "from fla.ops.gla import chunk_gla  # <-\n",
    "from-submodule-import": "from fla.ops.kda.chunk import helper  # <-\n",
    "from-ops-import-kda": "from fla.ops import kda  # <-\n",
    "from-ops-import-gla-as": "from fla.ops import gla as g  # <-\n",
    "from-ops-import-together": "from fla.ops import (  # <-\n    utils,\n    kda,\n)\n",
    "relative-parent": "from .. import kda  # <-\n",
    "relative-sibling-package": "from ..gla import chunk_gla  # <-\n",
    "relative-submodule": "from ..kda.chunk import helper  # <-\n",
    "relative-from-top": "from ...ops.kda import chunk_kda  # <-\n",
    "reexported-name": "from fla.ops import chunk_kda  # <-\n",
    "reexported-name-relative": "from .. import chunk_gla as cg  # <-\n",
    "star-from-reexporting-package": "from fla.ops import *  # <-\n",
    "star-dynamic": "__import__('fla.ops', fromlist=['*'])  # <-\n",
    "inside-function": "def f():\n    from fla.ops.kda import chunk_kda  # <-\n    return chunk_kda()  # <-\n",
    "inside-class": "class C:\n    import fla.ops.gla as backend  # <-\n",
    "type-checking-block": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fla.ops.gla import x  # <-\n",
    "try-except": "try:\n    import fla.ops.kda  # <-\nexcept ImportError:\n    pass\n",
    "importlib": "import importlib\nimportlib.import_module('fla.ops.kda')  # <-\n",
    "importlib-concat": "import importlib\nmod = importlib.import_module('fla.ops.' + 'kda')  # <-\n",
    "importlib-fstring": "import importlib\nimportlib.import_module(f\"{'fla'}.ops.{'gla'}\")  # <-\n",
    "importlib-join": "import importlib\nimportlib.import_module('.'.join(['fla', 'ops', 'kda']))  # <-\n",
    "importlib-relative": "import importlib\nimportlib.import_module('.kda', 'fla.ops')  # <-\n",
    "importlib-keyword": "import importlib\nimportlib.import_module(name='fla.ops.gla.chunk')  # <-\n",
    "import-module-alias": "from importlib import import_module as im\nim('fla.ops.gla')  # <-\n",
    "import-module-assigned": "import importlib\nload = importlib.import_module\nload('fla.ops.kda')  # <-\n",
    "dunder-import": "__import__('fla.ops.kda')  # <-\n",
    "dunder-import-fromlist": "__import__('fla.ops', fromlist=['gla'])  # <-\n",
    "dunder-import-relative": "__import__('', globals(), None, ['kda'], 2)  # <-\n",
    "dunder-import-attribute": "__import__('fla').ops.kda  # <-\n",
    "builtins-import": "import builtins\nbuiltins.__import__('fla.ops.kda')  # <-\n",
    "importlib-dunder-import": "import importlib\nimportlib.__import__('fla.ops.gla')  # <-\n",
    "globals-builtins": "globals()['__builtins__']['__import__']('fla.ops.kda')  # <-\n",
    "find-spec": "import importlib.util\nimportlib.util.find_spec('fla.ops.kda')  # <-\n",
    "attribute-path": "import fla.ops\nfla.ops.kda.chunk_kda()  # <-\n",
    "attribute-via-from": "from fla import ops\nops.gla  # <-\n",
    "getattr-constant": "import fla.ops\nbackend = getattr(fla.ops, 'kd' + 'a')  # <-\n",
    "sys-modules": "import sys\nsys.modules['fla.ops.kda']  # <-\n",
    "file-loader": (
        "import importlib.util\nimport os\n"
        "spec = importlib.util.spec_from_file_location(  # <-\n"
        "    'k', os.path.join(os.path.dirname(__file__), '..', 'kda', 'chunk.py'))\n"
    ),
}


@pytest.mark.parametrize("snippet", FORBIDDEN_CASES.values(), ids=FORBIDDEN_CASES.keys())
def test_forbidden_import_in_chunk(tmp_path, snippet):
    report = check_one_change(tmp_path, CHUNK, snippet, Rule.FORBIDDEN_IMPORT)
    message = str(report.errors[0])
    assert message.startswith(f"{CHUNK}:{marked_lines(FORK_FILES[CHUNK] + snippet)[0]}: forbidden-import:")
    assert "fla.ops.kda" in message or "fla.ops.gla" in message


@pytest.mark.parametrize(
    "relative",
    [
        "fla/ops/quasar/gate.py",
        "fla/ops/quasar/fused_recurrent.py",
        "fla/ops/quasar/__init__.py",
        "fla/ops/quasar/helpers.py",
        "fla/ops/quasar/kernels/deep/extra.py",
        LAYER,
    ],
)
def test_forbidden_import_in_every_checked_file(tmp_path, relative):
    check_one_change(tmp_path, relative, "from fla.ops.kda import chunk_kda  # <-\n", Rule.FORBIDDEN_IMPORT)


def test_relative_import_from_the_layer_resolves_against_fla_layers(tmp_path):
    check_one_change(tmp_path, LAYER, "from ..ops import gla  # <-\n", Rule.FORBIDDEN_IMPORT)


def test_files_outside_the_checked_set_are_not_checked(tmp_path):
    # fla/ops/__init__.py and fla/ops/kda/chunk.py import kda themselves; that is upstream's business.
    report = validate_repo(make_fork(tmp_path, {"fla/models/other.py": "import fla.ops.kda\n"}))
    assert report.ok, report.errors


def test_the_message_names_file_line_rule_and_statement(tmp_path):
    text = FORK_FILES[CHUNK] + "from fla.ops import kda\n"
    report = validate_repo(make_fork(tmp_path, {CHUNK: text}))
    line = len(text.splitlines())
    assert [str(f) for f in report.errors] == [
        f"{CHUNK}:{line}: forbidden-import: forbidden import of fla.ops.kda (`from fla.ops import kda`)"
    ]


# --- what cannot be verified -------------------------------------------------------------------------

UNVERIFIABLE_CASES = {
    "importlib-variable": "import importlib\nname = 'fla.ops.kda'\nimportlib.import_module(name)  # <-\n",
    "importlib-computed": "import importlib\nimportlib.import_module('fla.ops.' + 'kda'.upper())  # <-\n",
    "importlib-relative-variable-package": "import importlib\nimportlib.import_module('..kda', __package__)  # <-\n",
    "importlib-star-args": "import importlib\nargs = ['fla.ops.kda']\nimportlib.import_module(*args)  # <-\n",
    "dunder-import-variable": "def load(name):\n    return __import__(name)  # <-\n",
    "dunder-import-fromlist-variable": "items = ['kda']\n__import__('fla.ops', fromlist=items)  # <-\n",
    "exec": "exec('from fla.ops import kda')  # <-\n",
    "eval": "value = eval('1 + 1')  # <-\n",
    "compile": "code = compile('import fla', 'x', 'exec')  # <-\n",
    "exec-via-getattr": "import builtins\ngetattr(builtins, 'ex' + 'ec')('x = 1')  # <-\n",
    "sys-path-insert": "import sys\nsys.path.insert(0, 'fla/ops')  # <-\nimport kda\n",
    "sys-path-assign": "import sys\nsys.path = ['fla/ops'] + sys.path  # <-\n",
    "sys-modules-assign": "import sys\nsys.modules['x'] = sys  # <-\n",
    "sys-modules-values": "import sys\nmods = list(sys.modules.values())  # <-\n",
    "sys-modules-computed": "import sys\nkey = 'fla.ops.kda'\nsys.modules[key]  # <-\n",
    "getattr-computed": "import fla.ops\nname = 'kda'\ngetattr(fla.ops, name)  # <-\n",
    "getattribute-computed": "import fla.ops\nname = 'kda'\nfla.ops.__getattribute__(name)  # <-\n",
    "module-passed-on": "import inspect\nimport fla.ops\ninspect.getmembers(fla.ops)  # <-\n",
    "importer-passed-on": "import importlib\nmods = list(map(importlib.import_module, ['os']))  # <-\n",
    "importer-in-class-attribute": "import importlib\nclass Loader:\n    load = importlib.import_module  # <-\n",
    "machinery": "from importlib.machinery import PathFinder\nPathFinder.find_spec('kda', ['fla/ops'])  # <-\n",
    "pkgutil": "import pkgutil\nlist(pkgutil.walk_packages(['fla/ops']))  # <-\n",
    "file-loader-variable": "import importlib.util\np = 'x.py'\nimportlib.util.spec_from_file_location('m', p)  # <-\n",
    "subclasses": "loaders = ().__class__.__base__.__subclasses__()  # <-\n",
    "frame-globals": "import sys\nsys._getframe().f_globals  # <-\n",
    "builtins-assign": "import builtins\nbuiltins.__import__ = print  # <-\n",
    "setattr-builtins": "import builtins\nsetattr(builtins, 'x', 1)  # <-\n",
    "marshal": "import marshal\nmarshal.loads(b'')  # <-\n",
}


@pytest.mark.parametrize("snippet", UNVERIFIABLE_CASES.values(), ids=UNVERIFIABLE_CASES.keys())
def test_unverifiable_code_is_an_error(tmp_path, snippet):
    report = check_one_change(tmp_path, CHUNK, snippet, Rule.UNVERIFIABLE_IMPORT)
    assert "cannot be verified" in report.errors[0].message


def test_relative_import_above_the_top_level_package(tmp_path):
    check_one_change(tmp_path, CHUNK, "from .... import anything  # <-\n", Rule.BAD_RELATIVE_IMPORT)


# --- look-alikes and ordinary code that must pass -------------------------------------------------------

PASSING_SNIPPETS = {
    "gla-utils": "import fla.ops.gla_utils\nfrom fla.ops.gla_utils import helper\n",
    "from-ops-lookalikes": "from fla.ops import gla_utils, kda_like as gla\ngla.helper\n",
    "comment": "# from fla.ops.kda import x\n# import fla.ops.gla\n",
    "strings-and-docstrings": (
        "def f():\n    '''Uses `from fla.ops.gla import chunk_gla` in the paper.'''\n"
        "    return 'import fla.ops.kda; __import__(\"fla.ops.gla\")'\n"
    ),
    "quasar-gla-module": "from . import gate as gla\nfrom fla.ops.quasar import gate\n",
    "star-from-clean-module": "from fla.ops.utils.index import *\nfrom fla.utils import *\n",
    "local-names": "kda = 1\ngla = kda + 1\n\n\ndef f(kda):\n    return kda.gla\n",
    "constant-dynamic-imports": (
        "import importlib\nimport importlib.metadata\n"
        "cuda = importlib.import_module('fla.ops.quasar.' + 'gate')\n"
        "version = importlib.metadata.version('torch')\n"
    ),
    "ordinary-dynamic-code": (
        "import re\nimport torch\nfast = torch.compile(lambda x: x)\npattern = re.compile('x')\n"
        "name = 'float16'\ndtype = getattr(torch, name)\ncfg = {}\nvalue = cfg.get(name)\n"
    ),
    "extension-loader": (
        "import importlib.util\nimport os\n"
        "spec = importlib.util.spec_from_file_location(\n"
        "    'chunk_cuda', os.path.join(os.path.dirname(__file__), 'chunk_cuda.so'))\n"
        "module = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(module)\n"
    ),
    "sys-modules-read": "import sys\nloaded = 'fla.ops.quasar' in sys.modules\nsys.modules.get('torch')\n",
    "optional-import": "try:\n    import chunk_cuda_ext as ext\nexcept ImportError:\n    ext = None\n",
}


@pytest.mark.parametrize("snippet", PASSING_SNIPPETS.values(), ids=PASSING_SNIPPETS.keys())
def test_look_alikes_pass(tmp_path, snippet):
    report = validate_repo(make_fork(tmp_path, {CHUNK: FORK_FILES[CHUNK] + snippet}), profile="strict")
    assert report.ok, "\n".join(map(str, report.errors))


# --- required imports ---------------------------------------------------------------------------------

CORE_ONE_LINE = (
    "from fla.utils import (autocast_custom_bwd, autocast_custom_fwd, autotune_cache_kwargs,\n"
    "                       check_shared_mem, input_guard)\n"
)


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


def test_required_imports_elsewhere_do_not_count(tmp_path):
    gate = FORK_FILES["fla/ops/quasar/gate.py"] + CORE_ONE_LINE
    report = validate_repo(make_fork(tmp_path, {CHUNK: "import torch\n", "fla/ops/quasar/gate.py": gate}))
    assert {(f.path, f.rule) for f in report.errors} == {(CHUNK, Rule.MISSING_REQUIRED_IMPORT)}
    assert len(report.errors) == 5


def test_unknown_profile_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown profile 'loose'"):
        validate_repo(make_fork(tmp_path), profile="loose")


# --- files: missing, broken, linked, shadowed ------------------------------------------------------------


@pytest.mark.parametrize("name", imports.TARGET_FILES)
def test_each_missing_target_is_named(tmp_path, name):
    relative = f"fla/ops/quasar/{name}"
    report = validate_repo(make_fork(tmp_path, {relative: None}))
    assert [str(f) for f in report.errors] == [f"{relative}: missing-file: is missing"]


def test_missing_layer_file(tmp_path):
    report = validate_repo(make_fork(tmp_path, {LAYER: None}))
    assert error_keys(report) == {(LAYER, None, Rule.MISSING_FILE)}


def test_missing_quasar_folder_names_all_five(tmp_path):
    overrides = {f"fla/ops/quasar/{name}": None for name in imports.TARGET_FILES}
    overrides.update({"fla/ops/quasar/__init__.py": None, "fla/ops/quasar/quasar_stub.cu": None})
    report = validate_repo(make_fork(tmp_path, overrides))
    assert {f.path for f in report.errors} == {f"fla/ops/quasar/{name}" for name in imports.TARGET_FILES}


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


def test_utf8_cookie_and_bom_are_fine(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": "# -*- coding: utf-8 -*-\nx = 'é'\n"})
    (fork / "fla/ops/quasar/fused_recurrent.py").write_bytes(b"\xef\xbb\xbfimport torch\n")
    assert validate_repo(fork).ok


def test_invalid_utf8_names_file_and_line(tmp_path):
    fork = make_fork(tmp_path)
    (fork / "fla/ops/quasar/gate.py").write_bytes(b"import torch\n\nx = '\xff'\n")
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", 3, Rule.ENCODING)}
    assert "0xff" in report.errors[0].message


def test_symlink_outside_the_repo_is_reported_and_not_followed(tmp_path):
    outside = tmp_path / "outside.py"
    outside.write_text("import fla.ops.kda\n")
    fork = make_fork(tmp_path / "fork", {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").symlink_to(outside)
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", None, Rule.SYMLINK_OUTSIDE_REPO)}


def test_symlinked_folder_outside_the_repo(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.py").write_text("import fla.ops.kda\n")
    fork = make_fork(tmp_path / "fork")
    (fork / "fla/ops/quasar/vendored").symlink_to(tmp_path / "elsewhere")
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/vendored", None, Rule.SYMLINK_OUTSIDE_REPO)}


def test_symlink_into_kda_is_a_forbidden_import(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").symlink_to(fork / "fla/ops/kda/chunk.py")
    (fork / "fla/ops/quasar/kernels").symlink_to(Path("../gla"))
    report = validate_repo(fork)
    assert error_keys(report) == {
        ("fla/ops/quasar/gate.py", None, Rule.FORBIDDEN_IMPORT),
        ("fla/ops/quasar/kernels", None, Rule.FORBIDDEN_IMPORT),
    }


def test_symlink_inside_the_repo_is_read_and_checked_as_the_linking_module(tmp_path):
    fork = make_fork(tmp_path, {"fla/shared/impl.py": "import torch\n"})
    (fork / "fla/ops/quasar/impl.py").symlink_to(fork / "fla/shared/impl.py")
    report = validate_repo(fork)
    assert "fla/ops/quasar/impl.py" in report.checked_files and report.ok
    # As fla.ops.quasar.impl, `from ..kda` is fla.ops.kda (as fla.shared.impl it would not be).
    (fork / "fla/shared/impl.py").write_text("from ..kda import chunk_kda\n")
    assert error_keys(validate_repo(fork)) == {("fla/ops/quasar/impl.py", 1, Rule.FORBIDDEN_IMPORT)}


def test_target_that_is_a_folder(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": None})
    (fork / "fla/ops/quasar/gate.py").mkdir()
    report = validate_repo(fork)
    assert error_keys(report) == {("fla/ops/quasar/gate.py", None, Rule.UNREADABLE_FILE)}


def test_oversized_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(imports.repository, "MAX_SOURCE_BYTES", 100)
    report = validate_repo(make_fork(tmp_path))
    assert (CHUNK, None, Rule.UNREADABLE_FILE) in error_keys(report)


@pytest.mark.parametrize(
    "shadow",
    [
        "fla/ops/quasar/chunk/__init__.py",
        "fla/ops/quasar/chunk.cpython-311-x86_64-linux-gnu.so",
        "fla/ops/quasar/chunk.so",
    ],
)
def test_module_shadowing_the_checked_source(tmp_path, shadow):
    report = validate_repo(make_fork(tmp_path, {shadow: ""}))
    assert (CHUNK, None, Rule.SHADOWED_SOURCE) in error_keys(report)
    assert all(f.rule is Rule.SHADOWED_SOURCE for f in report.errors)


def test_quasar_module_beats_a_namespace_quasar_folder(tmp_path):
    report = validate_repo(make_fork(tmp_path, {"fla/ops/quasar/__init__.py": None, "fla/ops/quasar.py": ""}))
    assert error_keys(report) == {("fla/ops/quasar", None, Rule.SHADOWED_SOURCE)}


def test_bytecode_without_source_and_unchecked_pyc(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/evil_src.py": "import fla.ops.kda\n"})
    source = fork / "fla/ops/quasar/evil_src.py"
    py_compile.compile(str(source), cfile=str(fork / "fla/ops/quasar/evil.pyc"))
    cache = fork / "fla/ops/quasar/__pycache__"
    unchecked = py_compile.PycInvalidationMode.UNCHECKED_HASH
    py_compile.compile(str(source), cfile=str(cache / "gate.cpython-311.pyc"), invalidation_mode=unchecked)
    py_compile.compile(str(source), cfile=str(cache / "chunk.cpython-311.pyc"))  # timestamp-checked: harmless
    source.unlink()
    report = validate_repo(fork)
    assert error_keys(report) == {
        ("fla/ops/quasar/evil.pyc", None, Rule.UNVERIFIABLE_IMPORT),
        ("fla/ops/quasar/__pycache__/gate.cpython-311.pyc", None, Rule.UNVERIFIABLE_IMPORT),
    }


# --- the .cu file ---------------------------------------------------------------------------------


def test_cu_file_warning_by_default_error_when_required(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/quasar_stub.cu": None})
    report = validate_repo(fork)
    assert report.ok and [str(f) for f in report.warnings] == [".: no-cu-file: the repository has no *.cu file"]
    required = validate_repo(fork, require_cu=True)
    assert not required.ok and [f.rule for f in required.errors] == [Rule.NO_CU_FILE]
    (fork / "csrc").mkdir()
    (fork / "csrc" / "kernel.cu").write_text("")
    assert validate_repo(fork, require_cu=True).ok


def test_cu_file_in_git_folder_or_linked_from_outside_does_not_count(tmp_path):
    (tmp_path / "outside.cu").write_text("")
    fork = make_fork(tmp_path / "fork", {"fla/ops/quasar/quasar_stub.cu": None, ".git/hooks/x.cu": ""})
    (fork / "linked.cu").symlink_to(tmp_path / "outside.cu")
    assert not validate_repo(fork, require_cu=True).ok


# --- the pure function ---------------------------------------------------------------------------


def test_check_source_reports_each_line_once_and_in_order():
    source = "import fla.ops.gla\n\nfrom fla.ops import kda\nkda.chunk_kda()\nexec('x')\n"
    findings = check_source(source, "fla.ops.quasar.chunk", CHUNK)
    assert [(f.line, f.rule) for f in findings] == [
        (1, Rule.FORBIDDEN_IMPORT),
        (3, Rule.FORBIDDEN_IMPORT),
        (4, Rule.FORBIDDEN_IMPORT),
        (5, Rule.UNVERIFIABLE_IMPORT),
    ]
    assert all(isinstance(f, Finding) and f.path == CHUNK for f in findings)


def test_reexports_follow_chains_and_star_imports():
    index = ReexportIndex.from_files(
        {
            "fla/ops/__init__.py": "from .common import *\nfrom .utils import tools\n",
            "fla/ops/common/__init__.py": "from fla.ops.common.impl import fast\n",
            "fla/ops/common/impl.py": "from ..kda import chunk_kda as fast\n",
            "fla/ops/utils/__init__.py": "def tools(): pass\n",
            "fla/ops/utils/tools.py": "",
        }
    )
    assert index.root_of("fla.ops.fast") == "fla.ops.kda"
    assert index.root_of("fla.ops.common.fast.__call__") == "fla.ops.kda"
    assert index.root_of("fla.ops.tools") is None
    assert index.root_of("torch.nn") is None
    assert index.star_root("fla.ops") == "fla.ops.kda"
    assert index.star_root("fla.ops.utils") is None
    findings = check_source("from fla.ops import fast\n", "fla.ops.quasar.chunk", CHUNK, index)
    assert [f.rule for f in findings] == [Rule.FORBIDDEN_IMPORT]
    assert "fla.ops.fast comes from fla.ops.kda" in findings[0].message


def test_module_names_and_relative_resolution():
    assert imports.module_name_for("fla/ops/quasar/chunk.py") == "fla.ops.quasar.chunk"
    assert imports.module_name_for("fla/ops/quasar/__init__.py") == "fla.ops.quasar"
    assert imports.resolve_relative(None, 2, "fla.ops.quasar.chunk", False) == "fla.ops"
    assert imports.resolve_relative("kda", 2, "fla.ops.quasar", True) == "fla.ops.kda"
    assert imports.resolve_relative("x", 4, "fla.ops.quasar.chunk", False) is None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(
        st.text(max_size=300),
        st.lists(
            st.sampled_from(STRICT_CHUNK.splitlines(keepends=True) + list(FORBIDDEN_CASES.values())), max_size=30
        ).map("".join),
    )
)
def test_check_source_never_raises(text):
    for finding in check_source(text, "fla.ops.quasar.chunk", CHUNK):
        assert finding.path == CHUNK and isinstance(finding.rule, Rule)


def test_pathologically_nested_source_is_a_finding():
    deep = "x = " + "+".join(["'a'"] * 5000) + "\nimport importlib\nimportlib.import_module(x)\n"
    findings = check_source(deep, "fla.ops.quasar.chunk", CHUNK)
    assert findings and all(f.rule in (Rule.UNVERIFIABLE_IMPORT, Rule.SYNTAX_ERROR) for f in findings)


# --- the static verdict against what Python really imports ------------------------------------------

REFERENCE_MODULES = [
    "fla", "fla.ops", "fla.ops.gla", "fla.ops.gla.chunk", "fla.ops.kda", "fla.ops.kda.chunk",
    "fla.ops.gla_utils", "fla.ops.kda_like", "fla.ops.quasar", "fla.ops.quasar.gate",
    "fla.ops.utils", "fla.ops.utils.index", "fla.utils",
]  # fmt: skip

# Runs each statement for real as module fla.ops.quasar.probe of a fake fork, from a clean slate,
# and says whether fla.ops.gla or fla.ops.kda (or a module below them) got loaded.
PROBE = """
import json, sys
sys.path.insert(0, sys.argv[1])
verdicts = []
for statement in json.load(sys.stdin):
    for name in [m for m in sys.modules if m == "fla" or m.startswith("fla.")]:
        del sys.modules[name]
    exec(statement, {"__name__": "fla.ops.quasar.probe", "__package__": "fla.ops.quasar"})
    roots = ("fla.ops.gla", "fla.ops.kda")
    verdicts.append(any(m in roots or m.startswith(tuple(r + "." for r in roots)) for m in sys.modules))
print(json.dumps(verdicts))
"""
# The fake fork for the probe: every module defines `helper`, nothing imports gla/kda by itself.
REFERENCE_FORK = {
    "fla/__init__.py": "helper = 1\n",
    "fla/utils.py": "helper = 1\n",
    "fla/ops/__init__.py": "helper = 1\n",
    "fla/ops/quasar/__init__.py": "helper = 1\n",
    CHUNK: "helper = 1\n",
    "fla/ops/quasar/gate.py": "helper = 1\n",
}


def _split_literal(rng: random.Random, text: str) -> str:
    """``text`` as a constant expression of a random shape the validator must fold."""
    cut = rng.randrange(len(text) + 1)
    head, tail = text[:cut], text[cut:]
    shape = rng.randrange(4)
    if shape == 0:
        return repr(text)
    if shape == 1:
        return f"{head!r} + {tail!r}"
    if shape == 2:
        return f'f"{head}{{{tail!r}}}"'
    return f"'.'.join({text.split('.')!r})"


def _random_statement(rng: random.Random) -> str:
    module = rng.choice(REFERENCE_MODULES)
    parent, _, leaf = module.rpartition(".")
    form = rng.randrange(8)
    if form == 0:
        return f"import {module}"
    if form == 1:
        return f"import {module} as alias"
    if form == 2 and parent:
        return f"from {parent} import {leaf}"
    if form == 3:
        return f"from {module} import helper"
    if form == 4 and parent:
        # Relative to package fla.ops.quasar: one dot is fla.ops.quasar, two fla.ops, three fla.
        bases = {level: ".".join(["fla", "ops", "quasar"][: 4 - level]) for level in (1, 2, 3)}
        level = rng.choice([lvl for lvl, base in bases.items() if parent == base or parent.startswith(base + ".")])
        rest = parent[len(bases[level]) + 1 :]
        return f"from {'.' * level}{rest} import {leaf}"
    if form == 5:
        return f"importlib.import_module({_split_literal(rng, module)})"
    if form == 6 and parent:
        return f"__import__({_split_literal(rng, parent)}, fromlist=[{leaf!r}])"
    return f"__import__({_split_literal(rng, module)})"


def test_static_verdict_matches_real_imports(tmp_path):
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    fork = make_fork(tmp_path, REFERENCE_FORK)
    statements = sorted({_random_statement(rng) for _ in range(160)})
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(fork)],
        input=json.dumps(["import importlib\n" + s for s in statements]),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    loaded = json.loads(probe.stdout)
    index = ReexportIndex.from_files(REFERENCE_FORK)
    for statement, really_loaded in zip(statements, loaded, strict=True):
        findings = check_source(
            "import importlib\n" + statement, "fla.ops.quasar.probe", "fla/ops/quasar/probe.py", index
        )
        assert all(f.rule is Rule.FORBIDDEN_IMPORT for f in findings), (seed, statement, findings)
        assert bool(findings) == really_loaded, f"seed {seed}: {statement!r} loads gla/kda: {really_loaded}"


# --- the command line ------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quasar.imports", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_cli_json_and_exit_codes(tmp_path):
    clean = make_fork(tmp_path / "clean", {"fla/ops/quasar/quasar_stub.cu": None})
    result = run_cli(str(clean), "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload == {"ok": True, "errors": [], "warnings": [".: no-cu-file: the repository has no *.cu file"]}

    result = run_cli(str(clean), "--json", "--require-cu", "--profile", "strict")
    assert result.returncode == 1
    assert json.loads(result.stdout)["errors"] == [".: no-cu-file: the repository has no *.cu file"]

    bad = make_fork(
        tmp_path / "bad", {CHUNK: CORE_ONE_LINE + "import importlib\nimportlib.import_module('fla.ops.' + 'kda')\n"}
    )
    result = run_cli(str(bad), "--json", "--profile", "strict")
    assert result.returncode == 1
    payload = json.loads(result.stdout)
    assert set(payload) == {"ok", "errors", "warnings"} and payload["ok"] is False
    assert any(
        e.startswith(f"{CHUNK}:4: forbidden-import: forbidden dynamic import of fla.ops.kda") for e in payload["errors"]
    )
    assert len(payload["errors"]) == 8  # the dynamic import and the seven strict-only lines
    assert all(isinstance(e, str) and e.startswith(CHUNK) for e in payload["errors"])


def test_cli_human_output_and_usage_errors(tmp_path):
    fork = make_fork(tmp_path, {"fla/ops/quasar/gate.py": "from fla.ops import kda\n"})
    result = run_cli(str(fork))
    assert result.returncode == 1
    assert (
        "FAIL" in result.stdout and "fla/ops/quasar/gate.py:1" in result.stdout and "forbidden-import" in result.stdout
    )
    (fork / "fla/ops/quasar/gate.py").write_text("import torch\n")
    result = run_cli(str(fork))
    assert result.returncode == 0 and "PASS" in result.stdout
    result = run_cli(str(tmp_path / "no-such-repo"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
    assert run_cli().returncode == 2
    assert run_cli(str(fork), "--profile", "loose").returncode == 2
