"""Step 1 and the evaluation on CUDA, on a fork that is upstream flash-linear-attention's whole
tree (tests/upstream_fork.py): the kernels are written, pass the harness and are committed."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quasar.evaluate import evaluate
from quasar.starter_fork import kernel_files
from quasar.tools import install_kernel as step1
from tests.evaluate_runs import FAST_CUDA
from tests.gitrepo import git
from tests.upstream_fork import write_upstream_fork

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GPU = replace(FAST_CUDA, seq_lens=(512,), length_timeout_s=180)


def test_step1_on_the_upstream_tree_passes_and_commits_the_kernel_files(tmp_path):
    fork = tmp_path / "fork"
    before = write_upstream_fork(fork, quasar=False)
    git(fork, "config", "user.name", "Miner")
    git(fork, "config", "user.email", "miner@example.invalid")

    code = step1.main(
        ["--repo-path", str(fork), "--skip-setup", "--seq-len", "8192", "--warmup", "2", "--repeats", "10"]
    )
    assert code == 0
    assert git(fork, "rev-parse", "HEAD~1") == before
    assert git(fork, "log", "-1", "--format=%s") == step1.COMMIT_MESSAGE
    assert sorted(git(fork, "show", "--name-only", "--format=", "HEAD").splitlines()) == sorted(
        str(p) for p in kernel_files()
    )
    assert git(fork, "status", "--porcelain") == ""


def test_the_upstream_tree_with_the_kernels_passes_the_harness(tmp_path):
    fork = tmp_path / "fork"
    write_upstream_fork(fork)
    report = evaluate(fork, 65536, None, GPU)
    assert report.verdict == "pass", report.reasons
    assert all(item.timing == "cuda-graph" and item.correct for item in report.lengths.values())
