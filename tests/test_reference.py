"""The reference math: the chunked form equals the token-by-token recurrence, and the layer equals
an independent slow computation of docs/rules.md section 6, on fresh random inputs."""

import math
import os
import time

import pytest
import torch
import torch.nn.functional as F

import quasar.reference
from quasar.reference import (
    QuasarAttentionReference,
    chunk_quasar_reference,
    naive_quasar,
    reference_layer_forward,
    relative_error,
)
from quasar.reference.layer import _causal_conv_silu

BENCHMARK_LAYER = {"hidden_size": 512, "head_dim": 64, "num_heads": 8, "mode": "chunk"}
BENCHMARK_PARAMETERS = {
    "q_proj.weight": [512, 512],
    "k_proj.weight": [512, 512],
    "v_proj.weight": [512, 512],
    "o_proj.weight": [512, 512],
    "q_conv1d.weight": [512, 1, 4],
    "k_conv1d.weight": [512, 1, 4],
    "v_conv1d.weight": [512, 1, 4],
    "beta_log": [8],
    "g_proj.0.weight": [64, 512],
    "g_proj.1.weight": [512, 64],
    "g_proj.1.bias": [512],
    "o_norm.weight": [64],
}


@pytest.fixture
def gen():
    """A generator with a fresh seed each run (failures report ``gen.initial_seed()``)."""
    return torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))


def make_core_inputs(gen, batch, length, heads, d_k, d_v, dtype=torch.float64, with_state=False):
    """Random q, k, v, beta (and initial state) with keys of varied norm, some exactly zero."""
    q = torch.randn(batch, length, heads, d_k, generator=gen, dtype=dtype)
    key_scale = torch.rand(batch, length, heads, 1, generator=gen, dtype=dtype) * 2 / math.sqrt(d_k)
    key_scale[torch.rand(batch, length, heads, 1, generator=gen) < 0.05] = 0
    k = torch.randn(batch, length, heads, d_k, generator=gen, dtype=dtype) * key_scale
    v = torch.randn(batch, length, heads, d_v, generator=gen, dtype=dtype)
    beta = F.softplus(torch.empty(heads, dtype=dtype).uniform_(1, 16, generator=gen).log())
    state = torch.randn(batch, heads, d_k, d_v, generator=gen, dtype=dtype) if with_state else None
    return q, k, v, beta, state


def test_naive_matches_the_scalar_recurrence_written_out():
    gen = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    q, k, v, beta, state = make_core_inputs(gen, 1, 6, 2, 3, 2, with_state=True)
    o, final = naive_quasar(q, k, v, beta, state, output_final_state=True)
    for h in range(2):
        s = [[float(state[0, h, i, j]) for j in range(2)] for i in range(3)]
        for t in range(6):
            kt, vt, qt = k[0, t, h].tolist(), v[0, t, h].tolist(), q[0, t, h].tolist()
            lam = sum(x * x for x in kt)
            alpha = (1 - math.exp(-float(beta[h]) * lam)) / (lam + 1e-8)
            pred = [sum(s[i][j] * kt[i] for i in range(3)) for j in range(2)]
            s = [[s[i][j] + alpha * kt[i] * (vt[j] - pred[j]) for j in range(2)] for i in range(3)]
            for j in range(2):
                expected = sum(s[i][j] * qt[i] for i in range(3))
                assert o[0, t, h, j].item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
        for i in range(3):
            for j in range(2):
                assert final[0, h, i, j].item() == pytest.approx(s[i][j], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "initial-state"])
@pytest.mark.parametrize("chunks_per_block", [None, 1], ids=["one-block", "block-per-chunk"])
@pytest.mark.parametrize(
    "batch,length,heads,d_k,d_v",
    [
        (1, 1, 1, 16, 16),
        (2, 63, 3, 32, 32),
        (1, 64, 2, 64, 64),
        (2, 65, 2, 16, 8),
        (1, 130, 4, 32, 48),
        (2, 300, 2, 64, 64),
    ],
)
def test_chunk_equals_naive_in_float64(gen, batch, length, heads, d_k, d_v, with_state, chunks_per_block):
    q, k, v, beta, state = make_core_inputs(gen, batch, length, heads, d_k, d_v, with_state=with_state)
    o_naive, s_naive = naive_quasar(q, k, v, beta, state, output_final_state=True)
    o_chunk, s_chunk = chunk_quasar_reference(
        q, k, v, beta, state, output_final_state=True, chunks_per_block=chunks_per_block
    )
    seed = gen.initial_seed()
    assert o_chunk.dtype == s_chunk.dtype == torch.float64
    assert o_chunk.shape == (batch, length, heads, d_v) and s_chunk.shape == (batch, heads, d_k, d_v)
    assert relative_error(o_chunk, o_naive) < 1e-10, f"seed {seed}"
    assert relative_error(s_chunk, s_naive) < 1e-10, f"seed {seed}"


