"""FusedRMSNormGated: RMSNorm over the last dimension, times a weight, times a gate of g."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class FusedRMSNormGated(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight * act(g), computed in fp32, returned in x's dtype.

    ``activation`` "sigmoid" gives act(g) = sigmoid(g) (QuasarAttention's gate); "swish"/"silu"
    gives g * sigmoid(g).
    """

    def __init__(self, hidden_size: int, elementwise_affine: bool = True, eps: float = 1e-5, activation: str = "swish"):
        super().__init__()
        if activation not in ("sigmoid", "swish", "silu"):
            raise ValueError(f"activation must be 'sigmoid', 'swish' or 'silu'; got {activation!r}")
        self.hidden_size = hidden_size
        self.eps = eps
        self.activation = activation
        self.weight = nn.Parameter(torch.ones(hidden_size)) if elementwise_affine else None

    def forward(self, x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.hidden_size or g.shape != x.shape:
            raise ValueError(f"x and g must share a shape ending in {self.hidden_size}; got {tuple(x.shape)}, {tuple(g.shape)}")
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.square().mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        g32 = g.float()
        y = y * (torch.sigmoid(g32) if self.activation == "sigmoid" else F.silu(g32))
        return y.to(x.dtype)
