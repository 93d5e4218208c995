"""The local network on CUDA, as a validator operator runs it on a GPU machine (``python -m
quasar.localnet --once``, evaluating at 512, 1,024, 2,048 and 65,536 tokens): the hostile miner's
fork is wrong on the layer's CUDA path too (chunk_quasar_norm_gated), so it fails at the lengths
beyond its 64-token target and gets nothing; the honest miner gets first place."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from quasar.localnet.forks import HONEST, HOSTILE, HOSTILE_EXACT_UP_TO
from tests.processes import run_python

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.timeout(1500)
def test_one_round_on_cuda_gives_the_hostile_miner_nothing(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1"}
    flags = ["--once", "--json", "--device", "cuda", "--stand-in-model", "--data-dir", str(tmp_path / "net")]
    result = run_python(["-m", "quasar.localnet", *flags], tmp_path, 1400, env)
    assert result.returncode == 0, result.stderr[-6000:]
    summary = json.loads(result.stdout)
    assert summary["device"] == "cuda" and summary["seq_lens"] == [64, 512, 1024, 2048, 65536]
    miners = {miner["kind"]: miner for miner in summary["miners"]}
    honest, hostile = miners[HONEST], miners[HOSTILE]
    assert (honest["verdict"], hostile["verdict"]) == ("pass", "fail"), json.dumps(summary, indent=2)
    assert hostile["target_sequence_length"] == HOSTILE_EXACT_UP_TO
    assert any("differs from the reference" in reason for reason in hostile["reasons"]), hostile["reasons"]
    weights = summary["weights"]
    assert weights.get(str(hostile["uid"]), 0.0) == 0.0 and hostile["weight"] == 0.0
    assert weights[str(honest["uid"])] == pytest.approx(0.60)
    assert weights[str(summary["owner_uid"])] == pytest.approx(0.40)
