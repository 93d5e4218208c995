"""The stand-ins for fla.ops.gla and fla.ops.kda in the sandbox's copy of a fork
(sandbox_contents.stand_in_forbidden, ops_stand_in.py; docs/rules.md section 4 step 2): the fork's
code cannot reach their kernels by a path the import check does not read, and a real fla tree,
whose modules import them at import time, still imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quasar.evaluate import evaluate
from quasar.evaluate.sandbox_contents import copy_tree
from quasar.imports import validate_repo
from quasar.starter_fork import copy_starter_tree
from tests.evaluate_runs import FAST_CPU, FAST_CUDA
from tests.hostile_forks import ATTACKS, FORK_FILES, write_hostile_fork
from tests.upstream_fork import write_upstream_fork

MESSAGE = "fla.ops.kda is not available to an evaluated fork (docs/rules.md section 4 step 2)"
STAND_IN = (Path(__file__).resolve().parent.parent / "quasar" / "evaluate" / "ops_stand_in.py").read_text()

# Run in the fork's copy, as the child imports it (python -I, the copy first on the path): prints
# what became of the names a real tree and an attacker use, as JSON.
PROBE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
found = {}
for module in sys.argv[2:]:
    __import__(module)
import fla.ops.kda
import fla.ops.kda.chunk
import fla.ops.kda.backends.tilelang.chunk_bwd_dqkg as deep
from fla.ops.kda import *
from fla.ops.kda import chunk_kda, gate
from fla.ops.gla import chunk_gla


class Based(chunk_kda):
    pass


def default(kernel=chunk_gla):
    return kernel


found["kda_file"] = fla.ops.kda.__file__
found["same"] = fla.ops.kda.chunk_kda is chunk_kda
found["deep"] = deep.__name__
found["nested"] = gate.kda_gate_chunk_cumsum.__qualname__
errors = []
for call in (
    lambda: chunk_kda(1),
    lambda: fla.ops.kda.chunk.chunk_kda_fwd[(1,)](2),
    lambda: Based(),
    lambda: default()(3),
    lambda: deep.anything(),
):
    try:
        call()
    except RuntimeError as error:
        errors.append(str(error))
found["errors"] = errors
print("PROBE" + json.dumps(found))
"""


def probe(copy: Path, *modules: str) -> dict:
    """What PROBE finds in the fork's copy ``copy``, after importing ``modules`` of it."""
    done = subprocess.run(
        [sys.executable, "-I", "-c", PROBE, str(copy), *modules],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": os.environ["PATH"], "CUDA_VISIBLE_DEVICES": ""},
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[0][len("PROBE") :])


def assert_stood_in(found: dict, copy: Path) -> None:
    assert found["kda_file"] == str(copy / "fla" / "ops" / "kda" / "__init__.py")
    assert found["same"] and found["deep"] == "fla.ops.kda.backends.tilelang.chunk_bwd_dqkg"
    assert found["nested"] == "kda_gate_chunk_cumsum"
    assert len(found["errors"]) == 5, found["errors"]
    assert all("is not available to an evaluated fork (docs/rules.md section 4 step 2)" in e for e in found["errors"])
    assert found["errors"][0] == f"fla.ops.kda.chunk_kda was called: {MESSAGE}"
    assert found["errors"][3].startswith("fla.ops.gla.chunk_gla was called: fla.ops.gla is not available")


@pytest.mark.slow
def test_a_fork_reaching_kda_through_a_helper_module_fails_at_the_first_call(tmp_path):
    fork = write_hostile_fork(tmp_path / "fork", "kda_through_helper")
    # The import check reads bindings: fast_path() returning kda's chunk_kda passes it.
    assert validate_repo(fork).ok
    report = evaluate(fork, 64, None, FAST_CPU)
    assert report.import_check.ok and report.verdict == "fail", report.reasons
    assert report.lengths["64"].status == "error"
    assert f"fla.ops.kda.chunk_kda was called: {MESSAGE}" in report.reasons[0], report.reasons


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_cuda_an_upstream_tree_reaching_its_real_kda_through_a_helper_fails_at_the_first_call(tmp_path):
    fork = tmp_path / "upstream"
    write_upstream_fork(fork)
    layer = fork / "fla" / "layers" / "quasar.py"
    layer.write_text(layer.read_text() + ATTACKS["kda_through_helper"])
    helper = "fla/modules/kernel_registry.py"
    (fork / helper).write_text(FORK_FILES["kda_through_helper"][helper])
    assert validate_repo(fork).ok
    report = evaluate(fork, 512, None, FAST_CUDA)
    assert report.verdict == "fail" and report.lengths["512"].status == "error", report.reasons
    assert f"fla.ops.kda.chunk_kda was called: {MESSAGE}" in report.reasons[0], report.reasons


