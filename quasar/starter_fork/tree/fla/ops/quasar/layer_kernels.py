"""The fused kernel around the QuasarAttention core: ``causal_conv_silu``, the causal depthwise
convolution (kernel W) + SiLU of q, k and v in one launch, reading the fused projection in place
(a strided view whose first W - 1 rows are the inputs before the sequence) and writing the three
results as separate contiguous tensors. (The RMSNorm + gate runs inside the core's output pass,
``fla.ops.quasar.chunk.chunk_quasar_norm_gated``.)

The core's output pass can also convolve q itself as it loads it (``load_convolved_rows``,
:class:`ConvolvedInputs`, tuning.json's ``fused_conv``), so that q is never written to memory
first; the kernel here then writes only k and v.

Its PyTorch reference is ``fla.modules.ShortConvolution`` (the layer's module, whose weights it
takes); the tests compare them on random inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# Those the core's kernels can convolve as they load them: q, in the output pass. k and v in the
# WY pass cost that pass more than the conv kernel's time they saved (benchmarks/RESULTS.md).
CORE_CONVOLVED = "q"
# The conv kernel's (tokens, channels, warps) per program: 8 x 512 with 4 warps ran at 2.47 TB/s
# on an H100, 1% ahead of 16 x 256 in two sessions' interleaved repeats and 2.7 times the 16 x 64
# blocks of the conv that read a separate cache (benchmarks/RESULTS.md).
CONV_BLOCK = (8, 512, 4)


@dataclass(frozen=True)
class ConvolvedInputs:
    """q, k and v given as the projections they are convolved from, for the core's kernels.

    ``projections [B, W - 1 + T, >= 3 H D]`` (unit column stride, any row stride) holds q, k and v
    before the convolution side by side in its first 3 H D columns, after the W - 1 rows of
    inputs before the tile, as :func:`causal_conv_silu` reads it; ``weight [3 H D, W]`` are the
    three convolutions' weights; ``fused`` names the ones the core computes itself
    (:data:`CORE_CONVOLVED`), SiLU(conv) of their columns, as :func:`causal_conv_silu` would write
    them.
    """

    projections: torch.Tensor
    weight: torch.Tensor
    fused: str

    @property
    def taps(self) -> int:
        """W, the convolutions' kernel size."""
        return self.weight.shape[1]

    def shape(self, heads: int) -> tuple[int, int, int, int]:
        """``(B, T, H, D)``: the shape of q (and of k and v) these projections give."""
        rows, tokens = self.projections.shape[0], self.projections.shape[1] - (self.taps - 1)
        return rows, tokens, heads, self.weight.shape[0] // (3 * heads)


@triton.jit
def convolve_silu(first, stride_t, w, w_col0, rows, cols, row_mask, col_mask, W: tl.constexpr):
    """SiLU(sum_s w[w_col0 + c, W - 1 - s] x[r - s, c]) of a block of ``rows`` r and ``cols`` c,
    in fp32: x's row r at ``first + r * stride_t`` (the W - 1 rows before row 0 are the inputs
    before the sequence), ``w`` a contiguous ``[C, W]`` weight. ``row_mask`` zeroes x's rows
    outside it, ``col_mask`` (given with a ``row_mask``) its columns and their weights; None: no
    mask. The one sum of the conv kernel and of the passes that convolve as they load, so both
    give the same values."""
    acc = tl.zeros([rows.shape[0], cols.shape[0]], dtype=tl.float32)
    for s in tl.static_range(W):
        p_x = first + (rows - s).to(tl.int64)[:, None] * stride_t + cols[None, :]
        p_w = w + (w_col0 + cols) * W + (W - 1 - s)
        if col_mask is None:
            if row_mask is None:
                b_x = tl.load(p_x)
            else:
                b_x = tl.load(p_x, mask=row_mask[:, None], other=0.0)
            b_w = tl.load(p_w)
        else:
            b_x = tl.load(p_x, mask=row_mask[:, None] & col_mask[None, :], other=0.0)
            b_w = tl.load(p_w, mask=col_mask, other=0.0)
        acc += b_x.to(tl.float32) * b_w.to(tl.float32)[None, :]
    return acc * tl.sigmoid(acc)


