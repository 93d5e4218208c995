"""The index of re-exports (quasar/imports/reexports.py): names that a module of the fork binds from
gla/kda, followed through chains of imports and ``*`` imports, whatever the fork's own cycles."""

from __future__ import annotations

import time

import pytest

from quasar.imports import MAX_SOURCE_BYTES, validate_repo
from quasar.imports.findings import Rule
from quasar.imports.forbidden_imports import check_source
from quasar.imports.reexports import ReexportIndex
from tests.import_forks import CHUNK, FORK_FILES, error_keys, make_fork, marked_lines


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


def test_reexport_cycles_end():
    # A hostile fork's modules import each other in a ring, and star-import each other: the index
    # must answer, not recurse until the validator crashes.
    index = ReexportIndex.from_files(
        {
            "fla/ops/__init__.py": "from .a import x\nfrom .b import *\n",
            "fla/ops/a.py": "from fla.ops.b import x\nfrom .b import *\n",
            "fla/ops/b.py": "from fla.ops import x\nfrom . import *\nfrom .a import *\n",
        }
    )
    assert index.root_of("fla.ops.x") is None
    assert index.star_root("fla.ops") is None
    assert check_source("from fla.ops import x\nfrom fla.ops.a import *\n", "fla.ops.quasar.chunk", CHUNK, index) == []


# --- names whose value cannot be followed ------------------------------------------------------------

HELPERS = "fla/ops/utils/helpers.py"
IMPORTS_FAST = "from fla.ops.utils.helpers import fast  # <-\nfast()  # <-\n"
FAST_LINES = {(CHUNK, line, Rule.UNVERIFIABLE_IMPORT) for line in marked_lines(FORK_FILES[CHUNK] + IMPORTS_FAST)}

# Each binds `fast` in fla/ops/utils/helpers.py, a module the check does not check, to kda's kernel
# or to the import machinery by something else than an import, a def or a class; chunk.py imports it.
KDA = "importlib.import_module('fla.ops.kda').chunk_kda"
OPAQUE_BINDINGS = {
    "importlib-call": f"import importlib\nfast = {KDA}\n",
    "dunder-import": "fast = __import__('fla.ops.kda', fromlist=['chunk_kda']).chunk_kda\n",
    "getattr-on-fla": "import fla.ops\nfast = getattr(getattr(fla.ops, 'kd' + 'a'), 'chunk_kda')\n",
    "globals": "from fla.ops.kda import chunk_kda as _k\n_k = None\nfast = globals()['_' + 'k']\n",
    "sys-modules": "import sys\nfast = sys.modules['fla.ops.kda'].chunk_kda\n",
    "module-dict": "import fla.ops.utils.index as index\nfast = index.__dict__['prepare_chunk_indices']\n",
    "tuple-target": f"import importlib\nfast, other = {KDA}, 1\n",
    "for-loop": f"import importlib\nfor fast in [{KDA}]:\n    pass\n",
    "except-handler": f"import importlib\ntry:\n    raise ImportError\nexcept ImportError:\n    fast = {KDA}\n",
    "walrus": f"import importlib\n[fast := {KDA} for _ in [0]]\n",
    "rebound": f"fast = 1\nimport importlib\nfast = {KDA}\n",
    "through-a-local-name": "import importlib\n_kda = importlib.import_module('fla.ops.kda')\nfast = _kda.chunk_kda\n",
    "importer-alias": "from importlib import import_module as fast\n",
    "importer-assigned": "import importlib\nfast = importlib.import_module\n",
    "global": f"import importlib\ndef load():\n    global fast\n    fast = {KDA}\nload()\n",
    "module-getattr": f"import importlib\ndef __getattr__(name):\n    return {KDA}\n",
    "match": f"import importlib\nmatch {KDA}:\n    case fast:\n        pass\n",
}