@pytest.mark.parametrize("chunks_per_block", [None, 5, 16], ids=["one-block", "blocks-of-5", "blocks-of-16"])
@pytest.mark.parametrize("length", [837, 1024])
def test_scan_over_many_chunks_equals_naive_in_float64(gen, length, chunks_per_block):
    # 14 and 16 chunks: the scan's passes of step 1, 2, 4 and 8, with a ragged last pass and
    # blocks that end on and off a power of two, each starting from the state the last one left.
    q, k, v, beta, state = make_core_inputs(gen, 1, length, 2, 16, 8, with_state=True)
    o_naive, s_naive = naive_quasar(q, k, v, beta, state, output_final_state=True)
    o_chunk, s_chunk = chunk_quasar_reference(
        q, k, v, beta, state, output_final_state=True, chunks_per_block=chunks_per_block
    )
    assert relative_error(o_chunk, o_naive) < 1e-10, f"seed {gen.initial_seed()}"
    assert relative_error(s_chunk, s_naive) < 1e-10, f"seed {gen.initial_seed()}"


def test_final_state_only_when_asked(gen):
    q, k, v, beta, state = make_core_inputs(gen, 1, 10, 2, 8, 8, with_state=True)
    assert naive_quasar(q, k, v, beta, state)[1] is None
    assert chunk_quasar_reference(q, k, v, beta, state)[1] is None


def test_initial_state_continues_a_split_sequence(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 2, 200, 2, 16, 16)
    o_full, s_full = chunk_quasar_reference(q, k, v, beta, output_final_state=True)
    o_head, s_head = chunk_quasar_reference(q[:, :77], k[:, :77], v[:, :77], beta, output_final_state=True)
    o_tail, s_tail = chunk_quasar_reference(q[:, 77:], k[:, 77:], v[:, 77:], beta, s_head, output_final_state=True)
    assert relative_error(torch.cat([o_head, o_tail], dim=1), o_full) < 1e-12
    assert relative_error(s_tail, s_full) < 1e-12


def test_empty_sequence_returns_the_initial_state(gen):
    q, k, v, beta, state = make_core_inputs(gen, 1, 0, 2, 8, 8, with_state=True)
    for core in (naive_quasar, chunk_quasar_reference):
        o, final = core(q, k, v, beta, state, output_final_state=True)
        assert o.shape == (1, 0, 2, 8)
        assert torch.equal(final, state) and final is not state


def test_low_precision_inputs_are_computed_in_float32(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 1, 100, 2, 16, 16, dtype=torch.float32)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    o, final = chunk_quasar_reference(q, k, v, beta, output_final_state=True)
    o32, final32 = chunk_quasar_reference(q.float(), k.float(), v.float(), beta, output_final_state=True)
    assert o.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert torch.equal(o, o32.bfloat16()) and torch.equal(final, final32)
    o_naive, _ = naive_quasar(q, k, v, beta)
    assert o_naive.dtype == torch.bfloat16


def test_float32_chunk_is_close_to_float64(gen):
    q, k, v, beta, state = make_core_inputs(gen, 1, 2048, 2, 64, 64, with_state=True)
    o64, s64 = chunk_quasar_reference(q, k, v, beta, state, output_final_state=True)
    o32, s32 = chunk_quasar_reference(
        q.float(), k.float(), v.float(), beta.float(), state.float(), output_final_state=True
    )
    assert relative_error(o32, o64) < 1e-5
    assert relative_error(s32, s64) < 1e-5


