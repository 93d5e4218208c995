"""Forward substitution: solving with a unit lower-triangular chunk matrix (I + L).

The chunked delta rule needs A = (I + strict_tril(D K K^T))^-1 applied to right-hand sides for
each chunk of C = 64 tokens (D = diag(alpha)). Inside the kernels the chunk is split into four
blocks of 16 rows:

- ``forward_substitution_batched`` inverts diagonal blocks, one row at a time: row i of the
  inverse is e_i - sum_{j<i} L[i, j] A[j, :], every row j < i being final already (a batch of
  blocks at once; ``forward_substitution_kernel`` is the one-block form);
- ``product_inverse_batched`` inverts the same blocks with tensor-core dots instead: L is
  nilpotent (L^16 = 0 for a 16-row block), so (I + L)^-1 = (I - L)(I + L^2)(I + L^4)(I + L^8),
  three squarings and three products where the substitution takes 15 dependent steps;
- ``chunk_factors`` computes alpha, the four diagonal inverses (together) and the six
  off-diagonal blocks L_ij = diag(alpha_i) K_i K_j^T of a chunk;
- ``block_solve`` solves (I + L) X = R block row by block row (tensor-core dots), so the 64x64
  inverse is never formed: X_i = A_ii (R_i - sum_{j<i} L_ij X_j).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.ops.quasar.gate import quasar_alpha

# Rows of the sub-blocks a 64-token chunk is split into (a constexpr: the kernels read it).
BLOCK_ROWS = tl.constexpr(16)
# How the chunk kernels invert the diagonal blocks (tuning.json's ``wy_inverse``).
INVERSES = ("substitution", "product")
# The product form's factors after (I - L) for a block of BLOCK_ROWS rows: log2(BLOCK_ROWS) - 1.
BLOCK_SQUARINGS = tl.constexpr(BLOCK_ROWS.value.bit_length() - 2)


@triton.jit
def forward_substitution_batched(b_L, BT: tl.constexpr):
    """(I + L)^-1 of each of a batch of strictly lower-triangular fp32 blocks ``b_L [NB, BT, BT]``.

    Row i of each inverse is e_i - sum_{j<i} L[i, j] A[j, :]; the blocks of the batch take their
    BT - 1 steps together, so the number of sequential steps does not grow with the batch.
    """
    o_i = tl.arange(0, BT)
    row = o_i[None, :, None]
    b_A = tl.where(row == o_i[None, None, :], 1.0, 0.0) + tl.zeros_like(b_L)
    for i in range(1, BT):
        b_l = tl.sum(tl.where(row == i, b_L, 0.0), 1)
        b_a = tl.sum(b_l[:, :, None] * b_A, 1)
        b_A = tl.where(row == i, b_A - b_a[:, None, :], b_A)
    return b_A


@triton.jit
def product_inverse_batched(b_L, BT: tl.constexpr, SQUARINGS: tl.constexpr, PRECISION: tl.constexpr):
    """(I + L)^-1 of each of a batch of strictly lower-triangular fp32 blocks ``b_L [NB, BT, BT]``
    as the product (I - L)(I + L^2)(I + L^4)...(I + L^(BT/2)), exact because L^BT = 0
    (``SQUARINGS`` = log2(BT) - 1, the factors after the first).

    The dots take fp32 operands ("ieee" for "ieee", else TF32): the factors' rounding stays far
    under the bf16 rounding of the operands the inverse is then applied to.
    """
    o_i = tl.arange(0, BT)
    eye = tl.where(o_i[:, None] == o_i[None, :], 1.0, 0.0)[None, :, :]
    b_A = eye - b_L
    b_P = b_L
    for _ in tl.static_range(SQUARINGS):
        b_P = _fp32_dot(b_P, b_P, PRECISION)
        b_A += _fp32_dot(b_A, b_P, PRECISION)
    return b_A


@triton.jit
def _fp32_dot(a, b, PRECISION: tl.constexpr):
    if PRECISION == "ieee":
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b, input_precision="tf32")


@triton.jit
def forward_substitution_kernel(b_L, BT: tl.constexpr):
    """(I + L)^-1 of a strictly lower-triangular fp32 block ``b_L [BT, BT]`` (a device function)."""
    return tl.reshape(forward_substitution_batched(tl.reshape(b_L, (1, BT, BT)), BT), (BT, BT))


@triton.jit
def mm(a, b, PRECISION: tl.constexpr):
    """a @ b with fp32 accumulation: bf16 operands for "bf16", else fp32 ones ("tf32"/"ieee")."""
    if PRECISION == "bf16":
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)


@triton.jit
def load_block(x, bos, rows, cols, T, i_h, H: tl.constexpr, D: tl.constexpr):
    """Rows ``rows`` (positions inside the sequence starting at ``bos``) and columns ``cols`` of
    head ``i_h`` of a ``[1, T_total, H, D]`` tensor; rows at or past ``T``, columns past D are zero."""
    mask = (rows < T)[:, None] & (cols < D)[None, :]
    return tl.load(x + ((bos + rows)[:, None] * H + i_h) * D + cols[None, :], mask=mask, other=0.0)


@triton.jit
def load_rows(x, bos, rows, T, i_h, H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """Rows ``rows`` of head ``i_h`` of a ``[1, T_total, H, D]`` tensor as a ``[len(rows), BD]`` block."""
    return load_block(x, bos, rows, tl.arange(0, BD), T, i_h, H, D)


@triton.jit
def store_block(x, value, bos, rows, cols, T, i_h, H: tl.constexpr, D: tl.constexpr):
    """Write ``value`` where :func:`load_block` reads (rows at or past ``T`` are left alone)."""
    mask = (rows < T)[:, None] & (cols < D)[None, :]
    tl.store(x + ((bos + rows)[:, None] * H + i_h) * D + cols[None, :], value.to(x.dtype.element_ty), mask=mask)


@triton.jit
def chunk_factors(k0, k1, k2, k3, k_blocks, b_beta, PRECISION: tl.constexpr, INVERSE: tl.constexpr):
    """alpha of each block, the inverses of the diagonal blocks of (I + strict_tril(D K K^T)),
    and its blocks below the diagonal, for one chunk of four 16-row key blocks (``k_blocks`` is
    the same chunk as one ``[4, 16, BK]`` block: the diagonal blocks are inverted together, by
    forward substitution or as a product, as ``INVERSE`` says)."""
    o_c = tl.arange(0, BLOCK_ROWS)
    strict = (o_c[:, None] > o_c[None, :])[None, :, :]
    k_float = k_blocks.to(tl.float32)
    alpha = quasar_alpha(tl.sum(k_float * k_float, 2), b_beta)
    gram = mm(k_blocks, tl.permute(k_blocks, (0, 2, 1)), PRECISION)
    lower = tl.where(strict, gram * alpha[:, :, None], 0.0)
    if INVERSE == "product":
        inverses = product_inverse_batched(lower, BLOCK_ROWS, BLOCK_SQUARINGS, PRECISION)
    else:
        inverses = forward_substitution_batched(lower, BLOCK_ROWS)
    # The four inverses and alphas taken out of their batches by splitting the batch index
    # (b = 2 h + l) off as the last two axes: a selection in registers. Summing the batch masked
    # to each block reduced across the warps through shared memory, 64 scalar stores and loads a
    # program (0.201 ms a 65,536-token tile on an H100); each alpha computed again from its block
    # cost more instructions, barriers and spills (0.175 ms). Both split: 0.165 ms
    # (benchmarks/RESULTS.md).
    halves = tl.permute(tl.reshape(inverses, (2, 2, BLOCK_ROWS, BLOCK_ROWS)), (2, 3, 0, 1))
    even, odd = tl.split(halves)
    i0, i2 = tl.split(even)
    i1, i3 = tl.split(odd)
    alpha_even, alpha_odd = tl.split(tl.permute(tl.reshape(alpha, (2, 2, BLOCK_ROWS)), (2, 0, 1)))
    a0, a2 = tl.split(alpha_even)
    a1, a3 = tl.split(alpha_odd)
    l10 = mm(k1, tl.trans(k0), PRECISION) * a1[:, None]
    l20 = mm(k2, tl.trans(k0), PRECISION) * a2[:, None]
    l21 = mm(k2, tl.trans(k1), PRECISION) * a2[:, None]
    l30 = mm(k3, tl.trans(k0), PRECISION) * a3[:, None]
    l31 = mm(k3, tl.trans(k1), PRECISION) * a3[:, None]
    l32 = mm(k3, tl.trans(k2), PRECISION) * a3[:, None]
    return a0, a1, a2, a3, i0, i1, i2, i3, l10, l20, l21, l30, l31, l32


@triton.jit
def block_solve(i0, i1, i2, i3, l10, l20, l21, l30, l31, l32, r0, r1, r2, r3, PRECISION: tl.constexpr):
    """X = (I + L)^-1 R for a chunk given as 16-row blocks (diagonal inverses i*, blocks l*)."""
    x0 = mm(i0, r0, PRECISION)
    x1 = mm(i1, r1 - mm(l10, x0, PRECISION), PRECISION)
    x2 = mm(i2, r2 - mm(l20, x0, PRECISION) - mm(l21, x1, PRECISION), PRECISION)
    x3 = mm(i3, r3 - mm(l30, x0, PRECISION) - mm(l31, x1, PRECISION) - mm(l32, x2, PRECISION), PRECISION)
    return x0, x1, x2, x3


@triton.jit
def unit_lower_inverse_kernel(L, A, BT: tl.constexpr, PRODUCT: tl.constexpr, SQUARINGS: tl.constexpr):
    i_b = tl.program_id(0).to(tl.int64)
    o_i = tl.arange(0, BT)
    p = i_b * BT * BT + o_i[:, None] * BT + o_i[None, :]
    b_L = tl.load(L + p).to(tl.float32)
    b_L = tl.where(o_i[:, None] > o_i[None, :], b_L, 0.0)
    if PRODUCT:
        b_A = tl.reshape(product_inverse_batched(tl.reshape(b_L, (1, BT, BT)), BT, SQUARINGS, "ieee"), (BT, BT))
    else:
        b_A = forward_substitution_kernel(b_L, BT)
    tl.store(A + p, b_A)


def unit_lower_inverse(L: torch.Tensor, method: str = "substitution") -> torch.Tensor:
    """(I + strict_tril(L))^-1 for a batch ``L [..., BT, BT]`` (BT a power of two), in float32.

    The entries of L on and above the diagonal are ignored. ``method`` is one of
    :data:`INVERSES` (the product form takes BT >= 16, the smallest tensor-core dot). The
    standalone form of what the chunk kernel does in registers; useful to test each by itself.
    """
    if L.dim() < 2 or L.shape[-2] != L.shape[-1] or L.shape[-1] < 1 or L.shape[-1] & (L.shape[-1] - 1):
        raise ValueError(f"L must be [..., BT, BT] with BT a power of two, got {tuple(L.shape)}")
    if method not in INVERSES or (method == "product" and L.shape[-1] < 16):
        raise ValueError(f"method must be one of {INVERSES} (product: BT >= 16); got {method!r} with BT={L.shape[-1]}")
    BT = L.shape[-1]
    flat = L.reshape(-1, BT, BT).to(torch.float32).contiguous()
    A = torch.empty_like(flat)
    if flat.shape[0]:
        unit_lower_inverse_kernel[(flat.shape[0],)](flat, A, BT=BT, PRODUCT=method == "product",
                                                     SQUARINGS=BT.bit_length() - 2)
    return A.reshape(L.shape)