def test_the_reviewers_call_reexport_is_refused(tmp_path):
    # `fast` was recorded as defined by helpers.py: the check passed and ran kda's kernel.
    helpers = "import importlib\nfast = importlib.import_module('fla.ops.kda').chunk_kda\n"
    report = validate_repo(make_fork(tmp_path, {HELPERS: helpers, CHUNK: FORK_FILES[CHUNK] + IMPORTS_FAST}))
    assert error_keys(report) == FAST_LINES
    assert report.errors[0].message == (
        "cannot be verified: the value of fla.ops.utils.helpers.fast cannot be followed: it is bound at "
        f"{HELPERS}:2 through importlib.import_module, which can reach any module at run time "
        "(`from fla.ops.utils.helpers import fast`)"
    )


@pytest.mark.parametrize("helpers", OPAQUE_BINDINGS.values(), ids=OPAQUE_BINDINGS.keys())
def test_a_name_bound_by_what_may_load_a_module_is_refused(tmp_path, helpers):
    fork = make_fork(tmp_path, {HELPERS: helpers, CHUNK: FORK_FILES[CHUNK] + IMPORTS_FAST})
    report = validate_repo(fork)
    assert error_keys(report) == FAST_LINES, "\n".join(map(str, report.errors))
    assert "fla.ops.utils.helpers" in report.errors[0].message


def test_a_name_bound_by_an_expression_over_a_forbidden_name_comes_from_it():
    index = ReexportIndex.from_files(
        {
            "fla/ops/utils/helpers.py": (
                "import torch\nfrom fla.ops.kda import chunk_kda\n"
                "fast = torch.compile(chunk_kda)\n"
                "# a loop of names: whichever is asked first, both come from kda\n"
                "a = b or chunk_kda\nb = a\n"
            ),
        }
    )
    assert index.root_of("fla.ops.utils.helpers.fast") == "fla.ops.kda"
    assert index.root_of("fla.ops.utils.helpers.b") == "fla.ops.kda"
    assert index.root_of("fla.ops.utils.helpers.a") == "fla.ops.kda"
    index = ReexportIndex.from_files(
        {"fla/ops/utils/helpers.py": "from ..kda import chunk_kda\na = b or chunk_kda\nb = a\n"}
    )
    assert index.root_of("fla.ops.utils.helpers.a") == "fla.ops.kda"
    assert index.root_of("fla.ops.utils.helpers.b") == "fla.ops.kda"


def test_a_module_the_check_cannot_read_binds_nothing_it_can_follow(tmp_path):
    # Over MAX_SOURCE_BYTES the module was "not in the fork", so its names passed; Python imports it.
    big = "import importlib\nfast = importlib.import_module('fla.ops.kda').chunk_kda\n" + "#" * MAX_SOURCE_BYTES
    fork = make_fork(tmp_path, {HELPERS: big, CHUNK: FORK_FILES[CHUNK] + IMPORTS_FAST})
    report = validate_repo(fork)
    assert error_keys(report) == FAST_LINES
    assert f"bound in {HELPERS}, which this check cannot read" in report.errors[0].message


def test_a_chain_of_reexports_too_long_to_follow_is_refused():
    # Past 16 steps the index answered "not forbidden"; 20 modules re-exporting kda's kernel got through.
    files = {f"fla/ops/m{i}.py": f"from fla.ops.m{i + 1} import x\n" for i in range(20)}
    files["fla/ops/m20.py"] = "from fla.ops.kda import chunk_kda as x\n"
    findings = check_source(
        "from fla.ops.m0 import x\n", "fla.ops.quasar.chunk", CHUNK, ReexportIndex.from_files(files)
    )
    assert [f.rule for f in findings] == [Rule.UNVERIFIABLE_IMPORT]
    assert "reached through more than 16 names" in findings[0].message


@pytest.mark.timeout(30)
def test_modules_that_star_import_each_other_are_answered_at_once():
    # Each * import was followed again along every path up to 16 deep: 5 modules meant 4**16 steps.
    files = {"fla/ops/__init__.py": ""}
    for i in range(5):
        files[f"fla/ops/m{i}.py"] = "".join(f"from .m{j} import *\n" for j in range(5) if j != i) + "x = 1\n"
    index = ReexportIndex.from_files(files)
    started = time.monotonic()
    assert (
        check_source("from fla.ops.m0 import *\nfrom fla.ops.m1 import x\n", "fla.ops.quasar.chunk", CHUNK, index) == []
    )
    assert time.monotonic() - started < 2


