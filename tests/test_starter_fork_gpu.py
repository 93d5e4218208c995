"""The starter fork on CUDA: the benchmark layer under bf16 autocast against the reference at
the benchmark's lengths (and 1M tokens), the Triton ops in fp32 and bf16, and the .cu kernel."""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil

import pytest
import torch

from fla_package import imported_starter_fla
from quasar.reference import QuasarAttentionReference, chunk_quasar_reference, relative_error
from test_starter_fork import per_sequence

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = "cuda"
# bf16 inputs, fp32 state: the validator's bound on the whole output and on each eighth of it.
BF16_TOLERANCE = 2e-2
FP32_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def fla(tmp_path_factory):
    """The fork's ``fla`` package (copied from the template; no git needed), removed afterwards."""
    with imported_starter_fla(tmp_path_factory.mktemp("starter-gpu") / "fork") as package:
        yield package


def benchmark_layers(seed: int):
    from fla.layers.quasar import QuasarAttention

    torch.manual_seed(seed)
    layer = QuasarAttention(hidden_size=512, head_dim=64, num_heads=8, mode="chunk").to(CUDA)
    reference = QuasarAttentionReference(hidden_size=512, head_dim=64, num_heads=8, mode="chunk").to(CUDA)
    reference.load_state_dict(layer.state_dict(), strict=True)
    return layer, reference


