"""The QuasarAttention recurrence token by token (docs/rules.md section 6): slow and obviously correct.

Per batch b and head h, with a state ``S`` of shape ``[D_k, D_v]``::

    lambda_t = ||k_t||^2
    alpha_t  = -expm1(-beta_h * lambda_t) / (lambda_t + 1e-8)
    S_t      = S_{t-1} + alpha_t * k_t (v_t - S_{t-1}^T k_t)^T
    o_t      = S_t^T q_t                     (the state after the update; no scale, no q/k norm)
"""

from __future__ import annotations

import torch

# Added to ||k||^2 before dividing, exactly as the kernels do; a zero key gets alpha = 0.
LAMBDA_EPS = 1e-8


def compute_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """The dtype the reference computes in: float64 for float64 inputs, float32 for everything else."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def quasar_alpha(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """The per-token step ``alpha = -expm1(-beta * ||k||^2) / (||k||^2 + 1e-8)``.

    ``k``: ``[..., D]``; ``beta`` broadcastable to ``k.shape[:-1]`` (``[H]`` for ``[B, T, H, D]``
    keys). Returns ``k.shape[:-1]`` in ``k``'s dtype. ``expm1`` keeps the small-lambda limit
    (alpha -> beta) accurate where ``1 - exp`` would cancel.
    """
    lam = (k * k).sum(-1)
    return -torch.expm1(-beta * lam) / (lam + LAMBDA_EPS)


def check_quasar_inputs(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> None:
    """Raise ``ValueError`` naming the argument whose shape or device does not fit the others."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 4:
            raise ValueError(f"{name}: expected shape [B, T, H, D], got {tuple(tensor.shape)}")
    if q.shape != k.shape:
        raise ValueError(f"k: expected the shape of q {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v: expected [B, T, H] = {tuple(q.shape[:3])} like q, got {tuple(v.shape)}")
    batch, _, heads, d_k = q.shape
    d_v = v.shape[-1]
    if beta.shape != (heads,):
        raise ValueError(f"beta: expected shape [H] = [{heads}], got {tuple(beta.shape)}")
    if initial_state is not None and initial_state.shape != (batch, heads, d_k, d_v):
        raise ValueError(
            f"initial_state: expected shape [B, H, D_k, D_v] = {[batch, heads, d_k, d_v]}, "
            f"got {list(initial_state.shape)}"
        )
    named: dict[str, torch.Tensor | None] = {"k": k, "v": v, "beta": beta, "initial_state": initial_state}
    for name, given in named.items():
        if given is not None and given.device != q.device:
            raise ValueError(f"{name}: on {given.device}, expected q's device {q.device}")


@torch.no_grad()
def naive_quasar(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QuasarAttention by its recurrence, one token at a time.

    Args:
        q, k: ``[B, T, H, D_k]``; v: ``[B, T, H, D_v]``.
        beta: ``[H]``, already softplus'd (the layer passes ``softplus(beta_log)``).
        initial_state: optional ``[B, H, D_k, D_v]`` state before the first token.
        output_final_state: also return the state after the last token.

    Returns:
        ``(o, final_state)``: ``o`` is ``[B, T, H, D_v]`` in ``q``'s dtype; ``final_state`` is
        ``[B, H, D_k, D_v]`` in the compute dtype (float64 for float64 inputs, else float32), or
        ``None`` unless asked for.
    """
    check_quasar_inputs(q, k, v, beta, initial_state)
    out_dtype = q.dtype
    dtype = compute_dtype_for(out_dtype)
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    batch, length, heads, d_k = q.shape
    d_v = v.shape[-1]
    if initial_state is None:
        state = q.new_zeros(batch, heads, d_k, d_v)
    else:
        state = initial_state.to(dtype).clone()
    alpha = quasar_alpha(k, beta)  # [B, T, H]
    outputs = []
    for t in range(length):
        k_t, v_t, q_t = k[:, t], v[:, t], q[:, t]  # [B, H, D]
        predicted = torch.einsum("bhkv,bhk->bhv", state, k_t)
        update = alpha[:, t, :, None] * (v_t - predicted)
        state = state + k_t[..., :, None] * update[..., None, :]
        outputs.append(torch.einsum("bhkv,bhk->bhv", state, q_t))
    if outputs:
        o = torch.stack(outputs, dim=1)
    else:
        o = q.new_zeros(batch, 0, heads, d_v)
    return o.to(out_dtype), (state if output_final_state else None)
