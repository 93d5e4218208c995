"""``quasar step2`` (quasar/tools/tune_kernel.py): the tunables swept through the harness, a
tuning chosen only when the figures tell it apart, written only with ``--commit``; on the CPU."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from quasar.starter_fork import (
    tuning_contract,
    write_starter_fork,
)
from quasar.tools import tune_kernel as step2
from tests.gitrepo import git, set_identity

FAST_EVAL = ["--device", "cpu", "--warmup", "1", "--repeats", "3"]


def test_step2_grid_is_checked_against_the_contract():
    contract = tuning_contract()
    for entry in step2.DEFAULT_GRID:
        contract.parse_tuning(entry)
    assert step2.parse_grid('[{"segment_chunks": 8}, {}]') == [{"segment_chunks": 8}, {}]
    with pytest.raises(ValueError, match="--grid entry 1: unknown tunable 'warps'"):
        step2.parse_grid('[{}, {"warps": 4}]')
    with pytest.raises(ValueError, match="non-empty JSON list"):
        step2.parse_grid("{}")


def gpu_result(tuning: dict, rate: float, noise: float = 0.002, current: bool = False, passed: bool = True):
    """A configuration's figures as an evaluation on an H100 would give them (no GPU here)."""
    lengths = (65_536, 1_000_000)
    return step2.SweepResult(
        tuning,
        passed,
        {n: rate if passed else None for n in lengths},
        [],
        {n: noise for n in lengths},
        "cuda",
        "NVIDIA H100 80GB HBM3",
        current,
    )


def test_step2_chooses_only_what_the_figures_can_tell_apart():
    current = gpu_result({}, 60e6, current=True)
    # Within the 2% two evaluations of one tree differ by: noise, the current tuning stays.
    close = gpu_result({"segment_chunks": 16}, 61e6)
    choice = step2.choose([current, close])
    assert choice.best is None and choice.fastest is close and "within the measurement noise" in choice.why
    # Beyond it: the faster configuration is chosen.
    faster = gpu_result({"segment_chunks": 64}, 63e6)
    assert step2.choose([current, close, faster]).best is faster
    # Noisy medians widen the margin past 2%: twice their combined standard error.
    noisy = [gpu_result({}, 60e6, noise=0.02, current=True), gpu_result({"segment_chunks": 64}, 63e6, noise=0.02)]
    assert step2.noise_margin(*noisy) == pytest.approx(2 * math.hypot(0.02, 0.02))
    assert step2.choose(noisy).best is None
    # On the CPU the interpreter's timings say nothing about a GPU, whatever they show.
    cpu = [dataclasses.replace(r, device="cpu", device_name="") for r in (current, faster)]
    choice = step2.choose(cpu)
    assert choice.best is None and choice.why.startswith("no CUDA: these figures come from the CPU")
    # The current tuning fastest, failing, or nothing passing.
    assert step2.choose([current, gpu_result({"segment_chunks": 16}, 50e6)]).best is None
    failing = gpu_result({}, 0.0, current=True, passed=False)
    assert step2.choose([failing, close]).best is close
    assert step2.choose([failing]).fastest is None


def test_step2_writes_the_fork_only_with_commit_and_its_files_beside_it(tmp_path, monkeypatch, capsys):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    shipped = (fork / step2.TUNING_PATH).read_bytes()
    head = git(fork, "rev-parse", "HEAD")
    better = {"segment_chunks": 64, "wy_warps": 1}
    monkeypatch.setattr(
        step2,
        "sweep",
        lambda *args: [gpu_result({}, 60e6, current=True), gpu_result(better, 66e6), gpu_result({"wy_warps": 4}, 50e6)],
    )
    suite = tmp_path / "suite"
    suite.mkdir()
    monkeypatch.chdir(suite)
    assert step2.main(["--repo-path", str(fork), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    # A dry run: the fork as it was, what --commit would write shown; the plot beside the fork.
    assert (fork / step2.TUNING_PATH).read_bytes() == shipped and git(fork, "status", "--porcelain") == ""
    assert "without --commit nothing was written" in printed and '"segment_chunks": 64' in printed
    out = tmp_path / "fork-tuning"
    assert f"plot: {out / step2.PLOT_NAME}" in printed
    assert (out / step2.PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads((out / step2.RESULTS_NAME).read_text())
    assert [row["tuning"] for row in rows] == [{}, better, {"wy_warps": 4}]
    assert list(suite.iterdir()) == []
    # --commit where git refuses to commit (an empty name): nothing changed, git's reason said.
    monkeypatch.setenv("GIT_AUTHOR_NAME", "")
    monkeypatch.setenv("GIT_COMMITTER_NAME", "")
    other = tmp_path / "plots"
    assert step2.main(["--repo-path", str(fork), "--device", "cpu", "--commit", "--out", str(other)]) == 2
    assert "git commit failed" in capsys.readouterr().out
    assert (fork / step2.TUNING_PATH).read_bytes() == shipped and git(fork, "status", "--porcelain") == ""
    assert (other / step2.PLOT_NAME).is_file()
    # --commit: the chosen configuration, whole, in one commit of that file alone.
    monkeypatch.delenv("GIT_AUTHOR_NAME")
    monkeypatch.delenv("GIT_COMMITTER_NAME")
    set_identity(fork)
    assert step2.main(["--repo-path", str(fork), "--device", "cpu", "--commit"]) == 0
    assert json.loads((fork / step2.TUNING_PATH).read_text()) == better
    assert git(fork, "rev-parse", "HEAD~1") == head
    assert git(fork, "show", "--name-only", "--format=%s", "HEAD").splitlines() == [
        "Kernel tuning: segment_chunks=64, wy_warps=1",
        "",
        "fla/ops/quasar/tuning.json",
    ]


@pytest.mark.slow
def test_step2_on_the_cpu_keeps_the_tuning_and_says_why(tmp_path, monkeypatch, capsys):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    set_identity(fork)
    head, shipped = git(fork, "rev-parse", "HEAD"), (fork / step2.TUNING_PATH).read_bytes()
    monkeypatch.chdir(tmp_path)
    # The second entry is the shipped tuning written out: the chip runs it as the current one.
    grid = [{"segment_chunks": 1}, {"segment_chunks": 32, "wy_warps": 2}, {"layer_tile_tokens": 256}]
    code = step2.main(
        ["--repo-path", str(fork), "--seq-lens", "256,512", "--grid", json.dumps(grid), "--commit", *FAST_EVAL]
    )
    assert code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "no CUDA: these figures come from the CPU" in printed and "The fork's tuning stays as it is" in printed
    assert git(fork, "rev-parse", "HEAD") == head and (fork / step2.TUNING_PATH).read_bytes() == shipped
    rows = json.loads((tmp_path / "fork-tuning" / step2.RESULTS_NAME).read_text())
    assert [(r["tuning"], r["current"]) for r in rows] == [
        (json.loads(shipped), True),
        (grid[0], False),
        (grid[2], False),
    ]
    assert all(r["passed"] and all(v > 0 for v in r["tokens_per_sec"].values()) for r in rows)
    assert (tmp_path / "fork-tuning" / step2.PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fork", "fork-tuning"]


def test_step2_needs_a_fork_with_the_kernel(tmp_path):
    (tmp_path / "fork").mkdir()
    with pytest.raises(SystemExit):
        step2.main(["--repo-path", str(tmp_path / "fork"), "--device", "cpu"])