def eighths_errors(out: torch.Tensor, expected: torch.Tensor) -> list[float]:
    length = out.shape[1]
    bounds = [length * i // 8 for i in range(9)]
    return [relative_error(out[:, a:b], expected[:, a:b]) for a, b in itertools.pairwise(bounds)]


@pytest.mark.parametrize("length", [512, 1024, 2048, 65_536, 262_144])
def test_layer_matches_reference_under_bf16_autocast(fla, length):
    layer, reference = benchmark_layers(seed=length)
    x = torch.randn(1, length, 512, device=CUDA)
    with torch.inference_mode(), torch.autocast(CUDA, dtype=torch.bfloat16):
        out = layer(x)[0]
    expected = reference(x)[0]
    assert out.shape == expected.shape and bool(out.isfinite().all())
    assert relative_error(out, expected) < BF16_TOLERANCE
    parts = eighths_errors(out, expected)
    assert max(parts) < BF16_TOLERANCE, parts


@pytest.mark.slow
def test_layer_runs_and_matches_at_one_million_tokens(fla):
    layer, reference = benchmark_layers(seed=1)
    x = torch.randn(1, 1_000_000, 512, device=CUDA)
    with torch.inference_mode(), torch.autocast(CUDA, dtype=torch.bfloat16):
        out = layer(x)[0]
    assert out.shape == (1, 1_000_000, 512) and bool(out.isfinite().all())
    expected = reference(x)[0]
    parts = eighths_errors(out, expected)
    assert max(parts) < BF16_TOLERANCE, parts


def random_qkv(batch, length, heads=8, dim=64, dtype=torch.float32, seed=0):
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    q, k, v = (torch.randn(batch, length, heads, dim, device=CUDA, generator=generator) for _ in range(3))
    beta = torch.rand(heads, device=CUDA, generator=generator) * 4 + 0.1
    h0 = torch.randn(batch, heads, dim, dim, device=CUDA, generator=generator) * 0.1
    return q.to(dtype), (k * 0.25).to(dtype), v.to(dtype), beta, h0


@pytest.mark.parametrize("op_name", ["chunk_quasar", "fused_recurrent_quasar"])
def test_triton_ops_match_reference_in_fp32(fla, op_name):
    import fla.ops.quasar as ops

    op = getattr(ops, op_name)
    q, k, v, beta, h0 = random_qkv(2, 3000)
    o, final = op(q, k, v, beta, initial_state=h0, output_final_state=True)
    expected_o, expected_final = chunk_quasar_reference(q, k, v, beta, h0, output_final_state=True)
    assert relative_error(o, expected_o) < FP32_TOLERANCE
    assert relative_error(final, expected_final) < FP32_TOLERANCE

    cu_seqlens = torch.tensor([0, 1000, 1001, 3000, 4097], device=CUDA, dtype=torch.int32)
    q, k, v, beta, h0 = random_qkv(1, 4097, seed=1)
    h0 = torch.randn(4, 8, 64, 64, device=CUDA) * 0.1
    o, final = op(q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
    expected_o, expected_final = per_sequence(chunk_quasar_reference, q, k, v, beta, h0, cu_seqlens)
    assert relative_error(o, expected_o) < FP32_TOLERANCE
    assert relative_error(final, expected_final) < FP32_TOLERANCE


def test_chunk_matches_reference_with_bf16_inputs(fla):
    from fla.ops.quasar import chunk_quasar

    q, k, v, beta, h0 = random_qkv(1, 8192, dtype=torch.bfloat16, seed=2)
    o, final = chunk_quasar(q, k, v, beta, initial_state=h0, output_final_state=True)
    expected_o, expected_final = chunk_quasar_reference(q, k, v, beta, h0, output_final_state=True)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert relative_error(o, expected_o) < 1e-2
    assert relative_error(final, expected_final) < 1e-2


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to build the .cu kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_kernel_matches_reference(fla, dtype):
    from fla.ops.quasar.fused_recurrent import fused_recurrent_quasar_cuda

    tolerance = FP32_TOLERANCE if dtype == torch.float32 else 1e-2
    q, k, v, beta, h0 = random_qkv(2, 1500, dtype=dtype, seed=3)
    o, final = fused_recurrent_quasar_cuda(q, k, v, beta, initial_state=h0, output_final_state=True)
    expected_o, expected_final = chunk_quasar_reference(q, k, v, beta, h0, output_final_state=True)
    assert o.dtype == dtype
    assert relative_error(o, expected_o) < tolerance
    assert relative_error(final, expected_final) < tolerance

    cu_seqlens = torch.tensor([0, 700, 703, 1500], device=CUDA, dtype=torch.int32)
    q, k, v, beta, _ = random_qkv(1, 1500, dtype=dtype, seed=4)
    h0 = torch.randn(3, 8, 64, 64, device=CUDA) * 0.1
    o, final = fused_recurrent_quasar_cuda(
        q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens
    )
    expected_o, expected_final = per_sequence(chunk_quasar_reference, q, k, v, beta, h0, cu_seqlens)
    assert relative_error(o, expected_o) < tolerance
    assert relative_error(final, expected_final) < tolerance


# --- the two-level scan under every segment size, and the layer's tiles ---


@pytest.mark.parametrize("segment_chunks", [1, 4, 32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_matches_reference_for_each_segment_size(fla, segment_chunks, dtype):
    from fla.ops.quasar.chunk import chunk_quasar_fwd
    from fla.ops.quasar.tuning import QuasarTuning

    tolerance = FP32_TOLERANCE if dtype == torch.float32 else 1e-2
    cu_seqlens = torch.tensor([0, 63, 64, 5000, 5001, 9000], device=CUDA, dtype=torch.int32)
    q, k, v, beta, _ = random_qkv(1, 9000, dtype=dtype, seed=10 + segment_chunks)
    h0 = torch.randn(5, 8, 64, 64, device=CUDA) * 0.1
    tuning = QuasarTuning(segment_chunks=segment_chunks)
    o, final = chunk_quasar_fwd(q, k, v, beta, h0, True, cu_seqlens, tuning)
    expected_o, expected_final = per_sequence(chunk_quasar_reference, q, k, v, beta, h0, cu_seqlens)
    assert relative_error(o, expected_o) < tolerance
    assert relative_error(final, expected_final) < tolerance


@contextlib.contextmanager
def tuned(folder, values: dict):
    """The fork's kernels read ``values`` as their tuning.json (written in ``folder``) inside."""
    import fla.ops.quasar.tuning as tuning

    original = tuning.TUNING_FILE
    try:
        tuning.TUNING_FILE = folder / "tuning.json"
        tuning.TUNING_FILE.write_text(json.dumps(values))
        tuning.load_tuning.cache_clear()
        yield
    finally:
        tuning.TUNING_FILE = original
        tuning.load_tuning.cache_clear()


def test_layer_tiles_match_one_pass(fla, tmp_path):
    layer, reference = benchmark_layers(seed=5)
    x = torch.randn(1, 20_000, 512, device=CUDA)
    with (
        tuned(tmp_path, {"layer_tile_tokens": 4096}),
        torch.inference_mode(),
        torch.autocast(CUDA, dtype=torch.bfloat16),
    ):
        tiled = layer(x)[0]
    with torch.inference_mode(), torch.autocast(CUDA, dtype=torch.bfloat16):
        whole = layer(x)[0]
    expected = reference(x)[0]
    assert relative_error(tiled, expected) < BF16_TOLERANCE
    assert max(eighths_errors(tiled, expected)) < BF16_TOLERANCE
    assert relative_error(tiled, whole) < 1e-2


def test_output_pass_convolving_q_matches_the_conv_kernel(fla, tmp_path):
    layer, reference = benchmark_layers(seed=6)
    # Two batch rows, tiles carrying the conv's inputs, a ragged last tile.
    x = torch.randn(2, 9000 + 37, 512, device=CUDA)
    outputs = {}
    for fused in ("", "q"):
        with (
            tuned(tmp_path, {"layer_tile_tokens": 4096, "fused_conv": fused, "fused_conv_min_tokens": 0}),
            torch.inference_mode(),
            torch.autocast(CUDA, dtype=torch.bfloat16),
        ):
            outputs[fused] = layer(x)[0]
    expected = reference(x)[0]
    for out in outputs.values():
        assert relative_error(out, expected) < BF16_TOLERANCE
        assert max(eighths_errors(out, expected)) < BF16_TOLERANCE
    # The same bf16 convolutions (up to the compiler's fused multiply-adds): the same layer.
    assert relative_error(outputs["q"], outputs[""]) < 1e-3
