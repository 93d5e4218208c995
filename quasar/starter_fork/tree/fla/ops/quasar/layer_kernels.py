"""Fused kernels for the parts of the QuasarAttention layer around the core.

- ``causal_conv_silu``: the causal depthwise convolution (kernel W) + SiLU of q, k and v in one
  launch, reading the fused projection in place (a strided view) and writing the three results
  as separate contiguous tensors, continuing from a cache of the previous W inputs;
- ``rms_norm_gated``: y = RMSNorm(o) * w * sigmoid(g) per head, fp32 inside, one pass.

Their PyTorch references are ``fla.modules.ShortConvolution`` and ``fla.modules.FusedRMSNormGated``
(the layer's modules, whose parameters these take); the tests compare them on random inputs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def causal_conv_silu_kernel(
    x,
    w,
    cache,
    y,
    B,
    T,
    stride_xb,
    stride_xt,
    C: tl.constexpr,
    CG: tl.constexpr,
    W: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    HAS_CACHE: tl.constexpr,
):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    m_c = o_c < C
    acc = tl.zeros([BT, BC], dtype=tl.float32)
    for s in tl.static_range(W):
        r = o_t - s
        m_x = ((r >= 0) & (r < T))[:, None] & m_c[None, :]
        b_x = tl.load(x + i_b.to(tl.int64) * stride_xb + r.to(tl.int64)[:, None] * stride_xt + o_c[None, :],
                      mask=m_x, other=0.0).to(tl.float32)
        if HAS_CACHE:
            if i_t == 0:  # only the first block of tokens reaches back into the cache
                # x_{-j} is cache[..., W - j] (the cache holds the last W inputs, the newest last).
                m_h = ((r < 0) & (r >= -W))[:, None] & m_c[None, :]
                b_x += tl.load(cache + (i_b * C + o_c[None, :]) * W + (W + r)[:, None], mask=m_h, other=0.0).to(tl.float32)
        b_w = tl.load(w + o_c * W + (W - 1 - s), mask=m_c, other=0.0).to(tl.float32)
        acc += b_x * b_w[None, :]
    acc = acc * tl.sigmoid(acc)
    # A block of channels lies inside one group (BC divides CG): its columns stay contiguous.
    group = (i_c * BC) // CG
    o_g = (i_c * BC) % CG + tl.arange(0, BC)
    p_y = ((group.to(tl.int64) * B + i_b) * T + o_t[:, None]) * CG + o_g[None, :]
    tl.store(y + p_y, acc.to(y.dtype.element_ty), mask=(o_t < T)[:, None] & m_c[None, :])


def causal_conv_silu(
    x: torch.Tensor, weight: torch.Tensor, cache: torch.Tensor | None, groups: int, output_final_state: bool,
    block: tuple[int, int, int] = (16, 64, 4),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SiLU(causal depthwise conv(x)) for ``x [B, T, C]`` (any row stride; unit column stride),
    ``weight [C, W]``, ``cache [B, C, W]`` (the W inputs before x, newest last) or None (zeros).

    Returns ``y [groups, B, T, C / groups]`` in x's dtype (group g holds channels g*C/groups on)
    and, with ``output_final_state``, the cache after x ``[B, C, W]``. ``block`` is (tokens,
    channels, warps) per program: small blocks were fastest on an H100 (benchmarks/RESULTS.md).
    """
    B, T, C = x.shape
    W = weight.shape[-1]
    if x.stride(-1) != 1 or C % groups:
        raise ValueError(f"x must have unit column stride and C divisible by {groups}; got {tuple(x.stride())}, C={C}")
    y = torch.empty(groups, B, T, C // groups, device=x.device, dtype=x.dtype)
    weight = weight.reshape(C, W).contiguous()
    if cache is not None:
        cache = cache.to(x.dtype).contiguous()
    BT, BC, warps = block
    BC = min(BC, (C // groups) & -(C // groups))  # a power of two dividing the group's width
    if T:
        causal_conv_silu_kernel[(triton.cdiv(T, BT), triton.cdiv(C, BC), B)](
            x, weight, cache, y, B, T, x.stride(0), x.stride(1),
            C=C, CG=C // groups, W=W, BT=BT, BC=BC, HAS_CACHE=cache is not None, num_warps=warps,
        )
    final = None
    if output_final_state:
        history = cache if cache is not None else x.new_zeros(B, C, W)
        final = torch.cat([history, x[:, -W:].transpose(1, 2)], 2)[..., -W:].contiguous()
    return y, final


@triton.jit
def rms_norm_gated_kernel(o, g, w, y, rows, eps, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    i_r = tl.program_id(0)
    o_r = i_r * BR + tl.arange(0, BR)
    o_d = tl.arange(0, BD)
    mask = (o_r < rows)[:, None] & (o_d < D)[None, :]
    p = o_r.to(tl.int64)[:, None] * D + o_d[None, :]
    b_o = tl.load(o + p, mask=mask, other=0.0).to(tl.float32)
    b_g = tl.load(g + p, mask=mask, other=0.0).to(tl.float32)
    b_w = tl.load(w + o_d, mask=o_d < D, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(b_o * b_o, 1) / D + eps)
    b_y = b_o * rstd[:, None] * b_w[None, :] * tl.sigmoid(b_g)
    tl.store(y + p, b_y.to(y.dtype.element_ty), mask=mask)


def rms_norm_gated(o: torch.Tensor, g: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``o / sqrt(mean(o^2) + eps) * weight * sigmoid(g)`` over the last dimension (fp32 inside),
    in o's dtype; ``g`` has o's shape (any dtype)."""
    if g.shape != o.shape or weight.shape != o.shape[-1:]:
        raise ValueError(f"o, g and weight must be [..., D], [..., D], [D]; got {tuple(o.shape)}, {tuple(g.shape)}, {tuple(weight.shape)}")
    o, g = o.contiguous(), g.contiguous()
    D = o.shape[-1]
    rows = o.numel() // D if D else 0
    y = torch.empty_like(o)
    BR = 64
    if rows:
        rms_norm_gated_kernel[(triton.cdiv(rows, BR),)](
            o, g, weight.contiguous(), y, rows, eps, D=D, BR=BR, BD=max(16, triton.next_power_of_2(D)), num_warps=4,
        )
    return y
