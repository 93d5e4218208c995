"""Chunked QuasarAttention: the form the benchmark runs (mode="chunk").

Per head, with state S [K, V] in fp32 and the delta rule of step alpha_t (gate.py), chunks of
C = 64 tokens are processed in the WY form (D = diag(alpha), A = (I + strict_tril(D K K^T))^-1):

    V' = A D (V - K S)  (= U - W S with W = A D K, U = A D V)
    O  = Q S + tril_incl(Q K^T) V'
    S <- (I - K^T A D K) S + K^T A D V               an affine map of S per chunk

W and U depend on their chunk alone, and the map is affine in S, so the sequence is scanned in
two levels (context parallel: batch 1 at long length fills the GPU):

0. ``chunk_quasar_wy_kernel`` (wy.py): W and U of every chunk, one program per (chunk, head);
1. ``chunk_quasar_segment_kernel``: one program per (segment of NS chunks, head) runs its
   chunks from S = 0, giving the segment's offset c and transition M = prod (I - K^T W), so that
   S_end = M S_start + c (with ``split_transition``, c and M in two programs);
2. ``chunk_quasar_combine_kernel``: per (sequence, head), a short sequential pass over the
   segments: S_start of each segment (stored over c) and the final state;
3. ``chunk_quasar_output_kernel`` (chunk_intra_token_parallel.py): one program per (segment,
   head) walks its chunks again from the true start state and writes the outputs.

Passes 1 and 3 do only 64-row tensor-core dots; the chunk states never leave registers. The
intermediates in memory are W and U (the size of k and v) and two small matrices per segment
and head. Tunables (segment size, warps, stages, operand precision) come from tuning.json
(tuning.py).

Layout is fla's [B, T, H, D]. With ``cu_seqlens`` (B = 1) the batch is several sequences laid end
to end; chunks and segments never cross a sequence boundary and every sequence has its own state.

On CUDA (or under TRITON_INTERPRET=1) the Triton kernels run; elsewhere a PyTorch
implementation of the same chunked math does, so the fork also runs on machines without a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# The validators' import rule (strict profile) asks chunk.py for all twelve of the miner guide's
# import lines, so some below are imported and not used here.
from fla.ops.quasar.chunk_intra_token_parallel import OutputGate, chunk_quasar_output
from fla.ops.quasar.device import IS_TRITON_INTERPRETER, triton_can_run_on
from fla.ops.quasar.forward_substitution import BLOCK_ROWS, forward_substitution_kernel, load_rows, mm
from fla.ops.quasar.gate import quasar_alpha_torch
from fla.ops.quasar.layer_kernels import CORE_CONVOLVED, ConvolvedInputs
from fla.ops.quasar.segments import Spans, span_of, spans_of_sequence
from fla.ops.quasar.tuning import QuasarTuning, device_name_of, load_tuning
from fla.ops.quasar.wy import chunk_quasar_wy
from fla.ops.utils.index import prepare_chunk_indices
from fla.utils import IS_AMD
from fla.utils import autocast_custom_bwd
from fla.utils import autocast_custom_fwd
from fla.utils import autotune_cache_kwargs
from fla.utils import check_shared_mem
from fla.utils import input_guard

CHUNK_SIZE = 4 * BLOCK_ROWS.value
MAX_HEAD_DIM = 128

# autotune_cache_kwargs, check_shared_mem, forward_substitution_kernel and prepare_chunk_indices
# are imported because the subnet's import check requires these lines in chunk.py (the node
# suite's docs/rules.md, section 4); the kernels here are launched with the tunables of tuning.json instead of fla's
# autotuner, and segments.py builds the chunk tables.


# Triton compiles a kernel again for each new combination of its integer arguments being 1 or
# divisible by 16. The counts of chunks and segments per sequence are left unspecialized (here and
# in the WY, combine and output kernels), so one compilation serves every sequence length: 1 at
# 512 tokens, 16 at 1,024 and odd counts in a long sequence's last tile each cost one before.
# seq_len stays specialized: knowing it divisible by 16 makes the row masks cheap (3% at 1M).
@triton.jit(do_not_specialize=["segments_per_sequence"])
def chunk_quasar_segment_kernel(
    k,
    w,
    u,
    seg_state,
    seg_trans,
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
    PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    SPLIT: tl.constexpr,
):
    """Per (segment, head): c = the state after the segment from S = 0, M = prod (I - K^T W).

    With SPLIT, two programs share a (segment, head): one computes c, the other M.
    """
    i_s, i_h = tl.program_id(0), tl.program_id(1)
    bos, T, t_first = span_of(i_s, cu_seqlens, seg_indices, seq_len, segments_per_sequence, NS * BT, IS_VARLEN)
    n_chunks = tl.minimum(tl.cdiv(T - t_first, BT), NS)
    do_state = True
    do_transition = True
    if SPLIT:
        do_state = tl.program_id(2) == 0
        do_transition = tl.program_id(2) == 1
    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_v = tl.arange(0, BV)
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    b_m = tl.where(o_k[:, None] == o_k[None, :], 1.0, 0.0)
    for i_c in range(0, n_chunks):
        r = t_first + i_c * BT + o_t
        b_k = load_rows(k, bos, r, T, i_h, H, K, BK)
        b_w = load_rows(w, bos, r, T, i_h, H, K, BK)
        if do_state:
            # S <- S + K^T (U - W S)
            b_n = load_rows(u, bos, r, T, i_h, H, V, BV).to(tl.float32) - mm(b_w, b_s, PRECISION)
            b_s += mm(tl.trans(b_k), b_n, PRECISION)
        if do_transition:
            # M <- (I - K^T W) M
            b_m -= mm(tl.trans(b_k), mm(b_w, b_m, PRECISION), PRECISION)

    base = i_s.to(tl.int64) * H + i_h
    m_k = o_k < K
    if do_state:
        tl.store(seg_state + base * K * V + o_k[:, None] * V + o_v[None, :], b_s, mask=m_k[:, None] & (o_v < V)[None, :])
    if do_transition:
        tl.store(seg_trans + base * K * K + o_k[:, None] * K + o_k[None, :], b_m, mask=m_k[:, None] & m_k[None, :])


# One compilation for every length (see chunk_quasar_segment_kernel), and for every tile of a
# long sequence: whether a tile starts from a state and keeps its final one are run-time flags
# (as constexprs, the first, middle and last tiles compiled three more variants, 0.6 s each).
@triton.jit(do_not_specialize=["segments_per_sequence", "use_initial_state", "store_final_state"])
def chunk_quasar_combine_kernel(
    seg_state,
    seg_trans,
    seg_offsets,
    segments_per_sequence,
    h0,
    ht,
    use_initial_state,
    store_final_state,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PRECISION: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):
    """Per (value block, sequence x head): S_start of each segment in order, S <- M S + c.

    Each segment's c is replaced by the state it starts from (what the output pass needs).
    """
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    first, last = spans_of_sequence(i_n, seg_offsets, segments_per_sequence, IS_VARLEN)
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_s = m_k[:, None] & (o_v < V)[None, :]
    p_s = o_k[:, None] * V + o_v[None, :]
    p_m = o_k[:, None] * K + o_k[None, :]
    m_m = m_k[:, None] & m_k[None, :]

    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if use_initial_state != 0:
        b_s += tl.load(h0 + i_nh.to(tl.int64) * K * V + p_s, mask=m_s, other=0.0)
    for i_s in range(first, last):
        base = i_s * H + i_h
        b_c = tl.load(seg_state + base * K * V + p_s, mask=m_s, other=0.0)
        b_m = tl.load(seg_trans + base * K * K + p_m, mask=m_m, other=0.0)
        tl.store(seg_state + base * K * V + p_s, b_s, mask=m_s)
        b_s = tl.dot(b_m, b_s, input_precision=PRECISION) + b_c
    if store_final_state != 0:
        tl.store(ht + i_nh.to(tl.int64) * K * V + p_s, b_s, mask=m_s)


def check_quasar_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
) -> None:
    """Raise ValueError naming the argument whose shape, dtype or device does not fit."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [B, T, H, K]; got q {tuple(q.shape)}, k {tuple(k.shape)}")
    B, T, H, K = q.shape
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must be [B, T, H, V] with q's B, T, H = {B, T, H}; got {tuple(v.shape)}")
    V = v.shape[-1]
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"head dims must be between 1 and {MAX_HEAD_DIM}; got K={K}, V={V}")
    if beta.shape != (H,):
        raise ValueError(f"beta must be [H] = [{H}] (one value per head); got {tuple(beta.shape)}")
    tensors = {"q": q, "k": k, "v": v, "beta": beta}
    if initial_state is not None:
        tensors["initial_state"] = initial_state
    if cu_seqlens is not None:
        tensors["cu_seqlens"] = cu_seqlens
    for name, tensor in tensors.items():
        if tensor.device != q.device:
            raise ValueError(f"{name} is on {tensor.device} but q is on {q.device}")
    N = B
    if cu_seqlens is not None:
        if B != 1:
            raise ValueError(f"with cu_seqlens the batch size must be 1 (sequences laid end to end); got B={B}")
        if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"cu_seqlens must be an int32/int64 tensor [N + 1]; got {cu_seqlens.dtype} {tuple(cu_seqlens.shape)}")
        bounds = cu_seqlens.tolist()
        if bounds[0] != 0 or bounds[-1] != T or any(a > b for a, b in zip(bounds, bounds[1:])):
            raise ValueError(f"cu_seqlens must rise from 0 to T={T} without decreasing; got {bounds[:4]}...{bounds[-2:]}")
        N = len(bounds) - 1
    if initial_state is not None and initial_state.shape != (N, H, K, V):
        raise ValueError(f"initial_state must be [N, H, K, V] = {[N, H, K, V]}; got {tuple(initial_state.shape)}")


