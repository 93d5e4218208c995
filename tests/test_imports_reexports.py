"""The index of re-exports (quasar/imports/reexports.py): names that a module of the fork binds from
gla/kda, followed through chains of imports and ``*`` imports, whatever the fork's own cycles."""

from __future__ import annotations

from quasar.imports.findings import Rule
from quasar.imports.forbidden_imports import check_source
from quasar.imports.reexports import ReexportIndex
from tests.import_forks import CHUNK


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
