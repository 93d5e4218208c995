"""An evaluation whose sandboxed child and reference work were started before its fork existed, as a
validator's worker starts them while it clones the fork: real sandboxes, real worker processes, a
real git repository for the fork, the starter fork's layer on the CPU at 64 tokens."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quasar import config
from quasar.config.options import DEFAULT_SEQ_LENS
from quasar.config.values import MAX_SEQ_LEN
from quasar.evaluate import EvaluationInputError, EvaluationOptions, evaluate, start_references, workload
from quasar.evaluate.options import check_lengths
from quasar.evaluate.references import ReferenceWork
from quasar.evaluate.sandbox import SandboxPolicy
from quasar.evaluate.start import LAYER_WIDTH, SandboxStart, output_offsets
from quasar.starter_fork import copy_starter_tree, write_starter_fork
from quasar.validator.devices import Device
from quasar.validator.evaluator import SubprocessEvaluator, outcome_from_worker
from quasar.validator.records import EvaluationKey
from quasar.validator.worker import HeadStart, options_to_json, run_job
from tests.evaluate_runs import FAST_CPU, worker_evaluation_of_the_starter_fork

ROOT = Path(__file__).resolve().parent.parent


def test_the_area_is_laid_out_for_the_layers_width():
    assert LAYER_WIDTH == workload.HIDDEN_SIZE
    offsets, size = output_offsets([128, 64, 1000])
    assert offsets == {64: 0, 128: 64 * 512 * 4, 1000: 192 * 512 * 4} and size == 1192 * 512 * 4


def test_starting_the_sandbox_imports_neither_torch_nor_the_harness():
    code = (
        "import sys, quasar.validator.worker, quasar.evaluate.start, quasar.evaluate.sandbox, "
        "quasar.evaluate.triton_seed; "
        "print(sorted(m for m in ('torch', 'quasar.evaluate.harness') if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_a_child_started_before_its_fork_existed_evaluates_it(tmp_path):
    sandbox = SandboxStart([64], "cpu", SandboxPolicy())
    references = start_references(64, FAST_CPU)
    time.sleep(0.2)
    fork = tmp_path / "fork"
    copy_starter_tree(fork)  # the fork appears only now, after the child started
    report = evaluate(fork, 64, None, FAST_CPU, sandbox=sandbox, references=references)
    assert report.passed, report.reasons
    assert report.sandbox.startswith("namespaces")
    assert report.weights_seed == references.weights_seed
    assert report.timings.started_before_s >= 0.2
    assert report.lengths["64"].rel_error < 2e-2
    assert sandbox.child.gone.is_set() and sandbox.area is None and sandbox.child.workdir is None


def test_a_sandbox_or_references_started_for_something_else_are_refused_and_closed(tmp_path):
    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    sandbox = SandboxStart([64, 128], "cpu", SandboxPolicy())
    with pytest.raises(EvaluationInputError, match=r"sandbox was started for T=\[64, 128\] on cpu, not for T=\[64\]"):
        evaluate(fork, 64, None, FAST_CPU, sandbox=sandbox)
    assert sandbox.child.gone.is_set() and sandbox.child.process.poll() is not None
    references = start_references(128, FAST_CPU)
    with pytest.raises(EvaluationInputError, match=r"reference work was started for T=\[128\]"):
        evaluate(fork, 64, None, FAST_CPU, references=references)
    seeded = EvaluationOptions(**{**FAST_CPU.__dict__, "weights_seed": 5})
    with pytest.raises(EvaluationInputError, match="other weights"):
        evaluate(fork, 64, None, seeded, references=start_references(64, FAST_CPU))


def test_a_fork_too_large_for_the_started_child_fails_the_evaluation_clearly(tmp_path, monkeypatch):
    from quasar.evaluate import sandbox_contents

    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    sandbox = SandboxStart([64], "cpu", SandboxPolicy())
    monkeypatch.setattr(sandbox_contents, "MAX_FORK_BYTES", 1024)
    report = evaluate(fork, 64, None, FAST_CPU, sandbox=sandbox)
    assert report.verdict == "fail"
    assert report.reasons[0] == "sandbox: the fork is larger than 0 MiB without .git"
    assert sandbox.child.gone.is_set() and sandbox.child.workdir is None


def test_a_validator_worker_starts_the_child_before_cloning_and_evaluates(tmp_path):
    report = worker_evaluation_of_the_starter_fork(tmp_path).result.report
    # The evaluation took over a child the worker had started before its clone and its torch import.
    assert report["timings"]["started_before_s"] > 0
    assert report["sandbox"].startswith("namespaces")


def test_a_worker_whose_clone_fails_leaves_no_child_behind(tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TMPDIR", str(temporary))  # where the worker's sandbox puts its directory
    evaluator = SubprocessEvaluator(tmp_path / "work", FAST_CPU, allow_local=True)
    running = evaluator.start(EvaluationKey(str(tmp_path / "missing"), "0" * 40, 64), Device("cpu", ""))
    deadline = time.monotonic() + 120
    while (outcome := running.poll()) is None:
        assert time.monotonic() < deadline, "the worker did not finish"
        time.sleep(0.1)
    assert outcome.result is not None and outcome.result.reasons[0].startswith("clone failed:")
    assert not list(temporary.glob("quasar-eval-*")), "the started child's directory is left behind"
    marker = str(temporary).encode()
    alive = [pid for pid in Path("/proc").iterdir() if pid.name.isdigit() and marker in _cmdline(pid)]
    assert not alive


def _cmdline(pid: Path) -> bytes:
    try:
        return (pid / "cmdline").read_bytes()
    except OSError:
        return b""


def test_the_reference_waits_for_the_calibration_and_ends_before_the_longest_length(tmp_path, monkeypatch):
    from quasar.evaluate import harness

    options = EvaluationOptions(**{**FAST_CPU.__dict__, "seq_lens": (64,)})
    references = start_references(128, options)
    time.sleep(0.3)
    assert references.reference is None and not references.expected  # nothing on the device yet
    seen: dict[str, float | bool] = {}
    real_calibrate, real_release = harness.calibrate, ReferenceWork.release
    real_prepare, real_rounds = harness.prepare_length, harness.time_rounds

    def done() -> bool:
        return not references._thread.is_alive() and {64, 128} <= set(references.expected)

    def calibrate(*args, **kwargs):
        found = real_calibrate(*args, **kwargs)
        seen["calibrated"] = time.monotonic()
        seen["reference_during_calibration"] = references.reference is not None
        return found

    def release(self):
        seen.setdefault("released", time.monotonic())
        real_release(self)

    def prepare(session, run, *args, **kwargs):
        seen[f"done before warming up {run.result.seq_len}"] = done()
        return real_prepare(session, run, *args, **kwargs)

    def time_rounds(*args, **kwargs):
        seen["done before the rounds"] = done()
        return real_rounds(*args, **kwargs)

    monkeypatch.setattr(harness, "calibrate", calibrate)
    monkeypatch.setattr(ReferenceWork, "release", release)
    monkeypatch.setattr(harness, "prepare_length", prepare)
    monkeypatch.setattr(harness, "time_rounds", time_rounds)
    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    report = evaluate(fork, 128, None, options, references=references)
    assert report.passed, report.reasons
    assert seen["reference_during_calibration"] is False
    assert seen["calibrated"] <= seen["released"]
    assert seen["done before warming up 128"] is True and seen["done before the rounds"] is True


def test_bench_harness_times_the_validators_worker(tmp_path, capsys):
    import json

    from quasar.bench import harness as bench

    code = bench.main(
        [
            "--out",
            str(tmp_path / "out"),
            "--device",
            "cpu",
            "--lens",
            "64",
            "--target",
            "128",
            "--runs",
            "2",
            "--worker",
            "--timed-seconds",
            "0.1",
            "--warmup-seconds",
            "0",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["meta"]["worker"] is True and len(summary["walls"]) == 2
    for wall, timings in zip(summary["walls"], summary["timings"], strict=True):
        # The worker's life holds evaluate's own time and what it did before (the child's head start).
        assert timings["started_before_s"] > 0 and wall > timings["total_s"] + timings["started_before_s"]
    assert "started before" in capsys.readouterr().out


def _shared_memory_of_this_process() -> int:
    found = re.search(r"RssShmem:\s+(\d+) kB", Path("/proc/self/status").read_text())
    assert found is not None
    return int(found.group(1)) << 10


def test_the_apis_largest_target_fits_the_default_sandbox_memory():
    """The API takes no target a validator of default settings refuses for its output area (2 KiB
    a token of each length): 2^24, the API's former bound, made 32 GiB of it, twice the limit."""
    memory = config.resolve({}, environ={}, dotenv_path=None).sandbox_memory_mb << 20
    assert check_lengths(DEFAULT_SEQ_LENS, MAX_SEQ_LEN, "cuda", memory)[-1] == MAX_SEQ_LEN
    with pytest.raises(EvaluationInputError, match=r"output area of 15\.3 GiB .* SANDBOX_MEMORY_MB \(8192 MiB\)"):
        check_lengths(DEFAULT_SEQ_LENS, MAX_SEQ_LEN, "cuda", memory // 2)


def test_a_target_whose_output_area_exceeds_the_sandbox_memory_makes_no_area_in_the_worker():
    # Scaled down: 256 MiB of area on CUDA (made and filled in the worker at once) against 64 MiB.
    options = dataclasses.replace(
        FAST_CPU, device="cuda", policy=dataclasses.replace(SandboxPolicy(), memory_bytes=64 << 20)
    )
    before = _shared_memory_of_this_process()
    head_start = HeadStart({"target_sequence_length": 1 << 17, "options": options_to_json(options)})
    try:
        time.sleep(1.0)  # the area's pages are made on a thread
        assert head_start.sandbox is None
        assert _shared_memory_of_this_process() - before < 64 << 20
    finally:
        head_start.close()


def test_a_target_past_this_validators_sandbox_memory_is_its_error_not_the_forks_failure(tmp_path):
    """A target the rules allow whose output area exceeds this validator's SANDBOX_MEMORY_MB (or a
    CPU's limit) was 'cannot evaluate', a failure recorded and reported against the miner for the
    validator's own setting; it is this validator's error (tried again, then abandoned, never reported)."""
    commit = write_starter_fork(tmp_path / "fork")
    options = dataclasses.replace(FAST_CPU, policy=dataclasses.replace(SandboxPolicy(), memory_bytes=64 << 20))
    job = {
        "fork_url": str(tmp_path / "fork"),
        "commit_hash": commit,
        "cache_dir": str(tmp_path / "clones"),
        "allow_local": True,
        "clone_timeout_s": 60,
        "target_sequence_length": 1 << 16,
        "options": options_to_json(options),
    }
    outcome = run_job(job)
    assert outcome["outcome"] == "not_here", outcome
    assert "SANDBOX_MEMORY_MB (64 MiB)" in outcome["error"]
    recorded = outcome_from_worker(outcome)
    assert recorded.result is None and "cannot evaluate it with its settings" in recorded.error
    # A target outside the rules' lengths stays the submission's fault.
    outcome = run_job({**job, "target_sequence_length": MAX_SEQ_LEN + 1})
    assert outcome["outcome"] == "refused" and outcome_from_worker(outcome).result.correct is False
