"""Reference math for QuasarAttention (docs/rules.md section 6): what miners' kernels are checked against.

- ``naive_quasar``: the token-by-token recurrence, obviously correct, any dtype.
- ``chunk_quasar_reference``: the exact chunked (WY) form, fast enough for a 1M-token sequence.
- ``QuasarAttentionReference`` / ``reference_layer_forward``: the whole layer in plain PyTorch,
  with fla's constructor, forward call and parameter names.
- ``relative_error``: the comparison the evaluation uses.
"""

from __future__ import annotations

import math

import torch

from quasar.reference.chunk import CHUNK_SIZE, chunk_quasar_reference
from quasar.reference.layer import QuasarAttentionReference, check_layer_parameters, reference_layer_forward
from quasar.reference.naive import naive_quasar

__all__ = [
    "CHUNK_SIZE",
    "QuasarAttentionReference",
    "check_layer_parameters",
    "chunk_quasar_reference",
    "naive_quasar",
    "reference_layer_forward",
    "relative_error",
]

# Elements converted to float64 at a time, so comparing two 1M x 512 outputs needs little memory.
_ELEMENTS_PER_STEP = 1 << 24


@torch.no_grad()
def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` (Frobenius norms), accumulated in float64; ``b`` is the reference.

    ``a`` and ``b`` may differ in dtype and device. Returns ``inf`` when either holds a NaN or
    an infinity, or when ``b`` is zero and ``a`` is not; ``0.0`` when both are zero. Raises
    ``ValueError`` when the shapes differ.
    """
    if a.shape != b.shape:
        raise ValueError(f"relative_error: shapes differ, {list(a.shape)} vs reference {list(b.shape)}")
    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
    diff_sq = ref_sq = 0.0
    for start in range(0, a_flat.numel(), _ELEMENTS_PER_STEP):
        a_part = a_flat[start : start + _ELEMENTS_PER_STEP].to(torch.float64)
        b_part = b_flat[start : start + _ELEMENTS_PER_STEP].to(device=a_part.device, dtype=torch.float64)
        diff_sq += float((a_part - b_part).square().sum())
        ref_sq += float(b_part.square().sum())
    if not (math.isfinite(diff_sq) and math.isfinite(ref_sq)):
        return math.inf
    if ref_sq == 0.0:
        return 0.0 if diff_sq == 0.0 else math.inf
    return math.sqrt(diff_sq / ref_sq)
