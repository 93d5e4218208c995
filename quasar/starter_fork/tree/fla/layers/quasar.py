"""QuasarAttention: the layer the QUASAR subnet benchmarks.

Per token x (hidden size C, H heads of size D):

    q, k, v = SiLU(causal depthwise conv, kernel 4)(W_{q,k,v} x)
    o       = delta rule with step alpha_t, per head (fla.ops.quasar)
    g       = W_g2 (W_g1 x) + b          C -> D -> H*D
    y_h     = RMSNorm(o_h) * w * sigmoid(g_h)
    out     = W_o concat_h(y_h)

A long sequence runs ``layer_tile_tokens`` (tuning.json) tokens at a time: each tile's
projections, convolutions (continuing from the previous tile's last inputs), core (continuing
from its state) and output are computed before the next, so the intermediates of only one tile
are ever in memory. The input projections W_q, W_k, W_v and W_g1 run as one matrix product. When
no gradient is needed (chunk mode, where the Triton kernels run), that product is written after
the convolution's W - 1 previous inputs (in a later tile, the product of the W - 1 tokens before
it, projected again with the tile's own), the convolutions + SiLU run as one kernel reading it in
place (fla.ops.quasar.layer_kernels; in long tiles the core's output pass convolves q itself as
it loads it, tuning.json's ``fused_conv``), and the gate's second projection, the RMSNorm and
the gate run inside the core's output pass (``chunk_quasar_norm_gated``). With gradients, the
layer's modules run one after another (``ShortConvolution``, ``chunk_quasar``,
``FusedRMSNormGated``), so every parameter gets its gradient.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from fla.models.utils import Cache
from fla.modules import FusedRMSNormGated, ShortConvolution
from fla.ops.quasar import chunk_quasar, fused_recurrent_quasar
from fla.ops.quasar.chunk import chunk_quasar_norm_gated
from fla.ops.quasar.device import triton_can_run_on
from fla.ops.quasar.layer_kernels import ConvolvedInputs, causal_conv_silu
from fla.ops.quasar.tuning import device_name_of, load_tuning


class QuasarAttention(nn.Module):
    """QuasarAttention layer.

    Args:
        hidden_size: size of the input and output. Default 2048.
        head_dim: size of each head (K = V). Default 128.
        num_heads: number of heads. Default 16.
        mode: "chunk" (chunked kernels, the benchmarked path) or "fused_recurrent" (token by token).
        use_short_conv: causal depthwise convolution + SiLU on q, k, v. Default True.
        conv_size: kernel size of that convolution. Default 4.
        conv_bias: whether the convolution has a bias. Default False.
        layer_idx: this layer's index in a model (the key of its states in ``past_key_values``).
        norm_eps: epsilon of the output RMSNorm. Default 1e-5.
    """

    def __init__(
        self,
        hidden_size: int = 2048,
        head_dim: int = 128,
        num_heads: int = 16,
        mode: str = "chunk",
        use_short_conv: bool = True,
        conv_size: int = 4,
        conv_bias: bool = False,
        layer_idx: int | None = None,
        norm_eps: float = 1e-5,
        **kwargs,
    ) -> None:
        super().__init__()
        if mode not in ("chunk", "fused_recurrent"):
            raise ValueError(f"mode must be 'chunk' or 'fused_recurrent'; got {mode!r}")
        self.mode = mode
        self.hidden_size = hidden_size
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.conv_bias = conv_bias
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.key_dim = num_heads * head_dim
        self.value_dim = num_heads * head_dim
        self.layer_idx = layer_idx

        self.q_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.k_proj = nn.Linear(hidden_size, self.key_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, self.value_dim, bias=False)
        if use_short_conv:
            self.q_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.k_conv1d = ShortConvolution(self.key_dim, conv_size, bias=conv_bias, activation="silu")
            self.v_conv1d = ShortConvolution(self.value_dim, conv_size, bias=conv_bias, activation="silu")
        # beta_h = softplus(beta_log_h), beta_log initialised to log U(1, 16).
        self.beta_log = nn.Parameter(torch.empty(num_heads, dtype=torch.float32).uniform_(1, 16).log())
        self.beta_log._no_weight_decay = True
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, head_dim, bias=False),
            nn.Linear(head_dim, self.value_dim, bias=True),
        )
        self.o_norm = FusedRMSNormGated(head_dim, activation="sigmoid", eps=norm_eps)
        self.o_proj = nn.Linear(self.value_dim, hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs,
    ) -> tuple[torch.Tensor, None, Cache | None]:
        """``hidden_states [B, T, hidden_size]`` -> ``(output [B, T, hidden_size], None, past_key_values)``.

        ``attention_mask [B, T]`` (1 = token, 0 = padding) runs each row as its own sequence;
        ``cu_seqlens`` (keyword, with B = 1) does the same for sequences laid end to end.
        ``past_key_values`` with ``use_cache`` carries the recurrent and convolution states across
        calls (decoding). There are no attention weights to output.
        """
        if attention_mask is not None and attention_mask.dim() != 2:
            raise ValueError(f"attention_mask must be a [B, T] padding mask; got {tuple(attention_mask.shape)}")
        if past_key_values is not None and self.layer_idx is None:
            raise ValueError("past_key_values needs the layer's layer_idx (set it in the constructor)")
        batch_size, q_len, _ = hidden_states.shape
        cu_seqlens = kwargs.get("cu_seqlens")

        last_state = None
        if past_key_values is not None and len(past_key_values) > self.layer_idx:
            last_state = past_key_values[self.layer_idx]

        indices = None
        if attention_mask is not None:
            keep = attention_mask[:, -q_len:].bool()
            indices = torch.nonzero(keep.flatten()).flatten()
            cu_seqlens = F.pad(keep.sum(-1).cumsum(0), (1, 0)).to(torch.int32)
            hidden_states = hidden_states.reshape(batch_size * q_len, -1)[indices].unsqueeze(0)

        recurrent_state = last_state["recurrent_state"] if last_state is not None else None
        conv_state = last_state["conv_state"] if last_state is not None and self.use_short_conv else (None, None, None)
        length = hidden_states.shape[1]
        # Packed sequences run whole; one sequence per row runs in tiles carrying its states.
        tiling = load_tuning(device=device_name_of(hidden_states)).layer_tile_tokens
        # A tile is at least the conv's kernel wide, so a later tile's conv inputs before it are
        # tokens of the sequence (_KernelTiles projects them again).
        tile = length if cu_seqlens is not None else max(self.conv_size, tiling)
        if self._runs_in_kernels(hidden_states, cu_seqlens):
            step = _KernelTiles(self, hidden_states)
        else:
            weight = self._input_weight()

            def step(start, stop, recurrent_state, conv_state, carry):
                return self._forward_tile(hidden_states[:, start:stop], weight, recurrent_state, conv_state, carry,
                                          cu_seqlens)
        o = o_weight = None
        for start in range(0, max(length, 1), tile):
            stop = min(start + tile, length)
            carry = bool(use_cache) or stop < length
            y, recurrent_state, conv_state = step(start, stop, recurrent_state, conv_state, carry)
            if stop == length and start == 0:
                o = self.o_proj(y)
                continue
            if o is None:
                o = y.new_empty(y.shape[0], length, self.hidden_size)
            out = o[:, start:stop]
            if out.is_contiguous() and not torch.is_grad_enabled():
                # The tile's output projection straight into its rows (autocast skips out= calls,
                # so the weight takes y's dtype here, as autocast would give it; out= calls are
                # not differentiable, so with gradients the rows are copied).
                o_weight = self.o_proj.weight.to(y.dtype).t() if o_weight is None else o_weight
                torch.matmul(y, o_weight, out=out)
            else:
                out.copy_(self.o_proj(y))
        if past_key_values is not None:
            past_key_values.update(
                recurrent_state=recurrent_state, conv_state=conv_state if self.use_short_conv else None,
                layer_idx=self.layer_idx, offset=q_len,
            )
        if indices is not None:
            padded = o.new_zeros(batch_size * q_len, o.shape[-1])
            padded[indices] = o[0]
            o = padded.view(batch_size, q_len, -1)
        return o, None, past_key_values

    def _runs_in_kernels(self, x: torch.Tensor, cu_seqlens: torch.Tensor | None) -> bool:
        """Whether the tiles run the no-gradient path of fused kernels (:class:`_KernelTiles`)."""
        return (
            not torch.is_grad_enabled() and self.mode == "chunk" and self.use_short_conv and cu_seqlens is None
            and self.key_dim == self.value_dim and self.o_norm.activation == "sigmoid"
            and self.o_norm.weight is not None and triton_can_run_on(x)
        )

    def _input_weight(self) -> torch.Tensor:
        """W_q, W_k, W_v and W_g1 stacked ``[3 H D + D, hidden]``: the input projections as one product."""
        return torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.g_proj[0].weight])

    def _forward_tile(self, x, weight, recurrent_state, conv_state, carry, cu_seqlens):
        """One tile ``x [B, L, hidden]`` from the states after the previous one, through the layer's
        modules (differentiable; ``weight`` is :meth:`_input_weight`): returns its gated, normalised
        heads ``[B, L, H * D]`` (the output projection's input) and, when ``carry``, the states after
        this tile (else None)."""
        projected = F.linear(x, weight)
        qkv, g = projected.split([2 * self.key_dim + self.value_dim, self.head_dim], -1)
        q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], -1)
        if self.use_short_conv:
            conv_q, conv_k, conv_v = conv_state
            q, conv_q = self.q_conv1d(q, cache=conv_q, output_final_state=carry, cu_seqlens=cu_seqlens)
            k, conv_k = self.k_conv1d(k, cache=conv_k, output_final_state=carry, cu_seqlens=cu_seqlens)
            v, conv_v = self.v_conv1d(v, cache=conv_v, output_final_state=carry, cu_seqlens=cu_seqlens)
            conv_state = (conv_q, conv_k, conv_v)
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)) for t in (q, k, v))
        kernel = chunk_quasar if self.mode == "chunk" else fused_recurrent_quasar
        o, recurrent_state = kernel(
            q, k, v, F.softplus(self.beta_log.float()), initial_state=recurrent_state, output_final_state=carry,
            cu_seqlens=cu_seqlens,
        )
        return self.o_norm(o, self._gate(g)).flatten(-2), recurrent_state, conv_state

    def _gate(self, g: torch.Tensor) -> torch.Tensor:
        """g_proj[1] of ``g [B, L, D]`` as ``[B, L, H, D]``, run on a 2-D view: one matrix product
        with its bias (a 3-D strided input costs an extra pass for the bias)."""
        return self.g_proj[1](g.flatten(0, -2)).unflatten(0, g.shape[:-1]).unflatten(-1, (self.num_heads, self.head_dim))


class _KernelTiles:
    """The tiles of one forward without gradients: one conv kernel reading the projections in
    place (q left to the core's output pass in long tiles), and the core with the RMSNorm + gate
    (W_g2 and its bias included) in its output pass, reading W_g1 x where the input projection
    wrote it. The weights are prepared once per forward, not per tile. (A side stream casting the
    next tile's input during this tile's core gained nothing measurable on an H100:
    benchmarks/RESULTS.md.)"""

    def __init__(self, layer: QuasarAttention, hidden_states: torch.Tensor):
        self.layer = layer
        self.hidden_states = hidden_states
        device = hidden_states.device
        autocast = torch.is_autocast_enabled(device.type)
        self.dtype = torch.get_autocast_dtype(device.type) if autocast else hidden_states.dtype
        self.weight = layer._input_weight().to(self.dtype).t()
        self.conv_weight = torch.cat([layer.q_conv1d.weight, layer.k_conv1d.weight, layer.v_conv1d.weight]).squeeze(1)
        self.beta = F.softplus(layer.beta_log.float())
        self.gate_weight = layer.g_proj[1].weight.to(self.dtype)
        tuning = load_tuning(device=device_name_of(hidden_states))
        # Those of q, k, v the core's kernels convolve as they load them (tuning.json's fused_conv),
        # in tiles long enough for it to pay: on an H100 it gave +2% at 1M, +1.2% at 65,536 and
        # -14% to -22% at 512 to 8,192 tokens (benchmarks/RESULTS.md).
        self.fused = tuning.fused_conv
        self.fused_min_tokens = tuning.fused_conv_min_tokens

    def __call__(self, start, stop, recurrent_state, conv_state, carry):
        """Tokens ``start`` to ``stop`` of the hidden states as :meth:`QuasarAttention._forward_tile`
        returns a tile, but the conv states after the tile only where they leave the layer (after
        its last tile): a later tile projects its W - 1 inputs before it again from the hidden
        states."""
        layer = self.layer
        taps = layer.conv_size
        width = 2 * layer.key_dim + layer.value_dim
        # A tile after the first projects the sequence's W - 1 tokens before it again, with its own:
        # W - 1 more rows of the product instead of the previous tile's conv inputs carried across
        # (a concatenation and two copies a tile: 0.11 ms of kernels at 1M on an H100, and the
        # harness measured 75.2-75.6 M tokens/s instead of 74.7-74.9 M; benchmarks/RESULTS.md).
        inputs_before = taps - 1 if start else 0
        x = self.hidden_states[:, start - inputs_before:stop]
        x_cast = x.to(self.dtype)
        # Each row's projections go after the W - 1 conv inputs before this tile (autocast skips
        # out= calls: the operands have its dtype already).
        buffer = x.new_empty(x.shape[0], taps - 1 + stop - start, self.weight.shape[1], dtype=self.dtype)
        for row in range(x.shape[0]):
            torch.matmul(x_cast[row], self.weight, out=buffer[row, taps - 1 - inputs_before:])
        del x_cast
        if not inputs_before:
            if conv_state[0] is None:
                buffer[:, :taps - 1].zero_()
            else:
                # The cache holds the last W inputs, newest last; the conv reads the last W - 1.
                buffer[:, :taps - 1, :width].copy_(torch.cat(conv_state, 1)[..., 1:].transpose(1, 2))
        # The conv kernel writes k and v, and q (the first of the projections' q | k | v columns)
        # unless the output pass convolves it.
        fused = self.fused if stop - start >= self.fused_min_tokens else ""
        groups = 2 if fused else 3
        first_column = (3 - groups) * layer.key_dim
        written = causal_conv_silu(buffer[..., first_column:], self.conv_weight[first_column:], groups)
        q, k, v = [None] * (3 - groups) + [y.unflatten(-1, (layer.num_heads, layer.head_dim)) for y in written]
        convolved = ConvolvedInputs(buffer, self.conv_weight, fused) if fused else None
        o, recurrent_state = chunk_quasar_norm_gated(
            q, k, v, self.beta, buffer[:, taps - 1:, width:], self.gate_weight, layer.g_proj[1].bias,
            layer.o_norm.weight, layer.o_norm.eps, initial_state=recurrent_state, output_final_state=carry,
            convolved=convolved,
        )
        conv_state = (None, None, None)
        if carry and stop == self.hidden_states.shape[1]:
            last = buffer[:, -taps:, :width].transpose(1, 2).contiguous()
            conv_state = last.split([layer.key_dim, layer.key_dim, layer.value_dim], 1)
        return o.flatten(-2), recurrent_state, conv_state
