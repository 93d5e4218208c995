"""The output pass of the chunked form (pass 3 of the two-level scan).

Each program takes one segment of chunks of one head, starting from the true state at the segment's start (passes 1 and 2, chunk.py), and walks its chunks with
the WY factors W, U of pass 0 (wy.py):

    V' = U - W S                         the chunk's new values
    O  = Q S + tril_incl(Q K^T) V'
    S <- S + K^T V'

Every token of a chunk is computed at once (64-row tensor-core dots); each token's output uses
the state after its own update, as the recurrence defines o_t = S_t^T q_t. The per-chunk
states live in registers only: nothing but the outputs goes back to memory. The layer's
RMSNorm + sigmoid gate can be applied to each output row before it is written (``gate``), the
gate's second projection included: each chunk's gate values are a small dot of the gate's
low-rank input with the head's slice of the weight, so they never go to memory either. With
:class:`~fla.ops.quasar.layer_kernels.ConvolvedInputs` naming q, the pass convolves q itself as it
loads it from the layer's projections (no other pass reads q).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from fla.ops.quasar.forward_substitution import BLOCK_ROWS, load_rows, mm, store_block
from fla.ops.quasar.layer_kernels import ConvolvedInputs, load_convolved_rows
from fla.ops.quasar.segments import Spans, span_of


@dataclass(frozen=True)
class OutputGate:
    """The layer's RMSNorm + sigmoid gate, applied in the output pass.

    Head ``h``'s output row ``o`` at token ``t`` becomes
    ``RMSNorm(o) * norm_weight * sigmoid(inputs[t] @ weight[h V:(h + 1) V].T + bias[h V:(h + 1) V])``:
    ``inputs [T, DG]`` (the gate's low-rank input, W_g1 x; rows may be strided, columns
    contiguous), ``weight [H V, DG]``, ``bias [H V]`` or None, ``norm_weight [V]``, ``eps`` the
    norm's epsilon.
    """

    inputs: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    norm_weight: torch.Tensor
    eps: float


# One compilation for every length (see fla.ops.quasar.chunk.chunk_quasar_segment_kernel).
@triton.jit(do_not_specialize=["segments_per_sequence"])
def chunk_quasar_output_kernel(
    q,
    k,
    w,
    u,
    seg_state,
    o,
    g,
    g_stride,
    g_weight,
    g_bias,
    norm_weight,
    eps,
    proj,
    proj_stride,
    conv_weight,
    cu_seqlens,
    seg_indices,
    seq_len,
    segments_per_sequence,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    NS: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    DG: tl.constexpr,
    BDG: tl.constexpr,
    PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    NORM_GATE: tl.constexpr,
    GATE_BIAS: tl.constexpr,
    CONV_Q: tl.constexpr,
    TAPS: tl.constexpr,
):
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    bos, T, t_first = span_of(i_s, cu_seqlens, seg_indices, seq_len, segments_per_sequence, NS * BT, IS_VARLEN)
    n_chunks = tl.minimum(tl.cdiv(T - t_first, BT), NS)
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    causal = o_t[:, None] >= o_t[None, :]
    m_s = (o_k < K)[:, None] & (o_v < V)[None, :]
    b_s = tl.load(seg_state + (i_s.to(tl.int64) * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_s, other=0.0)
    if NORM_GATE:
        o_d = tl.arange(0, BDG)
        # The head's slice of the gate weight, transposed: [DG, V].
        b_gw = tl.load(g_weight + (i_h * V + o_v)[None, :] * DG + o_d[:, None],
                       mask=(o_d < DG)[:, None] & (o_v < V)[None, :], other=0.0)
        b_nw = tl.load(norm_weight + o_v, mask=o_v < V, other=0.0).to(tl.float32)
        if GATE_BIAS:
            b_gb = tl.load(g_bias + i_h * V + o_v, mask=o_v < V, other=0.0).to(tl.float32)
    for i_c in range(0, n_chunks):
        r = t_first + i_c * BT + o_t
        b_k = load_rows(k, bos, r, T, i_h, H, K, BK)
        b_n = load_rows(u, bos, r, T, i_h, H, V, BV).to(tl.float32) - mm(load_rows(w, bos, r, T, i_h, H, K, BK), b_s, PRECISION)
        if CONV_Q:
            b_q = load_convolved_rows(proj, proj_stride, conv_weight, bos, r, T, i_h * K, K, BK, TAPS)
        else:
            b_q = load_rows(q, bos, r, T, i_h, H, K, BK)
        b_a = tl.where(causal, mm(b_q, tl.trans(b_k), PRECISION), 0.0)
        b_o = mm(b_q, b_s, PRECISION) + mm(b_a, b_n, PRECISION)
        if NORM_GATE:
            # y = RMSNorm(o) * w * sigmoid(g W_h^T + b_h) over the head's V values, fp32 inside.
            b_gx = tl.load(g + (bos + r).to(tl.int64)[:, None] * g_stride + o_d[None, :],
                           mask=(r < T)[:, None] & (o_d < DG)[None, :], other=0.0)
            b_g = mm(b_gx, b_gw, PRECISION)
            if GATE_BIAS:
                b_g += b_gb[None, :]
            rstd = tl.rsqrt(tl.sum(b_o * b_o, 1) / V + eps)
            b_o = b_o * rstd[:, None] * b_nw[None, :] * tl.sigmoid(b_g)
        store_block(o, b_o, bos, r, o_v, T, i_h, H, V)
        b_s += mm(tl.trans(b_k), b_n, PRECISION)


def chunk_quasar_output(
    q: torch.Tensor | None,
    k: torch.Tensor,
    w: torch.Tensor,
    u: torch.Tensor,
    seg_state: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    segments: Spans,
    *,
    gate: OutputGate | None = None,
    segment_chunks: int,
    precision: str,
    num_warps: int,
    num_stages: int,
    convolved: ConvolvedInputs | None = None,
) -> torch.Tensor:
    """Outputs of every segment from its start state.

    ``q, k, w [1, T, H, K]``, ``u [1, T, H, V]`` (sequences laid end to end), ``seg_state
    [NSEG, H, K, V]`` (fp32, the state each segment starts from), ``segments`` of
    ``segment_chunks`` chunks of 64 tokens. With ``gate`` each head's output row is written as
    RMSNorm(o) * norm_weight * sigmoid(gate values) instead (see :class:`OutputGate`). q is None
    when ``convolved`` names it: the pass convolves it from the projections.
    Returns ``o [1, T, H, V]`` in u's dtype.
    """
    _, T, H, K = k.shape
    V = u.shape[-1]
    o = torch.empty(1, T, H, V, device=k.device, dtype=u.dtype)
    DG = gate.inputs.shape[-1] if gate is not None else 1
    projections = None if convolved is None else convolved.projections
    chunk_quasar_output_kernel[(segments.count, H)](
        q, k, w, u, seg_state, o,
        *((gate.inputs, gate.inputs.stride(0), gate.weight, gate.bias, gate.norm_weight, gate.eps) if gate is not None
          else (None, 0, None, None, None, 0.0)),
        projections, 0 if projections is None else projections.stride(1),
        None if convolved is None else convolved.weight,
        cu_seqlens, segments.indices, segments.seq_len, segments.per_sequence,
        H=H, K=K, V=V, BT=4 * BLOCK_ROWS.value, NS=segment_chunks, BK=max(16, triton.next_power_of_2(K)),
        BV=max(16, triton.next_power_of_2(V)), DG=DG, BDG=max(16, triton.next_power_of_2(DG)),
        PRECISION=precision, IS_VARLEN=segments.is_varlen, NORM_GATE=gate is not None,
        GATE_BIAS=gate is not None and gate.bias is not None,
        CONV_Q=convolved is not None and "q" in convolved.fused, TAPS=1 if convolved is None else convolved.taps,
        num_warps=num_warps, num_stages=num_stages,
    )
    return o
