"""Forward substitution: the inverse of a unit lower-triangular chunk matrix (I + L).

The chunked delta rule needs A = (I + strict_tril(D K K^T))^-1 for each chunk of C tokens
(D = diag(alpha)). ``forward_substitution_kernel`` computes it inside a Triton kernel, one row at
a time: row i of A is e_i - sum_{j<i} L[i, j] A[j, :], every row j < i being final already.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def forward_substitution_kernel(b_L, BT: tl.constexpr):
    """(I + L)^-1 of a strictly lower-triangular fp32 block ``b_L [BT, BT]`` (a device function)."""
    o_i = tl.arange(0, BT)
    b_A = tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)
    for i in range(1, BT):
        b_l = tl.sum(tl.where(o_i[:, None] == i, b_L, 0.0), 0)
        b_a = tl.sum(b_l[:, None] * b_A, 0)
        b_A = tl.where(o_i[:, None] == i, b_A - b_a[None, :], b_A)
    return b_A


@triton.jit
def unit_lower_inverse_kernel(L, A, BT: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    o_i = tl.arange(0, BT)
    p = i_b * BT * BT + o_i[:, None] * BT + o_i[None, :]
    b_L = tl.load(L + p).to(tl.float32)
    b_L = tl.where(o_i[:, None] > o_i[None, :], b_L, 0.0)
    tl.store(A + p, forward_substitution_kernel(b_L, BT))


def unit_lower_inverse(L: torch.Tensor) -> torch.Tensor:
    """(I + strict_tril(L))^-1 for a batch ``L [..., BT, BT]`` (BT a power of two), in float32.

    The entries of L on and above the diagonal are ignored. The standalone form of what the
    chunk kernel does in registers; useful to test the substitution by itself.
    """
    if L.dim() < 2 or L.shape[-2] != L.shape[-1] or L.shape[-1] < 1 or L.shape[-1] & (L.shape[-1] - 1):
        raise ValueError(f"L must be [..., BT, BT] with BT a power of two, got {tuple(L.shape)}")
    BT = L.shape[-1]
    flat = L.reshape(-1, BT, BT).to(torch.float32).contiguous()
    A = torch.empty_like(flat)
    if flat.shape[0]:
        unit_lower_inverse_kernel[(flat.shape[0],)](flat, A, BT=BT)
    return A.reshape(L.shape)
