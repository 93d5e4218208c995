"""Chunked QuasarAttention: the form the benchmark runs (mode="chunk").

Per head, with state S [K, V] in fp32 and the delta rule of step alpha_t (gate.py), chunks of
C = 64 tokens are processed in the WY form (D = diag(alpha)):

    A  = (I + strict_tril(D K K^T))^-1          forward substitution
    W  = A D K,   U = A D V                      chunk_quasar_wy_kernel
    V' = U - W S,   S <- S + K^T V'              chunk_quasar_state_kernel (sequential over chunks)
    O  = Q S + tril_incl(Q K^T) V'               chunk_intra_token_parallel.py

Layout is fla's [B, T, H, D]. With ``cu_seqlens`` (B = 1) the batch is several sequences laid end
to end; chunks never cross a sequence boundary and every sequence has its own state.

On CUDA (or under TRITON_INTERPRET=1) the Triton kernels run; elsewhere a PyTorch
implementation of the same chunked math does, so the fork also runs on machines without a GPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from fla.ops.quasar.chunk_intra_token_parallel import NUM_WARPS, chunk_quasar_output
from fla.ops.quasar.forward_substitution import forward_substitution_kernel
from fla.ops.quasar.gate import quasar_alpha, quasar_alpha_torch
from fla.ops.utils.index import prepare_chunk_indices
from fla.ops.utils.index import prepare_chunk_offsets
from fla.utils import IS_AMD
from fla.utils import autocast_custom_bwd
from fla.utils import autocast_custom_fwd
from fla.utils import autotune_cache_kwargs
from fla.utils import check_shared_mem
from fla.utils import input_guard
from fla.utils import triton_can_run_on

CHUNK_SIZE = 64
MAX_HEAD_DIM = 128


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps) for num_warps in NUM_WARPS],
    key=["H", "K", "V", "BT", "PRECISION"],
    **autotune_cache_kwargs,
)
@triton.jit
def chunk_quasar_wy_kernel(
    k,
    v,
    beta,
    w,
    u,
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
    """Per (chunk, head): alpha, A = (I + strict_tril(D K K^T))^-1, W = A D K, U = A D V."""
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_n = tl.load(chunk_indices + i_c * 2)
    i_t = tl.load(chunk_indices + i_c * 2 + 1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)

    o_t = i_t * BT + tl.arange(0, BT)
    m_t = o_t < eos - bos
    rows = bos + o_t
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    m_tk = m_t[:, None] & m_k[None, :]
    p_k = (rows[:, None] * H + i_h) * K + o_k[None, :]

    # Tokens past the end load as zero keys: lambda = 0 gives alpha = 0, so they change nothing.
    b_k = tl.load(k + p_k, mask=m_tk, other=0.0).to(tl.float32)
    b_beta = tl.load(beta + i_h).to(tl.float32)
    b_alpha = quasar_alpha(tl.sum(b_k * b_k, 1), b_beta)

    b_L = tl.dot(b_k, tl.trans(b_k), input_precision=PRECISION) * b_alpha[:, None]
    b_L = tl.where(o_t[:, None] > o_t[None, :], b_L, 0.0)
    b_A = forward_substitution_kernel(b_L, BT)

    b_w = tl.dot(b_A, b_k * b_alpha[:, None], input_precision=PRECISION)
    tl.store(w + p_k, b_w, mask=m_tk)
    for i_v in range(0, tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_tv = m_t[:, None] & (o_v < V)[None, :]
        p_v = (rows[:, None] * H + i_h) * V + o_v[None, :]
        b_v = tl.load(v + p_v, mask=m_tv, other=0.0).to(tl.float32)
        b_u = tl.dot(b_A, b_v * b_alpha[:, None], input_precision=PRECISION)
        tl.store(u + p_v, b_u, mask=m_tv)


@triton.autotune(
    configs=[triton.Config({}, num_warps=num_warps) for num_warps in NUM_WARPS],
    key=["H", "K", "V", "BT", "BV", "PRECISION"],
    **autotune_cache_kwargs,
)
@triton.jit
def chunk_quasar_state_kernel(
    k,
    w,
    u,
    v_new,
    h,
    h0,
    ht,
    cu_seqlens,
    chunk_offsets,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Per (value block, sequence x head): walk the chunks in order carrying S [K, BV] in fp32.

    Stores the state each chunk starts from (for the output pass) and V' = U - W S.
    """
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    first_chunk = tl.load(chunk_offsets + i_n).to(tl.int64)
    T = (eos - bos).to(tl.int32)
    NT = tl.cdiv(T, BT)

    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_s = o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]

    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_s += tl.load(h0 + i_nh.to(tl.int64) * K * V + p_s, mask=m_s, other=0.0)

    for i_t in range(0, NT):
        tl.store(h + ((first_chunk + i_t) * H + i_h) * K * V + p_s, b_s, mask=m_s)
        o_t = i_t * BT + tl.arange(0, BT)
        m_t = o_t < T
        rows = bos + o_t
        m_tk = m_t[:, None] & m_k[None, :]
        m_tv = m_t[:, None] & m_v[None, :]
        p_k = (rows[:, None] * H + i_h) * K + o_k[None, :]
        p_v = (rows[:, None] * H + i_h) * V + o_v[None, :]

        b_w = tl.load(w + p_k, mask=m_tk, other=0.0)
        b_u = tl.load(u + p_v, mask=m_tv, other=0.0)
        b_vn = b_u - tl.dot(b_w, b_s, input_precision=PRECISION)
        tl.store(v_new + p_v, b_vn, mask=m_tv)
        b_k = tl.load(k + p_k, mask=m_tk, other=0.0).to(tl.float32)
        b_s += tl.dot(tl.trans(b_k), b_vn, input_precision=PRECISION)

    if STORE_FINAL_STATE:
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


