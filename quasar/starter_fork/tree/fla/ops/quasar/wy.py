"""The WY factors of every chunk (pass 0 of the chunked form): W = A D K and U = A D V.

With D = diag(alpha) and A = (I + strict_tril(D K K^T))^-1 for one chunk of C = 64 tokens, the
chunk's update of the state is S <- S + K^T (U - W S). W and U depend on the chunk alone, so this
pass runs one program per (chunk, head), all at once, and the sequential passes after it
(chunk.py, chunk_intra_token_parallel.py) only multiply by them. They are stored in the inputs'
dtype, as upstream fla stores its ``w`` and ``u``.

With :class:`~fla.ops.quasar.layer_kernels.ConvolvedInputs` the pass convolves k or v itself as it
loads them from the layer's projections; k convolved here is also written out, for the passes
after this one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.ops.quasar.forward_substitution import BLOCK_ROWS, block_solve, chunk_factors, load_rows, store_block
from fla.ops.quasar.layer_kernels import ConvolvedInputs, load_convolved_rows
from fla.ops.quasar.segments import Spans, span_of
from fla.utils import IS_AMD


# One compilation for every length (see fla.ops.quasar.chunk.chunk_quasar_segment_kernel).
@triton.jit(do_not_specialize=["chunks_per_sequence"])
def chunk_quasar_wy_kernel(
    k,
    v,
    beta,
    w,
    u,
    proj,
    proj_stride,
    conv_weight,
    cu_seqlens,
    chunk_indices,
    seq_len,
    chunks_per_sequence,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
    INVERSE: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    CONV_K: tl.constexpr,
    CONV_V: tl.constexpr,
    TAPS: tl.constexpr,
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    bos, T, t_first = span_of(i_c, cu_seqlens, chunk_indices, seq_len, chunks_per_sequence, 4 * BLOCK_ROWS, IS_VARLEN)
    b_beta = tl.load(beta + i_h).to(tl.float32)
    r = t_first + tl.arange(0, BLOCK_ROWS)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    if CONV_K or CONV_V:
        # The chunk's k and v, convolved from the projections, go to memory (k for the passes
        # after this one; v over U's rows, which only this program writes, later) and are read
        # back below as the unfused pass reads them, once every thread's stores are done. A loop
        # of 16-row blocks, not unrolled, keeps the taps' loads of one block in registers at once.
        for block in tl.range(0, 4, num_stages=1):
            rows = r + block * BLOCK_ROWS
            if CONV_K:
                b_k = load_convolved_rows(proj, proj_stride, conv_weight, bos, rows, T, H * K + i_h * K, K, BK, TAPS)
                store_block(k, b_k, bos, rows, o_k, T, i_h, H, K)
            if CONV_V:
                b_v = load_convolved_rows(proj, proj_stride, conv_weight, bos, rows, T, 2 * H * K + i_h * V, V, BV,
                                          TAPS)
                store_block(u, b_v, bos, rows, o_v, T, i_h, H, V)
        tl.debug_barrier()
    if CONV_V:
        v_rows = u
    else:
        v_rows = v
    k0 = load_rows(k, bos, r, T, i_h, H, K, BK)
    k1 = load_rows(k, bos, r + BLOCK_ROWS, T, i_h, H, K, BK)
    k2 = load_rows(k, bos, r + 2 * BLOCK_ROWS, T, i_h, H, K, BK)
    k3 = load_rows(k, bos, r + 3 * BLOCK_ROWS, T, i_h, H, K, BK)
    # The chunk again as one [4, 16, BK] block, loaded directly: reshaping a [64, BK] load made
    # this pass 12% slower on an H100 (3.8 -> 4.2 ms at 1M).
    rows = t_first + tl.arange(0, 4)[:, None] * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)[None, :]
    k_blocks = tl.load(k + ((bos + rows)[:, :, None] * H + i_h) * K + o_k[None, None, :],
                       mask=(rows < T)[:, :, None] & (o_k < K)[None, None, :], other=0.0)
    a0, a1, a2, a3, i0, i1, i2, i3, l10, l20, l21, l30, l31, l32 = chunk_factors(
        k0, k1, k2, k3, k_blocks, b_beta, PRECISION, INVERSE,
    )
    w0, w1, w2, w3 = block_solve(
        i0, i1, i2, i3, l10, l20, l21, l30, l31, l32,
        a0[:, None] * k0.to(tl.float32), a1[:, None] * k1.to(tl.float32),
        a2[:, None] * k2.to(tl.float32), a3[:, None] * k3.to(tl.float32), PRECISION,
    )
    store_block(w, w0, bos, r, o_k, T, i_h, H, K)
    store_block(w, w1, bos, r + BLOCK_ROWS, o_k, T, i_h, H, K)
    store_block(w, w2, bos, r + 2 * BLOCK_ROWS, o_k, T, i_h, H, K)
    store_block(w, w3, bos, r + 3 * BLOCK_ROWS, o_k, T, i_h, H, K)
    v0 = load_rows(v_rows, bos, r, T, i_h, H, V, BV).to(tl.float32)
    v1 = load_rows(v_rows, bos, r + BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
    v2 = load_rows(v_rows, bos, r + 2 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
    v3 = load_rows(v_rows, bos, r + 3 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
    u0, u1, u2, u3 = block_solve(
        i0, i1, i2, i3, l10, l20, l21, l30, l31, l32,
        a0[:, None] * v0, a1[:, None] * v1, a2[:, None] * v2, a3[:, None] * v3, PRECISION,
    )
    store_block(u, u0, bos, r, o_v, T, i_h, H, V)
    store_block(u, u1, bos, r + BLOCK_ROWS, o_v, T, i_h, H, V)
    store_block(u, u2, bos, r + 2 * BLOCK_ROWS, o_v, T, i_h, H, V)
    store_block(u, u3, bos, r + 3 * BLOCK_ROWS, o_v, T, i_h, H, V)


def launch_options(num_warps: int, maxnreg: int) -> dict:
    """The WY kernel's launch options: ``num_warps``, and ptxas's cap on registers per thread
    (``maxnreg``; 0 leaves it to the compiler). The cap trades a few spills for more programs per
    SM: this pass is bound by latency (a chain of small dots per chunk), not by memory. ROCm's
    Triton has no such option."""
    if maxnreg and not IS_AMD:
        return {"num_warps": num_warps, "maxnreg": maxnreg}
    return {"num_warps": num_warps}


def chunk_quasar_wy(
    k: torch.Tensor | None,
    v: torch.Tensor | None,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    chunks: Spans,
    *,
    precision: str,
    num_warps: int,
    inverse: str = "substitution",
    maxnreg: int = 0,
    convolved: ConvolvedInputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``W [1, T, H, K]`` and ``U [1, T, H, V]`` of every chunk of ``chunks``, and k.

    ``k [1, T, H, K]``, ``v [1, T, H, V]`` (sequences laid end to end), ``beta [H]`` fp32;
    ``inverse`` says how the diagonal blocks are inverted (forward_substitution.INVERSES);
    ``maxnreg`` caps the registers per thread (0: the compiler's choice; CUDA only).
    With ``convolved`` (sequences of equal length only), k or v is None when its ``fused`` names
    it, and is convolved here from the projections. Returns W, U and k (the one given, or the one
    convolved here); W has k's dtype, U v's.
    """
    fused = "" if convolved is None else convolved.fused
    if convolved is not None and cu_seqlens is not None:
        raise ValueError("convolved inputs take sequences of equal length (no cu_seqlens)")
    if k is not None:
        _, T, H, K = k.shape
    else:
        rows, tokens, H, K = convolved.shape(beta.shape[0])
        T = rows * tokens
    V = v.shape[-1] if v is not None else K
    if k is None:
        k = convolved.projections.new_empty(1, T, H, K)
    w = torch.empty_like(k)
    u = torch.empty(1, T, H, V, device=k.device, dtype=k.dtype if v is None else v.dtype)
    projections = None if convolved is None else convolved.projections
    chunk_quasar_wy_kernel[(chunks.count, H)](
        k, v, beta, w, u, projections, 0 if projections is None else projections.stride(1),
        None if convolved is None else convolved.weight,
        cu_seqlens, chunks.indices, chunks.seq_len, chunks.per_sequence,
        H=H, K=K, V=V, BK=max(16, triton.next_power_of_2(K)), BV=max(16, triton.next_power_of_2(V)),
        PRECISION=precision, INVERSE=inverse, IS_VARLEN=chunks.is_varlen,
        CONV_K="k" in fused, CONV_V="v" in fused, TAPS=1 if convolved is None else convolved.taps,
        **launch_options(num_warps, maxnreg),
    )
    return w, u, k
