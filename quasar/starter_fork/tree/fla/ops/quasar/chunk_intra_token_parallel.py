"""The output pass of the chunked form, every token of a chunk in parallel.

For a chunk with queries Q, keys K, new values V' and the state S it starts from,

    O = Q S + tril_incl(Q K^T) V'

(inter-chunk part Q S plus the causal intra-chunk part); each token's output uses the state
after its own update, as the recurrence defines o_t = S_t^T q_t.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.utils import IS_AMD, IS_TRITON_INTERPRETER, autotune_cache_kwargs

# Warps tried by the autotuner (one fixed choice in the interpreter, which cannot time kernels).
NUM_WARPS = [4] if IS_TRITON_INTERPRETER else ([2, 4] if IS_AMD else [2, 4, 8])


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps) for num_warps in NUM_WARPS],
    key=["H", "K", "V", "BT", "BV", "PRECISION"],
    **autotune_cache_kwargs,
)
@triton.jit
def chunk_quasar_output_kernel(
    q,
    k,
    v_new,
    h,
    o,
    cu_seqlens,
    chunk_indices,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_v, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_n = tl.load(chunk_indices + i_c * 2)
    i_t = tl.load(chunk_indices + i_c * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)

    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < eos - bos
    rows = bos + o_t
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V

    m_tk = m_t[:, None] & m_k[None, :]
    m_tv = m_t[:, None] & m_v[None, :]
    p_qk = (rows[:, None] * H + i_h) * K + o_k[None, :]
    p_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
    b_q = tl.load(q + p_qk, mask=m_tk, other=0.0).to(tl.float32)
    b_k = tl.load(k + p_qk, mask=m_tk, other=0.0).to(tl.float32)
    b_vn = tl.load(v_new + p_v, mask=m_tv, other=0.0)
    p_h = (i_c.to(tl.int64) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :]
    b_h = tl.load(h + p_h, mask=m_k[:, None] & m_v[None, :], other=0.0)

    b_qk = tl.dot(b_q, tl.trans(b_k), input_precision=PRECISION)
    b_qk = tl.where(o_t[:, None] >= o_t[None, :], b_qk, 0.0)
    b_o = tl.dot(b_q, b_h, input_precision=PRECISION) + tl.dot(b_qk, b_vn, input_precision=PRECISION)
    tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_tv)


def chunk_quasar_output(
    q: torch.Tensor,
    k: torch.Tensor,
    v_new: torch.Tensor,
    h: torch.Tensor,
    cu_seqlens: torch.Tensor,
    chunk_indices: torch.Tensor,
    *,
    chunk_size: int,
    block_v: int,
    precision: str,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """O = Q S + tril_incl(Q K^T) V' for every chunk.

    ``q, k [1, T, H, K]``, ``v_new [1, T, H, V]`` (fp32), ``h [NT, H, K, V]``: the state each
    chunk starts from (fp32), chunks ordered as ``chunk_indices``. Returns ``o [1, T, H, V]``.
    """
    _, T, H, K = q.shape
    V = v_new.shape[-1]
    o = torch.empty(1, T, H, V, device=q.device, dtype=out_dtype)
    grid = (triton.cdiv(V, block_v), chunk_indices.shape[0], H)
    chunk_quasar_output_kernel[grid](
        q, k, v_new, h, o, cu_seqlens, chunk_indices,
        H=H, K=K, V=V, BT=chunk_size, BK=max(16, triton.next_power_of_2(K)), BV=block_v, PRECISION=precision,
    )
    return o
