"""The reference math on CUDA: exact against the recurrence, accurate in float32 at full length, and
fast enough for the validator to check a 1M-token output. Skipped without a CUDA GPU."""

import math
import os
import time

import pytest
import torch
import torch.nn.functional as F

from quasar.reference import QuasarAttentionReference, chunk_quasar_reference, naive_quasar, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def gen():
    """A CUDA generator with a fresh seed each run (failures report ``gen.initial_seed()``)."""
    return torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(4), "little"))


def make_core_inputs(gen, batch, length, heads, dim, dtype, with_state=False):
    """Random q, k, v, beta (and initial state) on the GPU, keys of varied norm, some zero."""
    options = {"generator": gen, "dtype": dtype, "device": "cuda"}
    q = torch.randn(batch, length, heads, dim, **options)
    key_scale = torch.rand(batch, length, heads, 1, **options) * 2 / math.sqrt(dim)
    key_scale[torch.rand(batch, length, heads, 1, generator=gen, device="cuda") < 0.05] = 0
    k = torch.randn(batch, length, heads, dim, **options) * key_scale
    v = torch.randn(batch, length, heads, dim, **options)
    beta = F.softplus(torch.empty(heads, dtype=dtype, device="cuda").uniform_(1, 16, generator=gen).log())
    state = torch.randn(batch, heads, dim, dim, **options) if with_state else None
    return q, k, v, beta, state


@pytest.mark.parametrize("length", [65, 300])
def test_chunk_equals_naive_on_cuda_in_float64(gen, length):
    q, k, v, beta, state = make_core_inputs(gen, 2, length, 3, 64, torch.float64, with_state=True)
    o_naive, s_naive = naive_quasar(q, k, v, beta, state, output_final_state=True)
    o_chunk, s_chunk = chunk_quasar_reference(q, k, v, beta, state, output_final_state=True)
    assert o_chunk.device.type == "cuda"
    assert relative_error(o_chunk, o_naive) < 1e-10, f"seed {gen.initial_seed()}"
    assert relative_error(s_chunk, s_naive) < 1e-10, f"seed {gen.initial_seed()}"


@pytest.mark.slow
def test_float32_chunk_matches_float64_at_65536_tokens(gen):
    q, k, v, beta, state = make_core_inputs(gen, 1, 65_536, 8, 64, torch.float64, with_state=True)
    o64, s64 = chunk_quasar_reference(q, k, v, beta, state, output_final_state=True)
    o32, s32 = chunk_quasar_reference(
        q.float(), k.float(), v.float(), beta.float(), state.float(), output_final_state=True
    )
    assert o32.dtype == torch.float32
    assert relative_error(o32, o64) < 1e-5, f"seed {gen.initial_seed()}"
    assert relative_error(s32, s64) < 1e-5, f"seed {gen.initial_seed()}"


@pytest.mark.slow
def test_chunk_reference_runs_one_million_tokens_within_seconds(gen):
    warm = make_core_inputs(gen, 1, 4096, 8, 64, torch.float32)
    chunk_quasar_reference(*warm[:4])
    del warm
    q, k, v, beta, _ = make_core_inputs(gen, 1, 1_000_000, 8, 64, torch.float32)
    torch.cuda.synchronize()
    started = time.perf_counter()
    o, final = chunk_quasar_reference(q, k, v, beta, output_final_state=True)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - started
    assert elapsed < 10, f"chunk reference took {elapsed:.1f} s at T=1,000,000"
    assert o.shape == (1, 1_000_000, 8, 64)
    assert torch.isfinite(o).all() and torch.isfinite(final).all()


def test_tf32_elsewhere_in_the_process_does_not_touch_the_reference(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 1, 2048, 4, 64, torch.float64)
    o64, _ = chunk_quasar_reference(q, k, v, beta)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        o32, _ = chunk_quasar_reference(q.float(), k.float(), v.float(), beta.float())
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)
    assert relative_error(o32, o64) < 1e-5, f"seed {gen.initial_seed()}"


def test_layer_under_bf16_autocast_on_cuda_matches_float32_on_cpu():
    layer = QuasarAttentionReference(hidden_size=512, head_dim=64, num_heads=8, mode="chunk")
    x = torch.randn(1, 1024, 512)
    expected, _, _ = layer(x)
    layer_cuda = layer.cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, attentions, cache = layer_cuda(x.cuda())
    assert attentions is None and cache is None
    assert out.dtype == torch.float32 and out.device.type == "cuda"
    assert relative_error(out, expected) < 1e-5