@triton.jit
def load_convolved_rows(x, stride_t, w, bos, rows, T, col0, D: tl.constexpr, BD: tl.constexpr, W: tl.constexpr):
    """SiLU(causal conv) of columns ``col0 .. col0 + D`` of a projections buffer (see
    :class:`ConvolvedInputs`; ``w`` its contiguous ``[C, W]`` weight) at ``rows`` of the sequence
    whose first token is row ``bos`` of the batch laid end to end (sequences of equal length T):
    a ``[len(rows), BD]`` block in the buffer's dtype, rows at or past T and columns past D zero,
    the values :func:`causal_conv_silu` writes."""
    cols = tl.arange(0, BD)
    # Each sequence's rows come after its own W - 1 rows of earlier inputs.
    first = x + (bos + (bos // T) * (W - 1) + (W - 1)) * stride_t + col0
    acc = convolve_silu(first, stride_t, w, col0, rows, cols, rows < T, cols < D, W)
    return acc.to(x.dtype.element_ty)


@triton.jit
def causal_conv_silu_kernel(
    x,
    w,
    y,
    B,
    T,
    stride_xb,
    stride_xt,
    CG: tl.constexpr,
    W: tl.constexpr,
    BT: tl.constexpr,
    BC: tl.constexpr,
    EVEN_T: tl.constexpr,
):
    i_t, i_c, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = i_t * BT + tl.arange(0, BT)
    o_c = i_c * BC + tl.arange(0, BC)
    # Row W - 1 of the batch row is the sequence's first token; the W - 1 rows before it hold the
    # inputs before the sequence, so every shifted row exists and only the tail needs a mask.
    first = x + i_b.to(tl.int64) * stride_xb + (W - 1) * stride_xt
    if EVEN_T:
        acc = convolve_silu(first, stride_xt, w, 0, o_t, o_c, None, None, W)
    else:
        acc = convolve_silu(first, stride_xt, w, 0, o_t, o_c, o_t < T, None, W)
    # A block of channels lies inside one group (BC divides CG): its columns stay contiguous.
    group = (i_c * BC) // CG
    # BC divides CG, so the block's first column in its group is a multiple of BC; said, so that
    # the stores are vectorised (without it Triton 3.6 stored 2 bytes at a time: the conv took
    # 2.58 ms instead of 2.52 at 1M on an H100).
    o_g = tl.multiple_of((i_c * BC) % CG, BC) + tl.arange(0, BC)
    p_y = y + ((group.to(tl.int64) * B + i_b) * T + o_t[:, None]) * CG + o_g[None, :]
    if EVEN_T:
        tl.store(p_y, acc.to(y.dtype.element_ty))
    else:
        tl.store(p_y, acc.to(y.dtype.element_ty), mask=(o_t < T)[:, None])


def causal_conv_silu(
    x: torch.Tensor, weight: torch.Tensor, groups: int, block: tuple[int, int, int] = CONV_BLOCK,
) -> torch.Tensor:
    """SiLU(causal depthwise conv) of ``x [B, W - 1 + T, >= C]`` (any row stride, unit column
    stride), whose first W - 1 rows are the inputs before the sequence (zeros at its start, or the
    previous tokens' inputs), with ``weight [C, W]``; only x's first C columns are read.

    Returns ``y [groups, B, T, C / groups]`` in x's dtype (group g holds channels g*C/groups on).
    ``block`` is (tokens, channels, warps) per program (:data:`CONV_BLOCK`).
    """
    C, W = weight.shape
    B, rows = x.shape[:2]
    T = rows - (W - 1)
    if x.dim() != 3 or x.stride(-1) != 1 or T < 0 or x.shape[-1] < C or C % groups:
        raise ValueError(f"x must be [B, W - 1 + T, >= C] with unit column stride (W = {W}, C = {C}, divisible "
                         f"by {groups}); got {tuple(x.shape)} with strides {x.stride()}")
    CG = C // groups
    y = torch.empty(groups, B, T, CG, device=x.device, dtype=x.dtype)
    BT, BC, warps = block
    BC = min(BC, CG & -CG)  # a power of two dividing the group's width
    if T and B:
        causal_conv_silu_kernel[(triton.cdiv(T, BT), C // BC, B)](
            x, weight.contiguous(), y, B, T, x.stride(0), x.stride(1),
            CG=CG, W=W, BT=BT, BC=BC, EVEN_T=T % BT == 0, num_warps=warps,
        )
    return y
