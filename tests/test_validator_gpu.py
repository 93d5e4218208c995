"""The validator's evaluations on CUDA: one worker per visible GPU at once, each seeing only its own
GPU, the honest starter fork correct and the zeros fork refused (real forks, real sandbox)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from quasar.evaluate import EvaluationOptions
from quasar.starter_fork import write_starter_fork
from quasar.validator.devices import evaluation_devices
from quasar.validator.evaluator import SubprocessEvaluator
from quasar.validator.records import EvaluationKey
from tests.gitrepo import commit_all
from tests.hostile_forks import write_hostile_fork

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TARGET = 4096
OPTIONS = EvaluationOptions(seq_lens=(512, 1024), timed_seconds=0.5, timeout_s=900, length_timeout_s=600)


def environment_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(pair.decode().split("=", 1) for pair in pairs if b"=" in pair)


def test_one_evaluation_per_gpu_at_once_each_on_its_own_gpu(tmp_path):
    devices = evaluation_devices("cuda", torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
    honest = EvaluationKey(f"file://{tmp_path / 'honest'}", write_starter_fork(tmp_path / "honest"), TARGET)
    write_hostile_fork(tmp_path / "zeros", "zeros")
    zeros = EvaluationKey(f"file://{tmp_path / 'zeros'}", commit_all(tmp_path / "zeros", "zeros"), TARGET)
    evaluator = SubprocessEvaluator(tmp_path / "work", OPTIONS, allow_local=True)
    jobs, outcomes = [honest, zeros], {}
    while jobs:
        batch, jobs = jobs[: len(devices)], jobs[len(devices) :]
        running = [evaluator.start(key, device) for key, device in zip(batch, devices)]
        for evaluation in running:  # each worker sees exactly its own GPU
            assert (
                environment_of(evaluation.process.pid)["CUDA_VISIBLE_DEVICES"] == evaluation.device.cuda_visible_devices
            )
        deadline = time.monotonic() + 1200
        while any(evaluation.poll() is None for evaluation in running):
            assert time.monotonic() < deadline, "evaluations did not finish"
            time.sleep(0.5)
        outcomes.update({evaluation.key: evaluation.poll() for evaluation in running})

    good, bad = outcomes[honest].result, outcomes[zeros].result
    assert good is not None and bad is not None, outcomes
    assert good.correct, good.reasons
    assert set(good.benchmarks) == {512, 1024, TARGET} and good.measured_tokens_per_sec == good.benchmarks[TARGET]
    assert good.report["device"] == "cuda" and "cpu" not in good.report["device_name"]
    assert not bad.correct and any("differs from the reference" in reason for reason in bad.reasons)
    print(
        f"devices {[d.name for d in devices]}: starter fork {good.measured_tokens_per_sec:,.0f} tokens/s at "
        f"T={TARGET} on {good.report['device_name']}"
    )