def test_ordinary_definitions_pass(tmp_path):
    # What real fla's modules bind, and what a kernel imports from them, is followed and passes.
    helpers = (
        "import logging, os, functools\nimport torch\nimport triton\nfrom fla.utils import input_guard\n"
        "logger = logging.getLogger(__name__)\n"
        "fast = torch.compile(lambda x: x)\n"
        "device = os.environ.get('DEVICE', 'cuda')\n"
        "device_lib = getattr(torch, device)\n"
        "HAS_GATHER = hasattr(triton.language, 'gather')\n"
        "IS_X = (device == 'cuda') and torch.cuda.is_available()\n"
        "cached = functools.lru_cache(maxsize=None)(input_guard)\n"
        "count = 0\ncount = count + 1\n"
        "try:\n    import einops\nexcept ImportError:\n    einops = None\n"
        "for _name in ('a', 'b'):\n    pass\n"
        "def kernel(x):\n    return x\n"
        "class Cache:\n    pass\n"
        "Alias = Cache\n"
    )
    names = "fast, device, device_lib, HAS_GATHER, IS_X, cached, count, einops, kernel, Cache, Alias, logger"
    chunk = FORK_FILES[CHUNK] + f"from fla.ops.utils.helpers import {names}\n"
    report = validate_repo(make_fork(tmp_path, {HELPERS: helpers, CHUNK: chunk}))
    assert report.ok, "\n".join(map(str, report.errors))


@pytest.mark.parametrize(
    ("planted", "use"),
    [
        ({"kernels_util.py": "from fla.ops.kda import chunk_kda\n"}, "from kernels_util import chunk_kda as out"),
        ({"kernels/util.py": "from fla.ops.kda import chunk_kda\n"}, "from kernels.util import chunk_kda as out"),
        ({"einops/__init__.py": "from fla.ops.kda import chunk_kda as rearrange\n"}, "from einops import rearrange"),
        (
            {"kernels_util.py": "import torch\nfrom fla.ops.kda import chunk_kda\nfast = torch.compile(chunk_kda)\n"},
            "import kernels_util as k\nout = k.fast",
        ),
    ],
)
def test_reexport_through_a_module_of_the_fork_outside_fla(tmp_path, planted, use):
    # The fork's folder is first on the child's path: its top-level modules, and a package of its
    # own named like an installed one, are imported from the fork, and bind what they like.
    text = FORK_FILES[CHUNK] + use + "  # <-\n"
    report = validate_repo(make_fork(tmp_path, {**planted, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.FORBIDDEN_IMPORT) for line in marked_lines(text)}


def test_installed_modules_the_fork_does_not_have_are_not_followed(tmp_path):
    text = FORK_FILES[CHUNK] + "import einops\nfrom kernels_util import helper\nout = einops.rearrange\n"
    assert validate_repo(make_fork(tmp_path, {"kernels_util.py": "helper = 1\n", CHUNK: text})).ok


def test_a_module_with_a_utf7_cookie_hides_nothing_from_the_index(tmp_path):
    # Python decodes the module as utf-7, where `+AAo-` is a line break: what the index read as a
    # comment is `from fla.ops.kda import chunk_kda as pick` to Python.
    helpers = "# coding: utf-7\ndef pick():\n    return 'clean'\n# +AAo-from fla.ops.kda import chunk_kda as pick\n"
    text = FORK_FILES[CHUNK] + "from fla.ops.utils.helpers import pick  # <-\n"
    report = validate_repo(make_fork(tmp_path, {"fla/ops/utils/helpers.py": helpers, CHUNK: text}))
    assert error_keys(report) == {(CHUNK, line, Rule.UNVERIFIABLE_IMPORT) for line in marked_lines(text)}
    assert "utf-7" in report.errors[0].message
