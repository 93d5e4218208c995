"""Upstream fla's path for ``quasar bench kernel --upstream``: the benchmark layer with upstream's
``chunk_delta_rule`` as its core, timed in a child process of its own (``--upstream-only``), where
fla-core's ``fla`` is the one on the import path, not the fork's (both packages are named ``fla``)."""

from __future__ import annotations

import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from quasar.bench.kernel_measurements import LAYER, time_core, time_forward
from quasar.reference import QuasarAttentionReference, relative_error


class UpstreamLayer(nn.Module):
    """The benchmark layer built from upstream fla's modules (``ShortConvolution``,
    ``FusedRMSNormGated``) with its ``chunk_delta_rule`` (beta := alpha, scale 1) as the core."""

    def __init__(self):
        super().__init__()
        from fla.modules import FusedRMSNormGated, ShortConvolution

        self.reference = QuasarAttentionReference(**LAYER, mode="chunk")
        params = dict(self.reference.named_parameters())
        width = LAYER["num_heads"] * LAYER["head_dim"]
        convs = [ShortConvolution(width, 4, bias=False, activation="silu") for _ in "qkv"]
        self.convs = nn.ModuleList(convs)
        for conv, name in zip(convs, "qkv", strict=True):
            conv.weight.data.copy_(params[f"{name}_conv1d.weight"])
        self.norm = FusedRMSNormGated(LAYER["head_dim"], activation="sigmoid", eps=1e-5)
        self.norm.weight.data.copy_(params["o_norm.weight"])

    def forward(self, x):
        from fla.ops.delta_rule import chunk_delta_rule

        r, H, D = self.reference, LAYER["num_heads"], LAYER["head_dim"]
        params = dict(r.named_parameters())
        q, k, v = (
            conv(F.linear(x, params[f"{name}_proj.weight"]))[0].unflatten(-1, (H, D))
            for conv, name in zip(self.convs, "qkv")
        )
        alpha = upstream_alpha(k, F.softplus(params["beta_log"].float()))
        o, _ = chunk_delta_rule(q, k, v, alpha.to(q.dtype), scale=1.0)
        g = F.linear(F.linear(x, params["g_proj.0.weight"]), params["g_proj.1.weight"], params["g_proj.1.bias"])
        y = self.norm(o, g.unflatten(-1, (H, D))).flatten(-2)
        return (F.linear(y, params["o_proj.weight"]),)


def upstream_alpha(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """alpha_t per token and head (fp32) for keys ``k [B, T, H, D]``."""
    lam = k.float().square().sum(-1)
    return -torch.expm1(-beta * lam) / (lam + 1e-8)


def upstream_main(args) -> int:
    torch.manual_seed(0)
    layer = UpstreamLayer().cuda()
    results = []
    for length in args.lengths:
        seconds, peak, spread = time_forward(layer, length, args.runs)
        results.append(
            {"length": length, "tokens_per_sec": length / seconds, "peak_gib": peak / 2**30, "spread": spread}
        )
        print(json.dumps(results[-1]), flush=True)
    from fla.ops.delta_rule import chunk_delta_rule

    alphas = {}

    def core(q, k, v, beta):
        if q.shape[1] not in alphas:
            alphas[q.shape[1]] = upstream_alpha(k, beta).to(q.dtype)
        return chunk_delta_rule(q, k, v, alphas[q.shape[1]], scale=1.0)

    length = max(args.lengths)
    seconds = time_core(core, length, args.runs)
    print(json.dumps({"core_length": length, "core_tokens_per_sec": length / seconds}), flush=True)
    if args.check:
        check_length = args.check_lengths[0]
        x = torch.randn(1, check_length, LAYER["hidden_size"], device="cuda")
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)[0]
        expected = layer.reference(x)[0]
        print(json.dumps({"upstream_check": check_length, "error": relative_error(out, expected)}), flush=True)
    (args.out / "upstream.json").write_text(json.dumps(results, indent=1))
    return 0