@pytest.mark.parametrize("core", [naive_quasar, chunk_quasar_reference])
def test_core_is_causal(gen, core):
    q, k, v, beta, state = make_core_inputs(gen, 1, 200, 2, 16, 16, with_state=True)
    t = 100
    o, _ = core(q, k, v, beta, state)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x in (q2, k2, v2):
        x[:, t] += torch.randn(x[:, t].shape, generator=gen, dtype=x.dtype)
    o2, _ = core(q2, k2, v2, beta, state)
    assert torch.equal(o2[:, :t], o[:, :t])
    assert not torch.allclose(o2[:, t], o[:, t])
    assert not torch.allclose(o2[:, t + 1], o[:, t + 1])


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda a: a.update(k=a["k"][:, :5]), "k: expected the shape of q"),
        (lambda a: a.update(v=a["v"][:, :, :1]), "v: expected"),
        (lambda a: a.update(q=a["q"][0]), r"q: expected shape \[B, T, H, D\]"),
        (lambda a: a.update(beta=a["beta"][:1]), r"beta: expected shape \[H\]"),
        (lambda a: a.update(initial_state=torch.zeros(1, 2, 8, 4, dtype=torch.float64)), "initial_state: expected"),
    ],
)
@pytest.mark.parametrize("core", [naive_quasar, chunk_quasar_reference])
def test_bad_core_inputs_are_named(gen, core, change, message):
    q, k, v, beta, state = make_core_inputs(gen, 1, 10, 2, 8, 8, with_state=True)
    args = {"q": q, "k": k, "v": v, "beta": beta, "initial_state": state}
    change(args)
    with pytest.raises(ValueError, match=message):
        core(**args)


def test_chunks_per_block_must_be_positive(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 1, 10, 2, 8, 8)
    with pytest.raises(ValueError, match="chunks_per_block"):
        chunk_quasar_reference(q, k, v, beta, chunks_per_block=0)


# --- the layer -------------------------------------------------------------------------------


def slow_layer(params, x, eps):
    """docs/rules.md section 6 in float64, token by token, independent of quasar.reference.layer."""
    p = {name: t.detach().double() for name, t in params.items()}
    x = x.double()
    batch, length, _ = x.shape
    heads, head_dim = p["beta_log"].numel(), p["o_norm.weight"].numel()

    def conv_silu(y, name):
        if f"{name}_conv1d.weight" not in p:  # use_short_conv=False: the plain projection
            return y
        weight, bias = p[f"{name}_conv1d.weight"], p.get(f"{name}_conv1d.bias")
        kernel = weight.shape[-1]
        out = torch.zeros_like(y) if bias is None else bias.expand_as(y).clone()
        for t in range(length):
            for j in range(kernel):
                source = t - (kernel - 1) + j
                if source >= 0:
                    out[:, t] += weight[:, 0, j] * y[:, source]
        return out / (1 + torch.exp(-out))

    q, k, v = (
        conv_silu(x @ p[f"{name}_proj.weight"].T, name).reshape(batch, length, heads, head_dim)
        for name in ("q", "k", "v")
    )
    beta = torch.log1p(torch.exp(p["beta_log"]))
    o, _ = naive_quasar(q, k, v, beta)
    gate = (x @ p["g_proj.0.weight"].T) @ p["g_proj.1.weight"].T + p["g_proj.1.bias"]
    gate = gate.reshape(batch, length, heads, head_dim)
    y = o / torch.sqrt((o * o).mean(-1, keepdim=True) + eps) * p["o_norm.weight"] / (1 + torch.exp(-gate))
    return y.reshape(batch, length, heads * head_dim) @ p["o_proj.weight"].T


def randomize(layer, gen):
    """Give the parameters that start at constants (norm weight, gate bias) random values too."""
    with torch.no_grad():
        layer.o_norm.weight.copy_(torch.rand(layer.o_norm.weight.shape, generator=gen) + 0.5)
        layer.g_proj[1].bias.copy_(torch.randn(layer.g_proj[1].bias.shape, generator=gen))
        for name in ("q", "k", "v"):
            conv = getattr(layer, f"{name}_conv1d", None)
            if conv is not None and conv.bias is not None:
                conv.bias.copy_(torch.randn(conv.bias.shape, generator=gen) * 0.1)
    return layer


def test_benchmark_layer_has_the_fla_parameter_names_shapes_and_count():
    layer = QuasarAttentionReference(**BENCHMARK_LAYER)
    assert {name: list(t.shape) for name, t in layer.state_dict().items()} == BENCHMARK_PARAMETERS
    assert sum(p.numel() for p in layer.parameters()) == 1_120_840
    # beta_log = log U(1, 16), so beta = softplus(beta_log) = log(1 + U) lies in [log 2, log 17].
    assert torch.all(layer.beta_log >= 0) and torch.all(layer.beta_log <= math.log(16))
    beta = F.softplus(layer.beta_log.detach())
    assert torch.all(beta >= math.log(2) - 1e-6) and torch.all(beta <= math.log(17) + 1e-6)


