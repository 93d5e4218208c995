"""Token-by-token QuasarAttention: the recurrence as written, for decoding and as a second
implementation to check the chunked one against.

    lambda_t = ||k_t||^2,  alpha_t = (1 - exp(-beta * lambda_t)) / (lambda_t + 1e-8)
    S_t = S_{t-1} + alpha_t k_t (v_t - S_{t-1}^T k_t)^T,   o_t = S_t^T q_t

Three implementations of the same function: a Triton kernel (CUDA, or TRITON_INTERPRET=1), a
PyTorch loop (CPU), and a CUDA C++ kernel in csrc/quasar_recurrent.cu built on demand with
torch.utils.cpp_extension (:func:`fused_recurrent_quasar_cuda`).
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
import triton
import triton.language as tl

from fla.ops.quasar.chunk import check_quasar_inputs
from fla.ops.quasar.gate import quasar_alpha, quasar_alpha_torch
from fla.ops.quasar.device import triton_can_run_on
from fla.utils import input_guard

CUDA_SOURCE = Path(__file__).parent / "csrc" / "quasar_recurrent.cu"


@triton.jit
def fused_recurrent_quasar_kernel(
    q,
    k,
    v,
    beta,
    o,
    h0,
    ht,
    cu_seqlens,
    H: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
):
    """Per (value block, sequence x head): the state columns [K, BV] in fp32, one token at a time."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = i_nh // H, i_nh % H
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)

    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    p_s = o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]

    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        b_s += tl.load(h0 + i_nh.to(tl.int64) * K * V + p_s, mask=m_s, other=0.0)
    b_beta = tl.load(beta + i_h).to(tl.float32)

    for i_t in range(0, (eos - bos).to(tl.int32)):
        t = bos + i_t
        p_qk = (t * H + i_h) * K + o_k
        p_v = (t * H + i_h) * V + o_v
        b_k = tl.load(k + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_q = tl.load(q + p_qk, mask=m_k, other=0.0).to(tl.float32)
        b_v = tl.load(v + p_v, mask=m_v, other=0.0).to(tl.float32)
        b_alpha = quasar_alpha(tl.sum(b_k * b_k, 0), b_beta)
        b_u = b_alpha * (b_v - tl.sum(b_s * b_k[:, None], 0))
        b_s += b_k[:, None] * b_u[None, :]
        b_o = tl.sum(b_s * b_q[:, None], 0)
        tl.store(o + p_v, b_o.to(o.dtype.element_ty), mask=m_v)

    if STORE_FINAL_STATE:
        tl.store(ht + i_nh.to(tl.int64) * K * V + p_s, b_s, mask=m_s)


def _as_sequences(q, k, v, cu_seqlens):
    """Flatten a [B, T, ...] batch to one row of B sequences (offsets ``cu_seqlens``)."""
    B, T = q.shape[:2]
    if cu_seqlens is None:
        cu_seqlens = torch.arange(0, B + 1, device=q.device, dtype=torch.int64) * T
        q, k, v = (x.reshape(1, B * T, *x.shape[2:]) for x in (q, k, v))
    return q, k, v, cu_seqlens


@input_guard
def fused_recurrent_quasar_fwd(q, k, v, beta, initial_state, output_final_state, cu_seqlens):
    """The Triton recurrence. Returns ``o [B, T, H, V]`` (v's dtype) and the final state or None."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, cu_seqlens = _as_sequences(q, k, v, cu_seqlens)
    N = cu_seqlens.numel() - 1
    o = torch.empty_like(v)
    final_state = q.new_empty(N, H, K, V, dtype=torch.float32) if output_final_state else None
    h0 = initial_state.to(torch.float32).contiguous() if initial_state is not None else None
    BV = min(32, triton.next_power_of_2(V))
    fused_recurrent_quasar_kernel[(triton.cdiv(V, BV), N * H)](
        q, k, v, beta, o, h0, final_state, cu_seqlens,
        H=H, K=K, V=V, BK=triton.next_power_of_2(K), BV=BV,
        USE_INITIAL_STATE=h0 is not None, STORE_FINAL_STATE=final_state is not None,
        num_warps=1,
    )
    return o.reshape(B, T, H, V), final_state


def fused_recurrent_quasar_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence as a PyTorch loop over tokens (all sequences and heads at once).

    float64 inputs are computed in float64, others in float32.
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v, cu_seqlens = _as_sequences(q, k, v, cu_seqlens)
    bounds = cu_seqlens.tolist()
    N = len(bounds) - 1
    o = torch.zeros(q.shape[1], H, V, dtype=dtype, device=q.device)
    with torch.autocast(device_type=q.device.type, enabled=False):
        q, k, v = (x[0].to(dtype) for x in (q, k, v))
        alpha = quasar_alpha_torch(k, beta.to(dtype))
        state = q.new_zeros(N, H, K, V) if initial_state is None else initial_state.to(dtype).clone()
        lengths = [bounds[n + 1] - bounds[n] for n in range(N)]
        for step in range(max(lengths, default=0)):
            # The sequences still running at this step, and their tokens.
            live = [n for n in range(N) if step < lengths[n]]
            rows = [bounds[n] + step for n in live]
            s = state[live]
            k_t, q_t, a_t = k[rows], q[rows], alpha[rows]
            u_t = a_t[..., None] * (v[rows] - torch.einsum("nhkv,nhk->nhv", s, k_t))
            s = s + k_t[..., :, None] * u_t[..., None, :]
            o[rows] = torch.einsum("nhkv,nhk->nhv", s, q_t)
            state[live] = s
    return o.reshape(B, T, H, V).to(v.dtype), (state if output_final_state else None)


def fused_recurrent_quasar(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QuasarAttention token by token; same arguments and results as ``chunk_quasar``.

    Forward only on the Triton path (decoding); the PyTorch path is differentiable.
    """
    check_quasar_inputs(q, k, v, beta, initial_state, cu_seqlens)
    if not triton_can_run_on(q):
        return fused_recurrent_quasar_torch(q, k, v, beta, initial_state, output_final_state, cu_seqlens)
    if q.dtype == torch.float64:
        raise ValueError("the Triton kernels take float32, bfloat16 or float16 inputs; got float64")
    return fused_recurrent_quasar_fwd(q, k, v, beta, initial_state, output_final_state, cu_seqlens)


@functools.cache
def load_cuda_extension():
    """Build (once per process; cached on disk by PyTorch) and import csrc/quasar_recurrent.cu.

    Needs nvcc and ninja; raises RuntimeError from torch.utils.cpp_extension when it cannot build.
    """
    from torch.utils.cpp_extension import load

    return load(name="fla_quasar_recurrent_cuda", sources=[str(CUDA_SOURCE)], extra_cuda_cflags=["-O3"])


def fused_recurrent_quasar_cuda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The recurrence by the CUDA C++ kernel (CUDA tensors; K in {16, 32, 64, 128})."""
    check_quasar_inputs(q, k, v, beta, initial_state, cu_seqlens)
    if not q.is_cuda:
        raise ValueError(f"the CUDA kernel needs CUDA tensors; q is on {q.device}")
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v, cu_seqlens = _as_sequences(q.contiguous(), k.contiguous(), v.contiguous(), cu_seqlens)
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    o, final_state = load_cuda_extension().forward(
        q, k, v, beta.to(torch.float32).contiguous(), h0, cu_seqlens.to(torch.int64), output_final_state
    )
    return o.reshape(B, T, H, V), (final_state if output_final_state else None)
