"""The fork corpus of the import validator's tests (tests/test_imports_*.py): a small clean fork,
and helpers that change one thing in it and check the report.

The fork has the five target files with the strict-profile imports, the layer, and a fake ``fla``
package with gla/kda beside quasar. A snippet marks with ``# <-`` each line a finding must point at.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from quasar.imports import ImportReport, Rule, validate_repo

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

# The core profile's five names, imported on one combined line.
CORE_ONE_LINE = (
    "from fla.utils import (autocast_custom_bwd, autocast_custom_fwd, autotune_cache_kwargs,\n"
    "                       check_shared_mem, input_guard)\n"
)

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
    """The 1-based numbers of the lines of ``text`` that carry the mark."""
    return [number for number, line in enumerate(text.splitlines(), start=1) if MARK in line]


def error_keys(report: ImportReport) -> set[tuple[str, int | None, Rule]]:
    """The report's errors as (path, line, rule), messages aside."""
    return {(f.path, f.line, f.rule) for f in report.errors}


def check_one_change(tmp_path: Path, relative: str, snippet: str, rule: Rule) -> ImportReport:
    """Put ``snippet`` into ``relative`` of a clean fork; the errors are exactly the marked lines."""
    text = FORK_FILES.get(relative, "") + textwrap.dedent(snippet)
    report = validate_repo(make_fork(tmp_path, {relative: text}))
    expected = {(relative, line, rule) for line in marked_lines(text)}
    assert expected, "the snippet marks no line"
    assert error_keys(report) == expected, "\n".join(map(str, report.errors))
    assert not report.ok
    return report
