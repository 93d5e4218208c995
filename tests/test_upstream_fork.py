"""Forks as miners really bring them: upstream flash-linear-attention's whole tree (its ``fla``
imports einops and transformers at ``import fla`` and dozens of modules), built at test time from
the installed upstream packages (tests/upstream_fork.py), through the import validator, the
sandboxed child, the evaluation and step 1, on the CPU. The CUDA half is in
tests/test_upstream_fork_gpu.py.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from quasar.evaluate import SandboxPolicy, evaluate
from quasar.evaluate.environment import EVALUATION_PACKAGES
from quasar.evaluate.report import NEEDS_GPU, SKIPPED
from quasar.evaluate.sandbox import SandboxedChild
from quasar.evaluate.session import missing_module_reason
from quasar.imports import validate_repo
from quasar.starter_fork import copy_starter_tree, kernel_files
from quasar.tools import install_kernel as step1
from tests.evaluate_runs import FAST_CPU
from tests.gitrepo import git
from tests.upstream_fork import upstream_files, write_upstream_fork

pytestmark = pytest.mark.slow

# docs/rules.md section 6: the benchmark layer's parameter count.
LAYER_PARAMETERS = 1_120_840
NEEDS_GPU_LINE = "T=64: the forward needs a CUDA GPU for this fork"
ABSENT_DEPENDENCY = "quasar_absent_dependency"


def tree_digest(repo: Path) -> dict[str, bytes]:
    """Every file of a checkout but .git, with its bytes."""
    return {
        str(p.relative_to(repo)): p.read_bytes()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(repo).parts
    }


@pytest.fixture(scope="module")
def upstream_fork(tmp_path_factory) -> Path:
    fork = tmp_path_factory.mktemp("upstream") / "fork"
    write_upstream_fork(fork)
    return fork


@pytest.fixture(scope="module")
def reports(tmp_path_factory, upstream_fork):
    """The CPU evaluations of this module, run three at a time."""
    base = tmp_path_factory.mktemp("forks")
    absent = base / "absent_dependency"
    copy_starter_tree(absent)
    layer = absent / "fla" / "layers" / "quasar.py"
    layer.write_text(layer.read_text().replace("import torch\n", f"import torch\nimport {ABSENT_DEPENDENCY}\n", 1))
    own_missing = base / "own_module_missing"
    copy_starter_tree(own_missing)
    (own_missing / "fla" / "models" / "utils.py").unlink()
    forks = {"upstream": upstream_fork, "absent_dependency": absent, "own_module_missing": own_missing}

    def run(name: str):
        started = time.monotonic()
        return name, evaluate(forks[name], 64, None, FAST_CPU), time.monotonic() - started

    with ThreadPoolExecutor(max_workers=3) as pool:
        return {name: (report, seconds) for name, report, seconds in pool.map(run, forks)}


def test_the_tree_is_upstream_fla_as_installed(upstream_fork):
    files = upstream_files()
    assert len(files) > 300, len(files)
    init = (upstream_fork / "fla" / "__init__.py").read_text()
    assert "fla.layers" in init and "fla.models" in init
    sources = "\n".join(p.read_text() for p in (upstream_fork / "fla").rglob("*.py"))
    assert "import einops" in sources or "from einops" in sources
    assert "from transformers" in sources
    assert git(upstream_fork, "status", "--porcelain") == ""
    for relative in kernel_files():
        assert (upstream_fork / relative).is_file(), relative


def test_the_import_validator_accepts_the_upstream_tree_with_the_kernels(upstream_fork):
    found = validate_repo(upstream_fork)
    assert found.ok, [str(f) for f in found.errors]


def test_the_sandboxed_child_loads_the_layer_from_the_upstream_tree(upstream_fork):
    with SandboxedChild(upstream_fork, "cpu", SandboxPolicy()) as child:
        assert child.isolation == "namespaces"
        child.channel.send({"op": "load", "fork_dir": child.fork_dir, "weights_seed": 7})
        reply, _ = child.channel.recv(deadline=time.monotonic() + 240)
    assert reply["ok"] and reply["parameters"] == LAYER_PARAMETERS, reply


def test_on_the_cpu_the_upstream_tree_says_in_one_line_that_it_needs_a_gpu(reports):
    report, _ = reports["upstream"]
    assert report.import_check.ok
    assert report.lengths["64"].status == NEEDS_GPU
    gpu_lines = [reason for reason in report.reasons if "needs a CUDA GPU" in reason]
    assert len(gpu_lines) == 1 and gpu_lines[0].startswith(NEEDS_GPU_LINE), report.reasons
    assert not any("active drivers" in reason or "loading the fork" in reason for reason in report.reasons)


def test_a_module_the_environment_lacks_is_named_as_such(reports):
    report, _ = reports["absent_dependency"]
    assert report.reasons[0] == missing_module_reason(ABSENT_DEPENDENCY)
    assert (
        f"the fork imports '{ABSENT_DEPENDENCY}', which is not part of the evaluation environment" in report.reasons[0]
    )
    assert all(package in report.reasons[0] for package in EVALUATION_PACKAGES)
    assert report.lengths["64"].status == SKIPPED


def test_a_module_missing_from_the_fork_itself_is_named_as_the_forks(reports):
    report, _ = reports["own_module_missing"]
    assert report.reasons[0].startswith("the fork's own module fla.models.utils is missing"), report.reasons


def test_step1_on_the_upstream_tree_writes_validates_and_restores_every_file_on_failure(tmp_path, capsys, monkeypatch):
    fork = tmp_path / "fork"
    before_commit = write_upstream_fork(fork, quasar=False)
    git(fork, "config", "user.name", "Miner")
    git(fork, "config", "user.email", "miner@example.invalid")
    assert not (fork / "fla" / "ops" / "quasar").exists()
    before = tree_digest(fork)
    assert step1.missing_support(fork) == []

    # The setup check runs on the device the settings name (no --device flag).
    monkeypatch.setenv("DEVICE", "cpu")
    code = step1.main(["--repo-path", str(fork), "--seq-len", "64", "--warmup", "1", "--repeats", "3"])
    out = capsys.readouterr().out
    assert "setup: git checkout, torch, triton and the device are ready" in out
    assert code == 1
    assert f"wrote {len(kernel_files())} files" in out
    assert "needs a CUDA GPU" in out and "put back as they were" in out
    assert tree_digest(fork) == before
    assert not (fork / "fla" / "ops" / "quasar").exists()
    assert git(fork, "status", "--porcelain", "--ignored") == ""
    assert git(fork, "rev-parse", "HEAD") == before_commit
