"""The QuasarAttention gate: the step size alpha_t of the delta rule.

    lambda_t = ||k_t||^2
    alpha_t  = (1 - exp(-beta_h * lambda_t)) / (lambda_t + 1e-8)

so alpha_t * lambda_t < 1 and each update shrinks the state along k_t by exp(-beta_h * lambda_t).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def quasar_alpha(lam, beta):
    """alpha from lambda = ||k||^2 (fp32 tensor) and beta (fp32 scalar), inside a kernel.

    1 - exp(-x) loses digits to cancellation for small x; there a Taylor series to x^5 is used
    (its truncation error, x^5 / 720 relative, is below float32 resolution for x < 0.1).
    """
    x = beta * lam
    series = x * (1.0 - x * (0.5 - x * (1.0 / 6.0 - x * (1.0 / 24.0 - x * (1.0 / 120.0)))))
    one_minus_exp = tl.where(x < 0.1, series, 1.0 - tl.exp(-x))
    return one_minus_exp / (lam + 1e-8)


def quasar_alpha_torch(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """alpha for keys ``k [..., H, K]`` and per-head ``beta [H]``: ``[..., H]``.

    Computed in float64 for float64 keys, else in float32.
    """
    dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
    lam = k.to(dtype).square().sum(-1)
    return -torch.expm1(-beta.to(dtype) * lam) / (lam + 1e-8)
