"""A DEVICE naming a GPU past the last one torch sees (``cuda:N`` on a host of N GPUs, or of fewer
listed in CUDA_VISIBLE_DEVICES): the evaluation, the reference model's loader and the miner each
refuse it at start, naming the GPUs torch sees. Before, the evaluation and the miner stopped on
torch's ``Invalid device id`` traceback, and the inference server on CUDA's ``invalid device
ordinal``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quasar.evaluate import EvaluationInputError, EvaluationOptions, evaluate
from quasar.localnet.host import make_wallet
from quasar.logits import ModelLoadError, load_reference_model
from quasar.starter_fork import write_starter_fork
from tiny_qwen import make_tiny_qwen2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parent.parent


def past_the_last() -> str:
    return f"cuda:{torch.cuda.device_count()}"


def sees() -> str:
    return f"torch sees {torch.cuda.device_count()} CUDA device(s), cuda:0"


def test_an_evaluation_refuses_a_gpu_past_the_last(tmp_path):
    write_starter_fork(tmp_path / "fork")
    with pytest.raises(EvaluationInputError) as refused:
        evaluate(tmp_path / "fork", 512, options=EvaluationOptions(device=past_the_last(), seq_lens=()))
    assert f"device {past_the_last()}: {sees()}" in str(refused.value), refused.value


def test_the_reference_model_refuses_a_gpu_past_the_last(tmp_path):
    with pytest.raises(ModelLoadError) as refused:
        load_reference_model(str(make_tiny_qwen2(tmp_path / "model")), past_the_last())
    assert f"DEVICE is {past_the_last()} but {sees()}" in str(refused.value), refused.value


def test_the_miner_refuses_a_gpu_past_the_last(tmp_path):
    make_wallet(tmp_path / "wallets", "miner")
    env = {
        **os.environ,
        "QUASAR_DOTENV": "",
        "DEVICE": past_the_last(),
        "GITHUB_TOKEN": "ghp_device_test",
        "GITHUB_USERNAME": "someone",
        "MINER_ALLOW_UNSANDBOXED": "true",
    }
    command = [sys.executable, "-m", "neurons.miner", "--wallet.name", "miner", "--wallet.hotkey", "default"]
    command += ["--wallet.path", str(tmp_path / "wallets"), "--subtensor.network", "devchain", "--netuid", "24"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in output, output
    assert f"DEVICE={past_the_last()} but {sees()}" in output, output
