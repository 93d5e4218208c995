"""Logit verification between a CPU float32 reference and CUDA runs of the same model, per dtype.

Answers: do the thresholds (cosine ≥ 0.99, max |diff| ≤ 0.1) hold between an honest miner on a GPU
and a validator, and in which dtype must the miner run? float32 must pass every challenge; the
other dtypes are measured and recorded (printed, and written to ``$OUT/logits_gpu.json`` when
``OUT`` is set). Needs only torch and transformers (no server, no bittensor).
"""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from quasar import logits as L
from tiny_qwen import make_tiny_qwen2

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LIMITS = L.ChallengeLimits(max_prompt_len=128, max_gen_len=32)
THRESHOLDS = L.LogitThresholds(min_cosine=0.99, max_abs_diff=0.1)
CHALLENGES = 12
# (name, dtype, float32 matmul precision of the model's forwards): "high" lets float32 matmuls use
# TF32 on Ampere and later, what some frameworks switch on globally; a miner doing so is measured too.
VARIANTS = (
    ("float32", "float32", "highest"),
    ("float32+tf32", "float32", "high"),
    ("bfloat16", "bfloat16", "highest"),
    ("float16", "float16", "highest"),
)


def _measure(gpu_model, cpu_model, challenges) -> dict:
    """Verdicts of the GPU model's answers, and the raw error of its logits on the CPU's token paths."""
    verdicts, path_diffs, path_cosines = [], [], []
    for challenge in challenges:
        answer = gpu_model.generate(challenge.prompt, challenge.gen_len, challenge.logits_at_step)
        verdicts.append(L.verify_generation(cpu_model, challenge, answer.tokens, answer.logits, THRESHOLDS))
        cpu_tokens = cpu_model.generate(challenge.prompt, challenge.gen_len, 1).tokens
        expected = L.path_logits(cpu_model, challenge.prompt, cpu_tokens)
        measured = L.path_logits(gpu_model, challenge.prompt, cpu_tokens)
        for step in range(challenge.gen_len):
            comparison = L.compare_logits(
                expected[step], measured[step], THRESHOLDS.min_cosine, THRESHOLDS.max_abs_diff
            )
            path_diffs.append(comparison.max_abs_diff)
            path_cosines.append(comparison.cosine)
    cosines = [v.cosine for v in verdicts if v.cosine is not None]
    diffs = [v.max_abs_diff for v in verdicts if v.max_abs_diff is not None]
    return {
        "passed": sum(v.passed for v in verdicts),
        "challenges": len(verdicts),
        "min_cosine": min(cosines, default=None),
        "max_abs_diff": max(diffs, default=None),
        "failures": [v.reason for v in verdicts if not v.passed],
        "path_steps": len(path_diffs),
        "path_min_cosine": min(path_cosines),
        "path_max_abs_diff": max(path_diffs),
        "path_median_abs_diff": sorted(path_diffs)[len(path_diffs) // 2],
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    model_dir = make_tiny_qwen2(tmp_path_factory.mktemp("gpu") / "tiny", seed=1)
    cpu_model = L.load_reference_model(str(model_dir), "cpu", "float32")
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    challenges = [L.draw_challenge(cpu_model.ordinary_tokens, LIMITS, rng) for _ in range(CHALLENGES)]
    measured = {
        "seed": seed,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "thresholds": vars(THRESHOLDS),
        "variants": {},
    }
    for name, dtype, matmul_precision in VARIANTS:
        gpu_model = L.load_reference_model(str(model_dir), "cuda", dtype)
        gpu_model.matmul_precision = matmul_precision
        measured["variants"][name] = _measure(gpu_model, cpu_model, challenges)
        del gpu_model
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "logits_gpu.json").write_text(json.dumps(measured, indent=2))
    for name, row in measured["variants"].items():
        print(
            f"\n{name:>13}: {row['passed']}/{row['challenges']} passed, min cosine {row['min_cosine']}, "
            f"max |diff| {row['max_abs_diff']}; on the CPU's paths: min cosine {row['path_min_cosine']:.6f}, "
            f"max |diff| {row['path_max_abs_diff']:.4g}, median {row['path_median_abs_diff']:.3g} "
            f"over {row['path_steps']} steps; failures: {row['failures'][:2]}"
        )
    return measured


def test_float32_on_cuda_passes_against_the_cpu_reference(results):
    row = results["variants"]["float32"]
    assert row["passed"] == row["challenges"], f"seed {results['seed']}: {row}"
    assert row["path_max_abs_diff"] < THRESHOLDS.max_abs_diff / 10, row


@pytest.mark.parametrize("name", [name for name, _, _ in VARIANTS[1:]])
def test_other_precisions_run_the_same_model(results, name):
    # Whatever their verdicts (recorded above), they must be the same function: far closer than
    # another model's logits (cosine ~0), so a failure there is precision, not a bug in the path.
    row = results["variants"][name]
    assert row["path_min_cosine"] > 0.95, f"{name}: {row}"


# Run with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: the worst |diff| of CUDA float32 logits against the CPU's.
_OVERRIDDEN = """
import random, sys
from quasar import logits as L
cpu = L.load_reference_model(sys.argv[1], "cpu", "float32")
gpu = L.load_reference_model(sys.argv[1], "cuda", "float32")
rng, worst = random.Random(int(sys.argv[2])), 0.0
for _ in range(6):
    c = L.draw_challenge(cpu.ordinary_tokens, L.ChallengeLimits(max_prompt_len=128, max_gen_len=32), rng)
    tokens = cpu.generate(c.prompt, c.gen_len, 1).tokens
    worst = max(worst, float((L.path_logits(cpu, c.prompt, tokens) - L.path_logits(gpu, c.prompt, tokens)).abs().max()))
print(worst)
"""


def test_float32_stays_float32_in_an_nvidia_container(tmp_path):
    """NVIDIA's PyTorch containers set TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which turns float32
    products into TF32 for the whole process: a tiny Qwen2's logits came 0.11 off the CPU's on an
    H100, over the 0.1 the check allows, so a validator there failed honest miners. The model's
    forwards set "highest" explicitly, which overrules it."""
    model_dir = make_tiny_qwen2(tmp_path / "tiny", seed=3)
    env = {**os.environ, "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "1"}
    seed = random.SystemRandom().randrange(2**32)
    run = subprocess.run(
        [sys.executable, "-c", _OVERRIDDEN, str(model_dir), str(seed)], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr[-3000:]
    worst = float(run.stdout.split()[-1])
    print(f"\nfloat32 under TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1: max |diff| {worst:.3g} (seed {seed})")
    assert worst < THRESHOLDS.max_abs_diff / 10, f"seed {seed}: {worst}"
