"""The output pass of the chunked form (pass 3 of the two-level scan).

Each program takes one segment of chunks of one head, starting from the true state at the
segment's start (passes 1 and 2, chunk.py), and walks its chunks:

    V' = (I + strict_tril(D K K^T))^-1 D (V - K S)      (= U - W S of the WY form)
    O  = Q S + tril_incl(Q K^T) V'
    S <- S + K^T V'

Every token of a chunk is computed at once (16-row blocks, tensor-core dots); each token's output
uses the state after its own update, as the recurrence defines o_t = S_t^T q_t. The per-chunk
states live in registers only: nothing but the outputs goes back to memory.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.ops.quasar.forward_substitution import BLOCK_ROWS, block_solve, chunk_factors, load_rows, mm


@triton.jit
def chunk_quasar_output_kernel(
    q,
    k,
    v,
    beta,
    seg_state,
    o,
    cu_seqlens,
    seg_indices,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    NS: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(seg_indices + i_s * 2)
    i_g = tl.load(seg_indices + i_s * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    t_first = i_g * (NS * BT)
    n_chunks = tl.minimum(tl.cdiv(T - t_first, BT), NS)
    b_beta = tl.load(beta + i_h).to(tl.float32)

    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    o_c = tl.arange(0, BLOCK_ROWS)
    causal = o_c[:, None] >= o_c[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    b_s = tl.load(seg_state + (i_s.to(tl.int64) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_s, other=0.0)

    for i_c in range(0, n_chunks):
        r = t_first + i_c * BT + o_c
        k0 = load_rows(k, bos, r, T, i_h, H, K, BK)
        k1 = load_rows(k, bos, r + BLOCK_ROWS, T, i_h, H, K, BK)
        k2 = load_rows(k, bos, r + 2 * BLOCK_ROWS, T, i_h, H, K, BK)
        k3 = load_rows(k, bos, r + 3 * BLOCK_ROWS, T, i_h, H, K, BK)
        a0, a1, a2, a3, i0, i1, i2, i3, l10, l20, l21, l30, l31, l32 = chunk_factors(k0, k1, k2, k3, b_beta, PRECISION)
        u0 = a0[:, None] * (load_rows(v, bos, r, T, i_h, H, V, BV).to(tl.float32) - mm(k0, b_s, PRECISION))
        u1 = a1[:, None] * (load_rows(v, bos, r + BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32) - mm(k1, b_s, PRECISION))
        u2 = a2[:, None] * (load_rows(v, bos, r + 2 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32) - mm(k2, b_s, PRECISION))
        u3 = a3[:, None] * (load_rows(v, bos, r + 3 * BLOCK_ROWS, T, i_h, H, V, BV).to(tl.float32) - mm(k3, b_s, PRECISION))
        n0, n1, n2, n3 = block_solve(i0, i1, i2, i3, l10, l20, l21, l30, l31, l32, u0, u1, u2, u3, PRECISION)

        q0 = load_rows(q, bos, r, T, i_h, H, K, BK)
        o0 = mm(q0, b_s, PRECISION) + mm(tl.where(causal, mm(q0, tl.trans(k0), PRECISION), 0.0), n0, PRECISION)
        q1 = load_rows(q, bos, r + BLOCK_ROWS, T, i_h, H, K, BK)
        o1 = mm(q1, b_s, PRECISION) + mm(mm(q1, tl.trans(k0), PRECISION), n0, PRECISION)
        o1 += mm(tl.where(causal, mm(q1, tl.trans(k1), PRECISION), 0.0), n1, PRECISION)
        q2 = load_rows(q, bos, r + 2 * BLOCK_ROWS, T, i_h, H, K, BK)
        o2 = mm(q2, b_s, PRECISION) + mm(mm(q2, tl.trans(k0), PRECISION), n0, PRECISION)
        o2 += mm(mm(q2, tl.trans(k1), PRECISION), n1, PRECISION)
        o2 += mm(tl.where(causal, mm(q2, tl.trans(k2), PRECISION), 0.0), n2, PRECISION)
        q3 = load_rows(q, bos, r + 3 * BLOCK_ROWS, T, i_h, H, K, BK)
        o3 = mm(q3, b_s, PRECISION) + mm(mm(q3, tl.trans(k0), PRECISION), n0, PRECISION)
        o3 += mm(mm(q3, tl.trans(k1), PRECISION), n1, PRECISION)
        o3 += mm(mm(q3, tl.trans(k2), PRECISION), n2, PRECISION)
        o3 += mm(tl.where(causal, mm(q3, tl.trans(k3), PRECISION), 0.0), n3, PRECISION)

        m_v = (o_v < V)[None, :]
        p_o = ((bos + r)[:, None] * H + i_h) * V + o_v[None, :]
        tl.store(o + p_o, o0.to(o.dtype.element_ty), mask=(r < T)[:, None] & m_v)
        p_o += BLOCK_ROWS * H * V
        tl.store(o + p_o, o1.to(o.dtype.element_ty), mask=(r + BLOCK_ROWS < T)[:, None] & m_v)
        p_o += BLOCK_ROWS * H * V
        tl.store(o + p_o, o2.to(o.dtype.element_ty), mask=(r + 2 * BLOCK_ROWS < T)[:, None] & m_v)
        p_o += BLOCK_ROWS * H * V
        tl.store(o + p_o, o3.to(o.dtype.element_ty), mask=(r + 3 * BLOCK_ROWS < T)[:, None] & m_v)

        b_s += mm(tl.trans(k0), n0, PRECISION) + mm(tl.trans(k1), n1, PRECISION)
        b_s += mm(tl.trans(k2), n2, PRECISION) + mm(tl.trans(k3), n3, PRECISION)


def chunk_quasar_output(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    seg_state: torch.Tensor,
    cu_seqlens: torch.Tensor,
    seg_indices: torch.Tensor,
    *,
    segment_chunks: int,
    precision: str,
    num_warps: int,
    num_stages: int,
) -> torch.Tensor:
    """Outputs of every segment from its start state.

    ``q, k [1, T, H, K]``, ``v [1, T, H, V]``, ``beta [H]``, ``seg_state [NSEG, H, K, V]`` (fp32,
    the state each segment starts from), segments ordered as ``seg_indices [NSEG, 2]`` (sequence,
    segment inside it) of ``segment_chunks`` chunks of 64 tokens. Returns ``o [1, T, H, V]`` in v's dtype.
    """
    _, T, H, K = q.shape
    V = v.shape[-1]
    o = torch.empty(1, T, H, V, device=q.device, dtype=v.dtype)
    chunk_quasar_output_kernel[(seg_indices.shape[0], H)](
        q, k, v, beta, seg_state, o, cu_seqlens, seg_indices,
        H=H, K=K, V=V, BT=4 * BLOCK_ROWS.value, NS=segment_chunks,
        BK=max(16, triton.next_power_of_2(K)), BV=max(16, triton.next_power_of_2(V)),
        PRECISION=precision, num_warps=num_warps, num_stages=num_stages,
    )
    return o
