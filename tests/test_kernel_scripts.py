"""The kernel's tunables contract, the miner's kernel tools (``quasar step1``: write the kernel into
a fork, validate, commit; ``quasar step2``: sweep the tunables through the harness) and the
benchmarks of the kernel and the harness (``quasar bench floor``, ``reference``, ``harness``), on the
CPU."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
from pathlib import Path

import pytest
import torch

from quasar.bench import floor as bench_floor
from quasar.bench import harness as bench
from quasar.bench import reference as bench_reference
from quasar.evaluate.report import EvaluationReport, LengthResult
from quasar.starter_fork import (
    KERNEL_DIR,
    LAYER_FILE,
    copy_starter_tree,
    template_root,
    tuning_contract,
    write_starter_fork,
)
from quasar.tools import install_kernel as step1
from quasar.tools import tune_kernel as step2
from tests.gitrepo import git, set_identity

FAST_EVAL = ["--device", "cpu", "--warmup", "1", "--repeats", "3"]


# --- the tunables contract (fla/ops/quasar/tuning.py of the template) ---


def test_tuning_contract_defaults_and_errors(tmp_path):
    contract = tuning_contract()
    assert contract.parse_tuning({}) == contract.DEFAULTS
    tuned = contract.parse_tuning({"segment_chunks": 32, "precision": "tf32", "layer_tile_tokens": 4096})
    assert (tuned.segment_chunks, tuned.precision, tuned.layer_tile_tokens) == (32, "tf32", 4096)
    with pytest.raises(ValueError, match="unknown tunable 'chunk'"):
        contract.parse_tuning({"chunk": 64})
    with pytest.raises(ValueError, match="segment_chunks must be one of"):
        contract.parse_tuning({"segment_chunks": 12})
    with pytest.raises(ValueError, match="layer_tile_tokens must be a positive multiple of 64"):
        contract.parse_tuning({"layer_tile_tokens": 100})
    with pytest.raises(ValueError, match="num_stages"):
        contract.parse_tuning({"num_stages": True})
    assert contract.parse_tuning({"wy_maxnreg": 0}).wy_maxnreg == 0
    assert contract.parse_tuning({"wy_maxnreg": 128}).wy_maxnreg == 128
    for bad in (100, 160, 256, False, "168"):
        with pytest.raises(ValueError, match=r"wy_maxnreg must be one of \[0, 128, 136"):
            contract.parse_tuning({"wy_maxnreg": bad})
    bad = tmp_path / "tuning.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        contract.load_tuning(str(bad))
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"segment_warps": 8}))
    assert contract.load_tuning(str(good)).segment_warps == 8
    assert contract.load_tuning(str(tmp_path / "absent.json")) == contract.DEFAULTS


def test_a_tuning_for_one_chip_applies_on_that_chip_alone(tmp_path):
    contract = tuning_contract()
    values = {"segment_chunks": 64, "devices": {"H200": {"wy_warps": 1}, "nvidia h": {"wy_warps": 4}}}
    assert contract.parse_tuning(values).wy_warps == contract.DEFAULTS.wy_warps
    for device, warps in (("NVIDIA H200", 1), ("NVIDIA H100 80GB HBM3", 4), ("NVIDIA A100-SXM4-80GB", 2), (None, 2)):
        tuned = contract.parse_tuning(values, device=device)
        assert (tuned.wy_warps, tuned.segment_chunks) == (warps, 64), device
    for bad, message in (
        ({"devices": []}, "devices must map"),
        ({"devices": {" ": {}}}, "empty device-name"),
        ({"devices": {"H200": {"wy_warps": 3}}}, r"devices\['H200'\]: wy_warps must be one of"),
        ({"devices": {"H200": {"devices": {}}}}, "unknown tunable 'devices'"),
    ):
        with pytest.raises(ValueError, match=message):
            contract.parse_tuning(bad, device="NVIDIA H200")
    # The shipped file is the defaults on every chip: the H100's tuning measured faster on an H200
    # too than the H200's own entry did (benchmarks/RESULTS.md, issue 16's ninth session).
    shipped = json.loads((Path(str(template_root())) / KERNEL_DIR / "tuning.json").read_text())
    for device in ("NVIDIA H200", "NVIDIA H100 80GB HBM3", None):
        assert contract.parse_tuning(shipped, device=device) == contract.DEFAULTS
    file = tmp_path / "chips.json"
    file.write_text(json.dumps(values))
    assert contract.load_tuning(str(file), "NVIDIA H200").wy_warps == 1
    assert contract.load_tuning(str(file)).wy_warps == 2
    assert contract.device_name_of(torch.zeros(1)) is None


def test_step2_grid_is_checked_against_the_contract():
    contract = tuning_contract()
    for entry in step2.DEFAULT_GRID:
        contract.parse_tuning(entry)
    assert step2.parse_grid('[{"segment_chunks": 8}, {}]') == [{"segment_chunks": 8}, {}]
    with pytest.raises(ValueError, match="--grid entry 1: unknown tunable 'warps'"):
        step2.parse_grid('[{}, {"warps": 4}]')
    with pytest.raises(ValueError, match="non-empty JSON list"):
        step2.parse_grid("{}")


# --- step 1 ---


def test_step1_writes_only_kernel_files_and_checks_the_fork_can_take_them(tmp_path):
    files = step1.kernel_files()
    assert LAYER_FILE in files and all(p == LAYER_FILE or KERNEL_DIR in p.parents for p in files)
    assert {"chunk.py", "tuning.py", "quasar_recurrent.cu"} <= {p.name for p in files}

    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    assert step1.missing_support(fork) == []
    (fork / "fla" / "utils.py").write_text("IS_AMD = False\n")
    (fork / "fla" / "ops" / "utils" / "index.py").unlink()
    problems = step1.missing_support(fork)
    assert any(p.startswith("fla/utils.py does not define") and "input_guard" in p for p in problems), problems
    assert any(p.startswith("fla/ops/utils/index.py is missing") for p in problems), problems
    before = (fork / "fla" / "ops" / "quasar" / "chunk.py").read_bytes()
    (fork / "fla" / "ops" / "quasar" / "chunk.py").write_text("# old kernel\n")
    with pytest.raises(step1.Step1Error, match="fla/utils.py does not define"):
        step1.write_kernel(fork)
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text() == "# old kernel\n"

    copy_starter_tree(tmp_path / "fresh")
    fork = tmp_path / "fresh"
    (fork / "fla" / "ops" / "quasar" / "tuning.py").unlink()
    (fork / "fla" / "ops" / "quasar" / "chunk.py").write_text("# old kernel\n")
    written = step1.write_kernel(fork)
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_bytes() == before
    assert written.previous[KERNEL_DIR / "tuning.py"] is None
    step1.restore(fork, written)
    assert not (fork / "fla" / "ops" / "quasar" / "tuning.py").exists()
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text() == "# old kernel\n"


@pytest.mark.slow
def test_step1_validates_and_commits_only_the_kernel_files(tmp_path):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    set_identity(fork)
    chunk = fork / "fla" / "ops" / "quasar" / "chunk.py"
    chunk.write_text(chunk.read_text() + "\n# an older kernel\n")
    (fork / "notes.txt").write_text("the miner's own file\n")
    git(fork, "add", "fla/ops/quasar/chunk.py")
    git(fork, "commit", "-q", "-m", "older kernel")
    before = git(fork, "rev-parse", "HEAD")

    code = step1.main(["--repo-path", str(fork), "--skip-setup", "--seq-len", "1024", *FAST_EVAL])
    assert code == 0
    assert git(fork, "rev-parse", "HEAD~1") == before
    assert git(fork, "log", "-1", "--format=%s") == step1.COMMIT_MESSAGE
    assert git(fork, "show", "--name-only", "--format=", "HEAD").splitlines() == ["fla/ops/quasar/chunk.py"]
    assert "an older kernel" not in (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text()
    assert git(fork, "status", "--porcelain") == "?? notes.txt"
    # The kernel is there now: writing it again leaves nothing to commit.
    assert step1.commit(fork, step1.write_kernel(fork)) is None


def test_step1_refuses_a_fork_that_cannot_take_the_kernel(tmp_path, capsys):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    (fork / "fla" / "utils.py").write_text("IS_AMD = False\n")
    assert step1.main(["--repo-path", str(fork), "--skip-setup", *FAST_EVAL]) == 2
    assert "does not define" in capsys.readouterr().out
    assert step1.main(["--repo-path", str(fork), "--device", "cpu"]) == 2  # no git identity set here
    with pytest.raises(SystemExit):
        step1.main(["--repo-path", str(tmp_path / "absent"), "--skip-setup"])


# --- step 2 ---


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


# --- the passes at copy speed (quasar bench floor) ---


def test_bench_floor_counts_the_bytes_of_the_starter_layers_passes():
    from quasar.reference import QuasarAttentionReference

    layer = QuasarAttentionReference(**bench_floor.LAYER)
    hidden, heads = layer.hidden_size, layer.o_proj.in_features
    # The starter layer's input product: W_q | W_k | W_v | W_g1 stacked.
    projections = sum(linear.out_features for linear in (layer.q_proj, layer.k_proj, layer.v_proj, layer.g_proj[0]))
    today = {found.name: found for found in bench_floor.pass_bytes(**bench_floor.LAYER, fused=False)}
    assert (today["cast"].read, today["cast"].write) == (4 * hidden, 2 * hidden)
    assert (today["input product"].read, today["input product"].write) == (2 * hidden, 2 * projections)
    assert today["output product"].read == 2 * heads and today["output product"].write == 2 * hidden
    # benchmarks/RESULTS.md's table of what each pass moves at 1M (issue 16, eighth session).
    assert sum(found.read + found.write for found in today.values()) == 25_856
    fused = {found.name: found for found in bench_floor.pass_bytes(**bench_floor.LAYER, fused=True)}
    assert "cast" not in fused and fused["input product, fp32 in"].read == 4 * hidden
    assert fused["conv k, v + WY"].write == today["WY"].write + 2 * heads  # k, written for the later passes
    # Fused: no cast, the product reads fp32 (1,024 more), no conv pass, the WY pass writes k.
    assert sum(found.read + found.write for found in fused.values()) == 25_856 - 3_072 + 1_024 - 4_096 + 1_024


def test_bench_floor_times_both_sequences_and_prints_them_in_80_columns(tmp_path, capsys):
    assert (
        bench_floor.main(
            ["--out", str(tmp_path), "--device", "cpu", "--lengths", "200", "--tile", "128", "--runs", "2"]
        )
        == 0
    )
    found = json.loads((tmp_path / "floor.json").read_text())["lengths"]["200"]
    for sequence, fused in (("today", False), ("fused", True)):
        expected = bench_floor.pass_bytes(**bench_floor.LAYER, fused=fused)
        rows = found[sequence]["passes"]
        assert [row["name"] for row in rows] == [each.name for each in expected]
        for row in rows:
            assert row["seconds"] > 0
            assert row["bytes_per_second"] == pytest.approx((row["read"] + row["write"]) * 200 / row["seconds"])
        assert found[sequence]["tokens_per_second"] == pytest.approx(200 / found[sequence]["seconds"])
    printed = capsys.readouterr().out
    assert "today, T = 200" in printed and all(len(line) <= 80 for line in printed.splitlines())


def test_a_stand_in_moves_its_bytes_tile_by_tile():
    x = torch.randn(300, bench_floor.LAYER["hidden_size"])
    passes = bench_floor.pass_bytes(**bench_floor.LAYER, fused=False)
    tiles = bench_floor.Tiles(x, 128, passes)
    tiles.run(["cast", "input product", "output product"], 128)
    # The last tile's cast holds the input's last 44 rows; every output row was written.
    assert torch.equal(tiles.x_bf16[:44], x[256:].to(torch.bfloat16))
    assert torch.isfinite(tiles.out.float()).all()


# --- the validator's reference work (quasar bench reference) ---


def test_bench_reference_times_each_length_and_writes_its_figures(tmp_path, capsys):
    from quasar.evaluate.verification import requests_to_verify

    assert (
        bench_reference.main(
            ["--out", str(tmp_path), "--device", "cpu", "--lens", "64,96", "--tokens-per-request", "256"]
        )
        == 0
    )
    found = json.loads((tmp_path / "reference.json").read_text())
    assert [row["length"] for row in found["lengths"]] == [64, 96]
    # Every forward of the requests a length's verification draws (the correctness request among
    # them), more at the longest length, the target.
    run = bench_reference.made_up_run(64, torch.Generator().manual_seed(1), 256)
    assert run.check in run.timed and len(run.timed) == bench_reference.TIMED_REQUESTS
    assert found["lengths"][0]["forwards"] == requests_to_verify(run, False) * run.result.forwards_per_request
    target_run = bench_reference.made_up_run(96, torch.Generator().manual_seed(1), 256)
    target_forwards = requests_to_verify(target_run, True) * target_run.result.forwards_per_request
    assert found["lengths"][1]["forwards"] == target_forwards
    assert all(row["seconds"] > 0 for row in found["lengths"])
    printed = capsys.readouterr().out
    assert "the parent's reference per length" in printed and all(len(line) <= 80 for line in printed.splitlines())


# --- the harness's agreement over evaluations (quasar bench harness) ---


def test_bench_harness_reports_the_spread_of_medians_and_of_bests():
    import io

    from rich.console import Console

    def report(median: float, best: float) -> EvaluationReport:
        item = LengthResult(
            seq_len=512,
            status="ok",
            tokens_per_sec=median,
            tokens_per_sec_max=best,
            tokens_per_sec_min=median / 2,
            cv=0.1,
            rel_error=0.01,
            forwards_per_request=64,
            subtracted_us=1.5,
        )
        missing = LengthResult(seq_len=1024, status="oom")
        return EvaluationReport(
            verdict="pass",
            reasons=[],
            repo="r",
            target_seq_len=1024,
            seq_lens=[512, 1024],
            device="cuda",
            device_name="gpu",
            import_check=None,
            lengths={"512": item, "1024": missing},
        )

    reports = [report(100.0, 200.0), report(104.0, 201.0), report(101.0, 202.0)]
    found = bench.agreement(reports)
    assert found["512"]["medians"] == [100.0, 104.0, 101.0] and found["512"]["bests"] == [200.0, 201.0, 202.0]
    assert found["512"]["spread"] == pytest.approx(0.04) and found["512"]["best_spread"] == pytest.approx(0.01)
    assert found["1024"] == {"medians": None, "statuses": ["oom"] * 3}
    console = Console(file=io.StringIO(), width=300)
    console.print(bench.agreement_table(reports, found))
    text = console.file.getvalue()
    assert "100 · 104 · 101" in text and "4.00%" in text and "200 · 201 · 202" in text and "1.00%" in text
    assert bench.parse_target("1M") == 1_000_000 and bench.parse_target("100000") == 100_000
    with pytest.raises(Exception, match="one length"):
        bench.parse_target("512,1024")

    # The steps: each event to the next, summed per stage and length, in the order they came.
    timeline = bench.Timeline()
    timeline.events = [
        (0.0, "start", None),
        (4.5, "calibrate", 512),
        (5.0, "warmup", 512),
        (5.5, "warmup", 512),
        (9.0, "timed", 512),
        (10.0, "warmup", 512),
        (10.25, "done", None),
    ]
    assert timeline.steps() == {"start": 4.5, "calibrate@512": 0.5, "warmup@512": 4.25, "timed@512": 1.0}
    console = Console(file=io.StringIO(), width=80)
    console.print(bench.steps_table([timeline.steps(), {"start": 3.5}]))
    text = console.file.getvalue()
    assert "warmup@512" in text and "4.00" in text and "3.50-4.50" in text
    assert bench.parse_tuning('{"num_stages": 1}') == {"num_stages": 1}
    with pytest.raises(Exception, match="unknown tunable 'stages'"):
        bench.parse_tuning('{"stages": 1}')


def test_bench_harness_evaluates_another_trees_files(tmp_path):
    tree = tmp_path / "older"
    starter = sorted(copy_starter_tree(tree))
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    copied = bench.copy_fork_tree(tree, tmp_path / "copy")
    assert copied == starter
    assert not (tmp_path / "copy" / ".git").exists()
    layer = Path("fla") / "layers" / "quasar.py"
    assert (tmp_path / "copy" / layer).read_bytes() == (tree / layer).read_bytes()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="not a fork's tree"):
        bench.copy_fork_tree(tmp_path / "empty", tmp_path / "copy2")
