"""The WY factors of every chunk (pass 0 of the chunked form): W = A D K and U = A D V.

With D = diag(alpha) and A = (I + strict_tril(D K K^T))^-1 for one chunk of C = 64 tokens, the
chunk's update of the state is S <- S + K^T (U - W S). W and U depend on the chunk alone, so this
pass runs one program per (chunk, head), all at once, and the sequential passes after it
(chunk.py, chunk_intra_token_parallel.py) only multiply by them. They are stored in the inputs'
dtype, as upstream fla stores its ``w`` and ``u``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.ops.quasar.forward_substitution import BLOCK_ROWS, block_solve, chunk_factors, load_rows, store_block
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
):
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    bos, T, t_first = span_of(i_c, cu_seqlens, chunk_indices, seq_len, chunks_per_sequence, 4 * BLOCK_ROWS, IS_VARLEN)
    b_beta = tl.load(beta + i_h).to(tl.float32)
    r = t_first + tl.arange(0, BLOCK_ROWS)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
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
    v0 = load_rows(v, bos, r, T, i_h, H, V, BV).to(tl.float32)
    v1 = load_rows(v, bos, r + BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
    v2 = load_rows(v, bos, r + 2 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
    v3 = load_rows(v, bos, r + 3 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32)
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
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    chunks: Spans,
    *,
    precision: str,
    num_warps: int,
    inverse: str = "substitution",
    maxnreg: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W [1, T, H, K]`` and ``U [1, T, H, V]`` (k's and v's dtypes) of every chunk of ``chunks``.

    ``k [1, T, H, K]``, ``v [1, T, H, V]`` (sequences laid end to end), ``beta [H]`` fp32;
    ``inverse`` says how the diagonal blocks are inverted (forward_substitution.INVERSES);
    ``maxnreg`` caps the registers per thread (0: the compiler's choice; CUDA only).
    """
    _, T, H, K = k.shape
    V = v.shape[-1]
    w = torch.empty_like(k)
    u = torch.empty_like(v)
    chunk_quasar_wy_kernel[(chunks.count, H)](
        k, v, beta, w, u, cu_seqlens, chunks.indices, chunks.seq_len, chunks.per_sequence,
        H=H, K=K, V=V, BK=max(16, triton.next_power_of_2(K)), BV=max(16, triton.next_power_of_2(V)),
        PRECISION=precision, INVERSE=inverse, IS_VARLEN=chunks.is_varlen,
        **launch_options(num_warps, maxnreg),
    )
    return w, u