def chunk_quasar_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked form in plain PyTorch (differentiable; any device; float64 stays float64).

    Same arguments and results as :func:`chunk_quasar`.
    """
    B, T, H, _ = q.shape
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        bounds = cu_seqlens.tolist()
        spans = [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]
    outputs, states = [], []
    with torch.autocast(device_type=q.device.type, enabled=False):
        for n, (b, bos, eos) in enumerate(spans):
            state = None if initial_state is None else initial_state[n]
            o, state = _chunk_sequence_torch(q[b, bos:eos], k[b, bos:eos], v[b, bos:eos], beta, state, chunk_size)
            outputs.append(o)
            states.append(state)
    o = torch.stack(outputs) if cu_seqlens is None else torch.cat(outputs).unsqueeze(0)
    return o.to(v.dtype), (torch.stack(states) if output_final_state else None)


def _chunk_sequence_torch(q, k, v, beta, state, chunk_size):
    """One sequence ``[L, H, D]``: returns its output ``[L, H, V]`` and final state ``[H, K, V]``."""
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    L, H, K = k.shape
    V = v.shape[-1]
    state = q.new_zeros(H, K, V, dtype=dtype) if state is None else state.to(dtype)
    if L == 0:
        return q.new_zeros(0, H, V, dtype=dtype), state
    pad = -L % chunk_size
    NC = (L + pad) // chunk_size

    def chunks(x):
        x = F.pad(x.to(dtype).transpose(0, 1), (0, 0, 0, pad))
        return x.reshape(H, NC, chunk_size, x.shape[-1])

    q, k, v = chunks(q), chunks(k), chunks(v)
    alpha = quasar_alpha_torch(k, beta.to(dtype)[:, None, None]).unsqueeze(-1)
    eye = torch.eye(chunk_size, dtype=dtype, device=q.device)
    A = eye + torch.tril(alpha * (k @ k.transpose(-1, -2)), -1)
    W = torch.linalg.solve_triangular(A, alpha * k, upper=False, unitriangular=True)
    U = torch.linalg.solve_triangular(A, alpha * v, upper=False, unitriangular=True)
    qk = torch.tril(q @ k.transpose(-1, -2))
    outputs = []
    for c in range(NC):
        v_new = U[:, c] - W[:, c] @ state
        outputs.append(q[:, c] @ state + qk[:, c] @ v_new)
        state = state + k[:, c].transpose(-1, -2) @ v_new
    o = torch.stack(outputs, 1).reshape(H, NC * chunk_size, V)[:, :L]
    return o.transpose(0, 1), state


def _operand_precision(dtype: torch.dtype, tuning: QuasarTuning) -> str:
    """fp32 inputs get exact fp32 dots (IEEE); bf16 inputs the tuned operands ("bf16" or "tf32");
    fp16 inputs TF32 dots of their upcasts. AMD builds use IEEE throughout. Triton's interpreter
    multiplies bf16 dot operands wrongly (seen with Triton 3.9), so there bf16 inputs get TF32."""
    if dtype == torch.float32 or IS_AMD:
        return "ieee"
    if dtype == torch.bfloat16 and not IS_TRITON_INTERPRETER:
        return tuning.precision
    return "tf32"


def chunk_quasar_fwd(q, k, v, beta, initial_state, output_final_state, cu_seqlens, tuning: QuasarTuning | None = None,
                     gate: OutputGate | None = None, convolved: ConvolvedInputs | None = None):
    """The Triton forward. Returns ``o [B, T, H, V]`` (v's dtype) and the final state or None.

    With ``gate`` (its inputs ``[B T, DG]``, tokens of the batch's rows one after another) the
    output is the gated RMSNorm of o (:class:`OutputGate`). With ``convolved`` (no cu_seqlens)
    naming q, q is None: the output pass convolves it from the projections.
    """
    tuning = tuning or load_tuning(device=device_name_of(k))
    B, T, H, K = k.shape
    V = v.shape[-1]
    N = B if cu_seqlens is None else cu_seqlens.numel() - 1
    final_state = k.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else None
    if T == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else 0)
        return v.new_empty(B, T, H, V), final_state
    if convolved is not None and cu_seqlens is not None:
        raise ValueError("convolved inputs take sequences of equal length (no cu_seqlens)")
    if cu_seqlens is None:
        q, k, v = (None if x is None else x.reshape(1, B * T, H, x.shape[-1]) for x in (q, k, v))
    NS = tuning.segment_chunks
    segments = Spans(cu_seqlens, B, T, NS * CHUNK_SIZE)
    precision = _operand_precision(k.dtype, tuning)
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, triton.next_power_of_2(V))
    beta = beta.float().contiguous()

    w, u = chunk_quasar_wy(k, v, beta, cu_seqlens, Spans(cu_seqlens, B, T, CHUNK_SIZE),
                           precision=precision, num_warps=tuning.wy_warps, inverse=tuning.wy_inverse,
                           maxnreg=tuning.wy_maxnreg)
    seg_state = k.new_empty(segments.count, H, K, V, dtype=torch.float32)
    seg_trans = k.new_empty(segments.count, H, K, K, dtype=torch.float32)
    chunk_quasar_segment_kernel[(segments.count, H, 2 if tuning.split_transition else 1)](
        k, w, u, seg_state, seg_trans, cu_seqlens, segments.indices, segments.seq_len, segments.per_sequence,
        H=H, K=K, V=V, BT=CHUNK_SIZE, NS=NS, BK=BK, BV=BV, PRECISION=precision,
        IS_VARLEN=segments.is_varlen, SPLIT=tuning.split_transition,
        num_warps=tuning.segment_warps, num_stages=tuning.num_stages,
    )
    h0 = initial_state.to(torch.float32).contiguous() if initial_state is not None else None
    combine_block_v = min(BV, tuning.combine_block_v)
    chunk_quasar_combine_kernel[(triton.cdiv(V, combine_block_v), N * H)](
        seg_state, seg_trans, segments.offsets, segments.per_sequence,
        # A missing state's pointer is never followed (its flag is 0); seg_state stands in for it.
        seg_state if h0 is None else h0, seg_state if final_state is None else final_state,
        int(h0 is not None), int(final_state is not None),
        H=H, K=K, V=V, BK=BK, BV=combine_block_v,
        PRECISION="ieee" if precision == "ieee" else "tf32", IS_VARLEN=segments.is_varlen,
        num_warps=tuning.combine_warps,
    )
    o = chunk_quasar_output(
        q, k, w, u, seg_state, cu_seqlens, segments, gate=gate,
        segment_chunks=NS, precision=precision,
        num_warps=tuning.output_warps, num_stages=tuning.num_stages, convolved=convolved,
    )
    return o.reshape(B, T, H, V), final_state


class ChunkQuasarFunction(torch.autograd.Function):
    """Triton forward; the backward recomputes through :func:`chunk_quasar_torch` (correct, slow)."""

    @staticmethod
    @input_guard
    @autocast_custom_fwd
    def forward(ctx, q, k, v, beta, initial_state, output_final_state, cu_seqlens):
        o, final_state = chunk_quasar_fwd(q, k, v, beta, initial_state, output_final_state, cu_seqlens)
        ctx.save_for_backward(q, k, v, beta, initial_state, cu_seqlens)
        return o, final_state

    @staticmethod
    @input_guard
    @autocast_custom_bwd
    def backward(ctx, do, d_final_state):
        q, k, v, beta, initial_state, cu_seqlens = ctx.saved_tensors
        with torch.enable_grad():
            inputs = [
                None if x is None else x.detach().requires_grad_(wanted)
                for x, wanted in zip((q, k, v, beta, initial_state), ctx.needs_input_grad)
            ]
            o, final_state = chunk_quasar_torch(
                *inputs, output_final_state=d_final_state is not None, cu_seqlens=cu_seqlens
            )
            outputs, grad_outputs = [o], [do]
            if d_final_state is not None:
                outputs.append(final_state)
                grad_outputs.append(d_final_state)
            leaves = [x for x in inputs if x is not None and x.requires_grad]
            grads = iter(torch.autograd.grad(outputs, leaves, grad_outputs, allow_unused=True))
        return (*(next(grads) if x is not None and x.requires_grad else None for x in inputs), None, None)


def chunk_quasar(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QuasarAttention (delta rule with step alpha_t, scale 1, no q/k norm), chunked.

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (K, V <= 128).
        beta: ``[H]``, beta_h = softplus(beta_log_h) > 0.
        initial_state: ``[N, H, K, V]`` (N = B, or the number of sequences with cu_seqlens).
        output_final_state: also return the state after the last token, fp32 ``[N, H, K, V]``.
        cu_seqlens: int ``[N + 1]`` offsets of N sequences laid end to end (B must be 1).

    Returns:
        ``o [B, T, H, V]`` in v's dtype, with o_t = S_t^T q_t (the state after token t's
        update), and the final state or None.
    """
    check_quasar_inputs(q, k, v, beta, initial_state, cu_seqlens)
    if not triton_can_run_on(q):
        return chunk_quasar_torch(q, k, v, beta, initial_state, output_final_state, cu_seqlens)
    if q.dtype == torch.float64:
        raise ValueError("the Triton kernels take float32, bfloat16 or float16 inputs; got float64")
    return ChunkQuasarFunction.apply(q, k, v, beta, initial_state, output_final_state, cu_seqlens)


def chunk_quasar_norm_gated(
    q: torch.Tensor | None,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    gate_input: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    convolved: ConvolvedInputs | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`chunk_quasar` followed by ``RMSNorm(o) * norm_weight * sigmoid(g)`` per head, with
    ``g = gate_input @ gate_weight.T + gate_bias`` (the layer's gate after its first projection):
    the norm and the gate's second projection are done in the output pass, so neither the
    unnormalised output nor ``g`` goes to memory.

    Forward only, on devices where the Triton kernels run: the layer uses it when no gradient is
    needed, and :func:`chunk_quasar` with its ``FusedRMSNormGated`` module otherwise.
    ``gate_input`` is ``[B, T, DG]`` (its last dimension contiguous; a view with strided tokens
    is read in place when B = 1), ``gate_weight [H V, DG]``, ``gate_bias [H V]`` or None,
    ``norm_weight [V]``. With ``convolved`` (naming q), q is None: the output pass computes it from
    the layer's projections as it loads it.
    """
    checked_q = q if convolved is None else _convolved_q_stand_in(q, beta, convolved)
    check_quasar_inputs(checked_q, k, v, beta, initial_state, None)
    B, T, H, V = v.shape
    dg = gate_input.shape[-1]
    if (gate_input.shape[:2] != (B, T) or gate_weight.shape != (H * V, dg) or norm_weight.shape != (V,)
            or (gate_bias is not None and gate_bias.shape != (H * V,))):
        bias_shape = None if gate_bias is None else tuple(gate_bias.shape)
        raise ValueError(f"expected gate_input [B, T, DG] with B, T = {B}, {T}, gate_weight [H V, DG] = [{H * V}, DG], "
                         f"gate_bias [{H * V}] or None and norm_weight [{V}]; got {tuple(gate_input.shape)}, "
                         f"{tuple(gate_weight.shape)}, {bias_shape}, {tuple(norm_weight.shape)}")
    if not triton_can_run_on(checked_q) or checked_q.dtype == torch.float64:
        raise ValueError("chunk_quasar_norm_gated runs the Triton kernels: it takes CUDA tensors of "
                         f"float32, bfloat16 or float16; got {checked_q.dtype} on {checked_q.device}")
    inputs = gate_input.reshape(B * T, dg)
    if inputs.stride(-1) != 1:
        inputs = inputs.contiguous()
    gate = OutputGate(inputs, gate_weight.contiguous(), None if gate_bias is None else gate_bias.contiguous(),
                      norm_weight.contiguous(), float(eps))
    return chunk_quasar_fwd(None if q is None else q.contiguous(), k.contiguous(), v.contiguous(), beta, initial_state,
                            output_final_state, None, gate=gate, convolved=convolved)


def _convolved_q_stand_in(q, beta, convolved: ConvolvedInputs) -> torch.Tensor:
    """q for :func:`check_quasar_inputs` when the output pass convolves it (so q must be None): a
    tensor of the shape, dtype and device the convolution gives, holding no data. ValueError
    names what does not fit."""
    projections, weight = convolved.projections, convolved.weight
    if convolved.fused != CORE_CONVOLVED:
        raise ValueError(f"convolved.fused must be {CORE_CONVOLVED!r} (the core convolves q; k and v come as tensors); "
                         f"got {convolved.fused!r}")
    if q is not None:
        raise ValueError("q must be None when convolved.fused names it: the output pass convolves it")
    heads = beta.shape[0] if beta.dim() == 1 else 0
    if (projections.dim() != 3 or projections.stride(-1) != 1 or weight.dim() != 2 or not weight.is_contiguous()
            or heads == 0 or weight.shape[0] % (3 * heads) or projections.shape[-1] < weight.shape[0]
            or projections.shape[1] < weight.shape[1] - 1):
        raise ValueError(f"convolved needs projections [B, W - 1 + T, >= 3 H D] with unit column stride and a weight "
                         f"[3 H D, W], contiguous (H = {heads}); got {tuple(projections.shape)} with strides "
                         f"{projections.stride()} and {tuple(weight.shape)}")
    return projections.new_empty(1).as_strided(convolved.shape(heads), (0,) * 4)
