"""On a host with two GPUs or more: a validator's worker told its GPU as an operator writes it in
CUDA_VISIBLE_DEVICES (nvidia-smi's index, the UUID, the start of the UUID) evaluates on that GPU,
its sandbox holds that GPU's device node only, CUDA in the sandbox sees that one GPU, and the
evaluation runs on that GPU's CPU slot (real worker, real sandbox, the starter fork)."""

from __future__ import annotations

import os
import time

import pytest
import torch

from quasar.evaluate import EvaluationOptions, pinning
from quasar.evaluate.gpus import nvidia_gpus
from quasar.starter_fork import write_starter_fork
from quasar.validator.devices import Device
from quasar.validator.evaluator import SubprocessEvaluator
from quasar.validator.records import EvaluationKey
from tests.gitrepo import commit_all

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]

OPTIONS = EvaluationOptions(seq_lens=(), timed_seconds=0.2, timeout_s=900, length_timeout_s=600)

# Appended to the fork's layer: what CUDA inside the sandbox sees, printed into the report's log tail.
CUDA_SEES = """

import torch as _torch

print("CUDA-SEES", _torch.cuda.device_count(), "GPU-" + str(_torch.cuda.get_device_properties(0).uuid), flush=True)
"""


@pytest.mark.parametrize("form", ["index", "uuid", "uuid_prefix"])
def test_a_worker_evaluates_on_the_gpu_its_visible_devices_name(tmp_path, form):
    gpus = nvidia_gpus()
    assert len(gpus) >= 2, "the driver's /proc/driver/nvidia/gpus lists fewer GPUs than torch counts"
    second = gpus[1]
    visible = {"index": "1", "uuid": second.uuid, "uuid_prefix": second.uuid[:12]}[form]
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    layer = fork / "fla" / "layers" / "quasar.py"
    layer.write_text(layer.read_text() + CUDA_SEES)
    key = EvaluationKey(f"file://{fork}", commit_all(fork, "print what CUDA sees"), 512)
    evaluation = SubprocessEvaluator(tmp_path / "work", OPTIONS, allow_local=True).start(key, Device("cuda:0", visible))
    deadline = time.monotonic() + 900
    while (outcome := evaluation.poll()) is None:
        assert time.monotonic() < deadline, "the evaluation did not finish"
        time.sleep(0.5)
    assert outcome.result is not None, outcome.error
    report = outcome.result.report
    assert outcome.result.correct, report["reasons"]
    assert f"CUDA-SEES 1 {second.uuid}" in report["log_tail"], report["log_tail"]
    assert f"its own GPU's device node only ({second.bus})" in report["sandbox"], report["sandbox"]
    allowed = os.sched_getaffinity(0)
    plan = pinning.choose_cpus(allowed, pinning.read_thread_siblings(allowed), 1)
    if plan is not None:
        assert report["cpu_pinning"].startswith(plan.describe()), report["cpu_pinning"]