@pytest.mark.parametrize(
    "config",
    [
        {"hidden_size": 64, "head_dim": 16, "num_heads": 2},
        {"hidden_size": 48, "head_dim": 8, "num_heads": 3, "conv_size": 3, "conv_bias": True, "norm_eps": 1e-3},
        {"hidden_size": 32, "head_dim": 8, "num_heads": 2, "use_short_conv": False},
    ],
    ids=["default", "conv-bias", "no-conv"],
)
def test_layer_equals_a_slow_float64_computation(gen, config):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(**config), gen)
    x = torch.randn(2, 70, config["hidden_size"], generator=gen, dtype=torch.float64)
    out, _, _ = layer(x)
    expected = slow_layer(dict(layer.named_parameters()), x, layer.norm_eps)
    assert out.dtype == torch.float64 and out.shape == x.shape
    assert relative_error(out, expected) < 1e-10, f"seed {gen.initial_seed()}"


def test_benchmark_layer_output_in_float32(gen):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(**BENCHMARK_LAYER), gen)
    x = torch.randn(1, 100, 512, generator=gen)
    out, attentions, cache = layer(x)
    assert attentions is None and cache is None
    assert out.dtype == torch.float32 and out.shape == (1, 100, 512)
    assert relative_error(out, slow_layer(dict(layer.named_parameters()), x, 1e-5)) < 1e-5


def test_layer_computes_in_float32_under_bf16_input_autocast_and_weights(gen):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=4), gen)
    x = torch.randn(2, 90, 64, generator=gen)
    reference, _, _ = layer(x)
    out_bf16_input, _, _ = layer(x.bfloat16())
    assert out_bf16_input.dtype == torch.float32
    assert torch.equal(out_bf16_input, layer(x.bfloat16().float())[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_autocast, _, _ = layer(x)
    assert out_autocast.dtype == torch.float32 and torch.equal(out_autocast, reference)
    rounded = {name: t.bfloat16().float() for name, t in layer.state_dict().items()}
    bf16_layer = QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=4).to(torch.bfloat16)
    bf16_layer.load_state_dict(rounded)
    out_bf16_weights, _, _ = bf16_layer(x)
    assert out_bf16_weights.dtype == torch.float32
    assert torch.equal(out_bf16_weights, reference_layer_forward(rounded, x))


def test_short_conv_equals_torch_conv1d_with_left_padding(gen):
    torch.manual_seed(gen.initial_seed())
    layer = QuasarAttentionReference(hidden_size=32, head_dim=8, num_heads=2, conv_bias=True)
    x = torch.randn(2, 30, 32, generator=gen)
    projected = layer.q_proj(x).detach()
    conv = layer.q_conv1d
    expected = F.silu(F.conv1d(projected.transpose(1, 2), conv.weight, conv.bias, padding=3, groups=16)[..., :30])
    got = _causal_conv_silu(projected, conv.weight.detach(), conv.bias.detach())
    assert torch.allclose(got, expected.transpose(1, 2).detach(), rtol=1e-5, atol=1e-6)


def test_layer_is_causal(gen):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=2), gen)
    x = torch.randn(1, 150, 64, generator=gen, dtype=torch.float64)
    t = 80
    out, _, _ = layer(x)
    x2 = x.clone()
    x2[:, t] += 1
    out2, _, _ = layer(x2)
    assert torch.equal(out2[:, :t], out[:, :t])
    assert not torch.allclose(out2[:, t], out[:, t])


def test_state_dict_round_trips_and_the_functional_entry_agrees(gen):
    torch.manual_seed(gen.initial_seed())
    source = randomize(QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=2), gen)
    target = QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=2)
    x = torch.randn(1, 50, 64, generator=gen)
    assert not torch.equal(target(x)[0], source(x)[0])
    target.load_state_dict(source.state_dict())
    assert torch.equal(target(x)[0], source(x)[0])
    assert torch.equal(reference_layer_forward(source.state_dict(), x), source(x)[0])


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda sd: sd.update(A_log=torch.zeros(2)), "unexpected 'A_log'"),
        (lambda sd: sd.pop("beta_log"), "missing 'beta_log'"),
        (lambda sd: sd.update({"o_proj.weight": torch.zeros(10, 10)}), r"'o_proj.weight' expected \[64, 32\]"),
        (lambda sd: sd.pop("k_conv1d.weight"), "short conv weights must be all"),
    ],
)
def test_bad_parameters_are_named(change, message):
    params = dict(QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=2).state_dict())
    change(params)
    with pytest.raises(ValueError, match=message):
        reference_layer_forward(params, torch.randn(1, 5, 64))


