"""ShortConvolution: a causal depthwise 1-D convolution followed by SiLU."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ShortConvolution(nn.Conv1d):
    """Causal depthwise convolution over time, kernel ``kernel_size``, then SiLU (or nothing).

    Input and output are ``[B, T, D]``; the weight is nn.Conv1d's ``[D, 1, W]`` (W = kernel_size):
    y_t = act(sum_{s<W} weight[:, 0, W-1-s] * x_{t-s} + bias), with x before a sequence's start 0.

    With ``cu_seqlens`` (B = 1, sequences laid end to end) no sequence sees another's tokens.
    ``cache [N, D, W]`` holds the last W inputs of each sequence (zeros before its start): pass it
    to continue the sequences (decoding) and ask for the updated one with ``output_final_state``.
    """

    def __init__(self, hidden_size: int, kernel_size: int, bias: bool = False, activation: str | None = "silu"):
        super().__init__(hidden_size, hidden_size, kernel_size, groups=hidden_size, bias=bias)
        if activation not in (None, "silu", "swish"):
            raise ValueError(f"activation must be 'silu', 'swish' or None; got {activation!r}")
        self.hidden_size = hidden_size
        self.activation = activation

    def forward(
        self,
        x: torch.Tensor,
        cache: torch.Tensor | None = None,
        output_final_state: bool = False,
        cu_seqlens: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns ``(y [B, T, D], the cache after the last token [N, D, W] or None)``."""
        W = self.kernel_size[0]
        if x.dim() != 3 or x.shape[-1] != self.hidden_size:
            raise ValueError(f"x must be [B, T, {self.hidden_size}]; got {tuple(x.shape)}")
        if cu_seqlens is None:
            sequences = [(x, cache)]
        else:
            if x.shape[0] != 1:
                raise ValueError(f"with cu_seqlens the batch size must be 1; got {x.shape[0]}")
            bounds = cu_seqlens.tolist()
            sequences = [
                (x[:, bos:eos], None if cache is None else cache[n : n + 1])
                for n, (bos, eos) in enumerate(zip(bounds, bounds[1:]))
            ]
        for _, seq_cache in sequences:
            if seq_cache is not None and seq_cache.shape[1:] != (self.hidden_size, W):
                raise ValueError(f"cache must be [N, {self.hidden_size}, {W}]; got {tuple(cache.shape)}")
        results = [self._convolve(xs, cs) for xs, cs in sequences]
        y = torch.cat([r[0] for r in results], 1)
        new_cache = torch.cat([r[1] for r in results]) if output_final_state else None
        return y, new_cache

    def _convolve(self, x: torch.Tensor, cache: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence per batch row: output and the last W inputs (the cache, [B, D, W])."""
        B, T, D = x.shape
        W = self.kernel_size[0]
        history = x.new_zeros(B, W, D) if cache is None else cache.transpose(1, 2).to(x.dtype)
        extended = torch.cat([history, x], 1)
        weight = self.weight.to(x.dtype)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        # W history rows give T + 1 outputs; the first belongs to the step before x.
        y = F.conv1d(extended.transpose(1, 2), weight, bias, groups=D).transpose(1, 2)[:, 1:]
        if self.activation is not None:
            y = F.silu(y)
        return y, extended[:, -W:].transpose(1, 2).contiguous()