@pytest.mark.slow
def test_the_whole_upstream_tree_imports_with_the_stand_ins_and_its_kda_is_out_of_reach(tmp_path):
    fork = tmp_path / "upstream"
    write_upstream_fork(fork)
    copy = tmp_path / "copy"
    copy_tree(fork, copy)
    assert sorted(os.listdir(copy / "fla" / "ops" / "kda")) == ["__init__.py"]
    assert sorted(os.listdir(copy / "fla" / "ops" / "gla")) == ["__init__.py"]
    # Every module of the tree that imports gla or kda at import time imports.
    found = probe(
        copy,
        "fla",
        "fla.layers",
        "fla.models",
        "fla.ops",
        "fla.ops.gsa",
        "fla.ops.gdn2",
        "fla.ops.rwkv6",
        "fla.ops.lightnet",
        "fla.ops.precond_kda",
        "fla.layers.kda",
        "fla.layers.gla",
        "fla.layers.quasar",
    )
    assert_stood_in(found, copy)
    # The rest of the tree is copied as it was.
    for name in ("fla/ops/simple_gla/chunk.py", "fla/ops/quasar/chunk.py", "fla/layers/kda.py"):
        assert (copy / name).read_bytes() == (fork / name).read_bytes()


def test_the_stand_ins_replace_gla_and_kda_whatever_the_fork_has_there(tmp_path):
    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    kda = fork / "fla" / "ops" / "kda"
    (kda / "backends").mkdir(parents=True)
    (kda / "__init__.py").write_text("from fla.ops.kda.chunk import chunk_kda\n")
    (kda / "chunk.py").write_text("def chunk_kda(*a):\n    return 'real kda'\n")
    (kda / "chunk.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (kda / "backends" / "kernel.cu").write_text("// kda")
    (fork / "fla" / "ops" / "own_kda").mkdir()
    (fork / "fla" / "ops" / "own_kda" / "__init__.py").write_text("def chunk_gla(*a):\n    return 'own'\n")
    (fork / "fla" / "ops" / "gla").symlink_to("own_kda")
    # A module file of the name: Python imports the package folder before it.
    (fork / "fla" / "ops" / "kda.py").write_text("def chunk_kda(*a):\n    return 'real kda'\n")
    (fork / "fla" / "ops" / "KDA").mkdir()
    (fork / "fla" / "ops" / "KDA" / "__init__.py").write_text("x = 1\n")
    copy = tmp_path / "copy"
    copy_tree(fork, copy)
    ops = copy / "fla" / "ops"
    assert os.listdir(ops / "kda") == ["__init__.py"] and (ops / "kda" / "__init__.py").read_text() == STAND_IN
    assert not (ops / "gla").is_symlink() and os.listdir(ops / "gla") == ["__init__.py"]
    # Other names, a case variant among them, are the fork's own files, copied as they were.
    assert (ops / "own_kda" / "__init__.py").read_text() == "def chunk_gla(*a):\n    return 'own'\n"
    assert (ops / "KDA" / "__init__.py").read_text() == "x = 1\n"
    assert (ops / "quasar" / "chunk.py").read_bytes() == (fork / "fla" / "ops" / "quasar" / "chunk.py").read_bytes()
    assert_stood_in(probe(copy, "fla.layers.quasar"), copy)


def test_a_fork_without_gla_and_kda_gets_the_stand_ins_and_one_without_fla_ops_gets_none(tmp_path):
    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    assert not (fork / "fla" / "ops" / "kda").exists()
    copy_tree(fork, tmp_path / "copy")
    assert_stood_in(probe(tmp_path / "copy"), tmp_path / "copy")
    bare = tmp_path / "bare"
    (bare / "fla").mkdir(parents=True)
    copy_tree(bare, tmp_path / "bare_copy")
    assert os.listdir(tmp_path / "bare_copy" / "fla") == []


def test_where_fla_ops_is_a_link_in_the_fork_the_stand_ins_are_in_the_folder_it_names(tmp_path):
    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    os.rename(fork / "fla" / "ops", fork / "real_ops")
    (fork / "real_ops" / "kda").mkdir()
    (fork / "real_ops" / "kda" / "__init__.py").write_text("def chunk_kda(*a):\n    return 'real kda'\n")
    (fork / "fla" / "ops").symlink_to("../real_ops")
    copy = tmp_path / "copy"
    copy_tree(fork, copy)
    assert (copy / "fla" / "ops").is_symlink()
    assert (copy / "real_ops" / "kda" / "__init__.py").read_text() == STAND_IN
    found = probe(copy, "fla.layers.quasar")
    assert found["errors"][0] == f"fla.ops.kda.chunk_kda was called: {MESSAGE}"


def test_a_fork_whose_fla_ops_is_a_link_to_its_root_gets_the_stand_ins_at_its_root(tmp_path):
    # fla/ops -> .. makes the fork's root folder fla.ops: its kda/ is fla.ops.kda.
    fork = write_hostile_fork(tmp_path / "fork", "kda_through_helper")
    for entry in os.listdir(fork / "fla" / "ops"):
        os.rename(fork / "fla" / "ops" / entry, fork / entry)
    os.rmdir(fork / "fla" / "ops")
    (fork / "fla" / "ops").symlink_to("..")
    copy = tmp_path / "copy"
    copy_tree(fork, copy)
    assert (copy / "kda" / "__init__.py").read_text() == STAND_IN
    assert probe(copy, "fla.layers.quasar")["errors"][0] == f"fla.ops.kda.chunk_kda was called: {MESSAGE}"