def test_layer_refuses_what_it_does_not_compute():
    with pytest.raises(ValueError, match="mode"):
        QuasarAttentionReference(hidden_size=32, head_dim=8, num_heads=2, mode="parallel")
    layer = QuasarAttentionReference(hidden_size=32, head_dim=8, num_heads=2, mode="fused_recurrent")
    x = torch.randn(1, 5, 32)
    with pytest.raises(ValueError, match="past_key_values and use_cache"):
        layer(x, use_cache=True)
    with pytest.raises(TypeError, match="cos"):
        layer(x, cos=torch.zeros(1))
    with pytest.raises(ValueError, match="hidden_states: expected shape"):
        layer(x[0])


def test_attention_mask_runs_each_row_alone_and_zeroes_padding(gen):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(hidden_size=32, head_dim=8, num_heads=2), gen)
    x = torch.randn(2, 40, 32, generator=gen)
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[1, :12] = 0
    out, _, _ = layer(x, attention_mask=mask)
    assert torch.equal(out[1, :12], torch.zeros(12, 32))
    assert torch.allclose(out[1, 12:], layer(x[1:, 12:])[0][0], rtol=1e-6, atol=1e-7)
    assert torch.allclose(out[0], layer(x[:1])[0][0], rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="attention_mask: expected shape"):
        layer(x, attention_mask=mask[:1])


def test_cu_seqlens_restarts_the_state_and_the_conv(gen):
    torch.manual_seed(gen.initial_seed())
    layer = randomize(QuasarAttentionReference(hidden_size=32, head_dim=8, num_heads=2), gen)
    x = torch.randn(1, 50, 32, generator=gen)
    out, _, _ = layer(x, cu_seqlens=torch.tensor([0, 20, 20, 50]))
    assert torch.equal(out[:, :20], layer(x[:, :20])[0])
    assert torch.allclose(out[:, 20:], layer(x[:, 20:])[0], rtol=1e-6, atol=1e-7)
    assert not torch.allclose(out[:, 20:], layer(x)[0][:, 20:])
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(x, cu_seqlens=torch.tensor([0, 30, 20, 50]))
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(x, cu_seqlens=torch.tensor([0, 20]))


# --- relative_error --------------------------------------------------------------------------


def test_relative_error_values():
    b = torch.ones(100, dtype=torch.float64)
    a = b.clone()
    a[0] += 1
    assert relative_error(a, b) == pytest.approx(0.1, rel=1e-15)
    assert relative_error(b, b) == 0.0
    assert relative_error(torch.zeros(3), torch.zeros(3)) == 0.0
    assert relative_error(torch.ones(3), torch.zeros(3)) == math.inf
    a[5] = float("nan")
    assert relative_error(a, b) == math.inf
    assert relative_error(b, a) == math.inf
    with pytest.raises(ValueError, match="shapes differ"):
        relative_error(torch.ones(3), torch.ones(4))


def test_relative_error_in_steps_matches_one_norm(gen, monkeypatch):
    a = torch.randn(7, 13, generator=gen).bfloat16()
    b = torch.randn(7, 13, generator=gen, dtype=torch.float64)
    expected = (torch.linalg.norm(a.double() - b) / torch.linalg.norm(b)).item()
    monkeypatch.setattr(quasar.reference, "_ELEMENTS_PER_STEP", 10)
    assert relative_error(a, b) == pytest.approx(expected, rel=1e-12)


# --- full length -----------------------------------------------------------------------------


@pytest.mark.slow
def test_chunk_reference_runs_65536_tokens_on_cpu_in_reasonable_time(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 1, 65_536, 8, 64, 64, dtype=torch.float32)
    started = time.perf_counter()
    o, final = chunk_quasar_reference(q, k, v, beta, output_final_state=True)
    elapsed = time.perf_counter() - started
    assert elapsed < 60, f"chunk reference took {elapsed:.1f} s at T=65,536"
    assert torch.isfinite(o).all() and torch.isfinite(final).all()


def test_float32_matmul_precision_is_restored(gen):
    q, k, v, beta, _ = make_core_inputs(gen, 1, 100, 2, 16, 16, dtype=torch.float32)
    expected, _ = chunk_quasar_reference(q, k, v, beta)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        out, _ = chunk_quasar_reference(q, k, v, beta)
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(previous)
    assert torch.equal(out, expected)
