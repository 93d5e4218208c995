"""The fused conv kernel of the starter fork (fla/ops/quasar/layer_kernels.py) and the layer's
tiled paths (with gradients, and the fused one without, its output pass convolving q itself or
not), run by Triton's interpreter on the CPU against their PyTorch references; and
the two-level scan at every segment size against the float64 recurrence."""

from __future__ import annotations

import textwrap

import pytest

from quasar.starter_fork import copy_starter_tree
from tests.processes import script_results

# TRITON_INTERPRET must be set before triton is imported: a child process.
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, sys.argv[1])
    import fla.ops.quasar.tuning as tuning
    from fla.layers.quasar import QuasarAttention
    from fla.models import Cache
    from fla.modules import FusedRMSNormGated, ShortConvolution
    from fla.ops.quasar.chunk import chunk_quasar_fwd
    from fla.ops.quasar.layer_kernels import CONV_BLOCK, causal_conv_silu
    from quasar.reference import QuasarAttentionReference, naive_quasar, relative_error
    from quasar.reference.layer import reference_layer_forward

    torch.manual_seed(0)
    res = {}
    # three convolutions from a strided view of a wider tensor whose first W - 1 rows are the
    # inputs before the sequence (a cache, or zeros), with and without a ragged last block of
    # tokens, in blocks of all of a group's channels and of part of them
    for taps in (4, 2):
        convs = [ShortConvolution(32, taps) for _ in range(3)]
        weight = torch.cat([m.weight for m in convs]).squeeze(1)
        for name, length, cache in (("conv-cache", 37, torch.randn(2, 96, taps)), ("conv-zero", 48, None)):
            x = torch.randn(2, length, 100)[..., :96]
            history = (torch.zeros(2, taps - 1, 100) if cache is None
                       else F.pad(cache[..., 1:].transpose(1, 2), (0, 4)))
            padded = torch.cat([history, torch.randn(2, length, 100)], 1)
            padded[:, taps - 1:, :96] = x
            ref = [m(x[..., 32 * i:32 * (i + 1)].contiguous(),
                     cache=None if cache is None else cache[:, 32 * i:32 * (i + 1)])[0] for i, m in enumerate(convs)]
            for kind, block in (("", CONV_BLOCK), ("-narrow", (16, 16, 1))):
                y = causal_conv_silu(padded, weight, 3, block)
                res[f"{name}{kind}-{taps}"] = max(relative_error(y[i], ref[i]) for i in range(3))

    # the whole layer: one pass, tiles of 128 tokens, and decoding with a cache
    layer = QuasarAttention(hidden_size=64, head_dim=16, num_heads=4, layer_idx=0)
    reference = QuasarAttentionReference(hidden_size=64, head_dim=16, num_heads=4)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(1, 200, 64)
    expected = reference(x)[0]
    res["layer"] = relative_error(layer(x)[0], expected)
    # with gradients the modules run: each parameter's gradient, along a random direction, against
    # central differences of the float64 reference (forward only, so independent of autograd)
    layer(x)[0].square().sum().backward()
    params = {n: p.detach().double() for n, p in layer.named_parameters()}
    errors = []
    for name, p in layer.named_parameters():
        direction = torch.randn_like(params[name])
        sides = [reference_layer_forward({**params, name: params[name] + step * direction}, x.double()).square().sum()
                 for step in (1e-4, -1e-4)]
        numeric = (sides[0] - sides[1]) / 2e-4
        errors.append(abs(float((p.grad.double() * direction).sum() - numeric)) / abs(float(numeric)))
    res["layer-gradients"] = max(errors)
    with torch.inference_mode():  # without gradients the convolutions run inside the core's kernels
        res["layer-inference"] = relative_error(layer(x)[0], expected)
    tuning.TUNING_FILE = Path(sys.argv[2])
    tuning.TUNING_FILE.write_text('{"layer_tile_tokens": 128, "segment_chunks": 1}')
    tuning.load_tuning.cache_clear()
    res["layer-tiles"] = relative_error(layer(x)[0], expected)
    with torch.inference_mode():  # without gradients each tile projects straight into the output
        res["layer-tiles-inference"] = relative_error(layer(x)[0], expected)
    cache = Cache()
    pieces = [layer(x[:, :130], past_key_values=cache, use_cache=True)[0]]
    pieces += [layer(x[:, t:t + 1], past_key_values=cache, use_cache=True)[0] for t in range(130, 132)]
    pieces.append(layer(x[:, 132:], past_key_values=cache, use_cache=True)[0])
    res["layer-decoding"] = relative_error(torch.cat(pieces, 1), expected)
    # q convolved by the output pass as it loads it (fused_conv "q", the default) or written by the
    # conv kernel first (""), in tiles carrying the conv's inputs, on two batch rows; and tiles
    # shorter than fused_conv_min_tokens keeping the conv kernel for q
    import fla.layers.quasar as layer_module
    conv_kernel, channels = layer_module.causal_conv_silu, []

    def counted_conv(x, weight, *rest):
        channels.append(weight.shape[0])
        return conv_kernel(x, weight, *rest)

    layer_module.causal_conv_silu = counted_conv
    rows = torch.randn(2, 200, 64)
    rows_expected = reference(rows)[0]
    outputs = {}
    with torch.inference_mode():
        for fused, least in (("", 0), ("q", 0), ("q", 4096)):
            tuning.TUNING_FILE.write_text(json.dumps({"layer_tile_tokens": 128, "segment_chunks": 1,
                                                      "fused_conv": fused, "fused_conv_min_tokens": least}))
            tuning.load_tuning.cache_clear()
            channels.clear()
            outputs[fused, least] = layer(rows)[0]
            res[f"conv-kernel-channels-{fused}-{least}"] = channels[:]
    layer_module.causal_conv_silu = conv_kernel
    res["conv-q-in-output-pass"] = relative_error(outputs["q", 0], rows_expected)
    res["conv-q-by-conv-kernel"] = relative_error(outputs["", 0], rows_expected)
    res["conv-q-paths-against-each-other"] = relative_error(outputs["q", 0], outputs["", 0])
    tuning.TUNING_FILE.write_text('{"layer_tile_tokens": 128, "segment_chunks": 1}')
    tuning.load_tuning.cache_clear()
    with torch.inference_mode():
        cache = Cache()
        pieces = [layer(x[:, :130], past_key_values=cache, use_cache=True)[0]]
        pieces += [layer(x[:, t:t + 1], past_key_values=cache, use_cache=True)[0] for t in range(130, 132)]
        pieces.append(layer(x[:, 132:], past_key_values=cache, use_cache=True)[0])
        res["layer-decoding-inference"] = relative_error(torch.cat(pieces, 1), expected)

    # the two-level scan: every segment size, segments longer than the sequence, batch and states,
    # the transition in the state's program or its own
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 200, 2, 32, generator=g) for _ in range(3))
    k = k * 0.2
    beta = torch.rand(2, generator=g) * 2 + 0.1
    h0 = torch.randn(2, 2, 32, 32, generator=g) * 0.1
    ref_o, ref_s = naive_quasar(q.double(), k.double(), v.double(), beta.double(), h0.double(), output_final_state=True)
    for chunks, split in ((1, True), (2, False), (4, True)):
        variant = tuning.QuasarTuning(segment_chunks=chunks, split_transition=split)
        o, s = chunk_quasar_fwd(q, k, v, beta, h0, True, None, variant)
        res[f"segments-{chunks}"] = max(relative_error(o, ref_o), relative_error(s, ref_s))
    print(json.dumps(res))
    """
)


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    fork = tmp_path_factory.mktemp("kernel-layer") / "fork"
    copy_starter_tree(fork)
    return script_results(SCRIPT, [str(fork), str(fork / "tuning-test.json")], 280, TRITON_INTERPRET="1")


@pytest.mark.slow
@pytest.mark.parametrize(
    "case", [f"conv-{start}{kind}-{taps}" for start in ("cache", "zero") for kind in ("", "-narrow") for taps in (4, 2)]
)
def test_fused_conv_matches_the_modules(interpreted, case):
    assert interpreted[case] < 1e-5, interpreted


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    ["layer", "layer-inference", "layer-tiles", "layer-tiles-inference", "layer-decoding", "layer-decoding-inference"],
)
def test_fused_tiled_layer_matches_reference(interpreted, case):
    assert interpreted[case] < 1e-5, interpreted


@pytest.mark.slow
def test_output_pass_convolving_q_matches_the_conv_kernel_in_long_tiles(interpreted):
    # The same fp32 sums in the same order as the conv kernel's: the outputs agree to rounding.
    assert interpreted["conv-q-in-output-pass"] < 1e-5, interpreted
    assert interpreted["conv-q-by-conv-kernel"] < 1e-5, interpreted
    assert interpreted["conv-q-paths-against-each-other"] < 1e-6, interpreted
    # The conv kernel writes k and v (128 channels of 192) in fused tiles, all three in the others:
    # tiles of 128 and 72 tokens, fused from 0 tokens on, not from 4,096.
    assert interpreted["conv-kernel-channels-q-0"] == [128, 128], interpreted
    assert interpreted["conv-kernel-channels--0"] == [192, 192], interpreted
    assert interpreted["conv-kernel-channels-q-4096"] == [192, 192], interpreted


@pytest.mark.slow
def test_layer_gradients_match_finite_differences_of_the_reference(interpreted):
    # fp32 gradients against float64 differences: 1e-8 to 1e-5 for most parameters when right, and
    # about 1e-3 for k_proj (its path runs through every step's alpha and the recurrence; the
    # interpreter's fp32 sums round as the CPU's BLAS kernels do, 1.01e-3 on one machine, under
    # 1e-3 on another); a parameter cut off from the graph (no gradient, or a detached path) is off
    # by 100%.
    assert interpreted["layer-gradients"] < 1e-2, interpreted


@pytest.mark.slow
@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_two_level_scan_matches_naive_at_every_segment_size_and_split(interpreted, chunks):
    assert interpreted[f"segments-{chunks}"] < 1e-5, interpreted