def _dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs get exact fp32 dots; bf16/fp16 inputs get TF32 dots of their fp32 upcasts
    (exact on the inputs, ~1e-3 relative on intermediates). AMD builds use IEEE throughout."""
    return "ieee" if dtype == torch.float32 or IS_AMD else "tf32"


def chunk_quasar_fwd(q, k, v, beta, initial_state, output_final_state, cu_seqlens):
    """The Triton forward. Returns ``o [B, T, H, V]`` (v's dtype) and the final state or None."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, B + 1, device=q.device, dtype=torch.int32) * T
        q, k, v = (x.reshape(1, B * T, H, x.shape[-1]) for x in (q, k, v))
    N = cu_seqlens.numel() - 1
    chunk_indices = prepare_chunk_indices(cu_seqlens, CHUNK_SIZE)
    chunk_offsets = prepare_chunk_offsets(cu_seqlens, CHUNK_SIZE)
    NT = chunk_indices.shape[0]
    precision = _dot_precision(q.dtype)
    BK = max(16, triton.next_power_of_2(K))
    BV = max(16, triton.next_power_of_2(V))

    final_state = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else None
    if NT == 0:
        if final_state is not None:
            final_state.copy_(initial_state if initial_state is not None else 0)
        return v.new_empty(B, T, H, V), final_state

    w = q.new_empty(1, B * T, H, K, dtype=torch.float32)
    u = q.new_empty(1, B * T, H, V, dtype=torch.float32)
    chunk_quasar_wy_kernel[(NT, H)](
        k, v, beta, w, u, cu_seqlens, chunk_indices,
        H=H, K=K, V=V, BT=CHUNK_SIZE, BK=BK, BV=min(BV, 64), PRECISION=precision,
    )

    h = q.new_empty(NT, H, K, V, dtype=torch.float32)
    v_new = torch.empty_like(u)
    state_block_v = min(BV, 32)
    h0 = initial_state.to(torch.float32).contiguous() if initial_state is not None else None
    chunk_quasar_state_kernel[(triton.cdiv(V, state_block_v), N * H)](
        k, w, u, v_new, h, h0, final_state, cu_seqlens, chunk_offsets,
        H=H, K=K, V=V, BT=CHUNK_SIZE, BK=BK, BV=state_block_v,
        USE_INITIAL_STATE=h0 is not None, STORE_FINAL_STATE=final_state is not None, PRECISION=precision,
    )

    o = chunk_quasar_output(
        q, k, v_new, h, cu_seqlens, chunk_indices,
        chunk_size=CHUNK_SIZE, block_v=min(BV, 64 if check_shared_mem() else 32),
        precision=precision, out_dtype=v.dtype,
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
