"""The QuasarAttention layer in plain PyTorch (docs/rules.md section 6): the validator's reference.

Same constructor, forward call and parameter names as ``fla.layers.quasar.QuasarAttention`` in
``troy12x/flash-linear-attention``, so a fork layer's ``state_dict()`` loads into it and back::

    q, k, v = SiLU(causal depthwise conv, kernel 4, no bias)(W_{q,k,v} x)
    o       = core(q, k, v, softplus(beta_log))    per head (chunk_quasar_reference)
    g       = W_g2 (W_g1 x) + b_g2                 hidden -> head_dim -> heads*head_dim
    y_h     = RMSNorm(o_h, eps) * w_norm * sigmoid(g_h)
    out     = W_o concat_h(y_h)

Everything runs in float32 (float64 for float64 input) whatever the input, parameter or autocast
dtype, and nothing outside torch is imported.

Two entry points: ``reference_layer_forward(params, x)`` on a plain ``{name: tensor}`` mapping
(a fork layer's ``state_dict()`` as it is) returns the output tensor; the module
``QuasarAttentionReference`` wraps it with fla's ``forward`` signature and return tuple.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quasar.reference.chunk import chunk_quasar_reference, float32_matmul_precision
from quasar.reference.naive import compute_dtype_for

MODES = ("chunk", "fused_recurrent")
PROJECTIONS = ("q", "k", "v")
REQUIRED_PARAMETERS = (
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "beta_log",
    "g_proj.0.weight",
    "g_proj.1.weight",
    "g_proj.1.bias",
    "o_norm.weight",
    "o_proj.weight",
)
CONV_WEIGHTS = tuple(f"{name}_conv1d.weight" for name in PROJECTIONS)
CONV_BIASES = tuple(f"{name}_conv1d.bias" for name in PROJECTIONS)


def _shape(tensor: torch.Tensor) -> list[int]:
    return list(tensor.shape)


def check_layer_parameters(params: Mapping[str, torch.Tensor], hidden_size: int) -> tuple[int, int]:
    """Check names and shapes of a layer's parameters; return ``(num_heads, head_dim)``.

    ``num_heads`` comes from ``beta_log [H]``, ``head_dim`` from ``o_norm.weight [D]``; every
    other shape must agree with them and with ``hidden_size``. Raises ``ValueError`` listing
    every missing, unexpected or misshapen parameter by name.
    """
    problems = [f"missing {name!r}" for name in REQUIRED_PARAMETERS if name not in params]
    conv_weights = [name for name in CONV_WEIGHTS if name in params]
    conv_biases = [name for name in CONV_BIASES if name in params]
    if conv_weights and len(conv_weights) != len(CONV_WEIGHTS):
        problems.append(f"short conv weights must be all of {list(CONV_WEIGHTS)} or none, got {conv_weights}")
    if conv_biases and (len(conv_biases) != len(CONV_BIASES) or not conv_weights):
        problems.append(f"short conv biases must be all of {list(CONV_BIASES)} (with the weights) or none")
    known = set(REQUIRED_PARAMETERS) | set(CONV_WEIGHTS) | set(CONV_BIASES)
    problems += [f"unexpected {name!r}" for name in params if name not in known]
    if problems:
        raise ValueError("layer parameters: " + "; ".join(problems))

    beta_log, norm_weight = params["beta_log"], params["o_norm.weight"]
    if beta_log.dim() != 1 or norm_weight.dim() != 1:
        raise ValueError(
            f"layer parameters: 'beta_log' and 'o_norm.weight' must be vectors, got "
            f"{_shape(beta_log)} and {_shape(norm_weight)}"
        )
    heads, head_dim = beta_log.shape[0], norm_weight.shape[0]
    width = heads * head_dim
    expected = {
        "q_proj.weight": [width, hidden_size],
        "k_proj.weight": [width, hidden_size],
        "v_proj.weight": [width, hidden_size],
        "o_proj.weight": [hidden_size, width],
        "g_proj.0.weight": [head_dim, hidden_size],
        "g_proj.1.weight": [width, head_dim],
        "g_proj.1.bias": [width],
    }
    if conv_weights:
        conv_size = params[CONV_WEIGHTS[0]].shape[-1]
        expected.update({name: [width, 1, conv_size] for name in CONV_WEIGHTS})
        expected.update({name: [width] for name in conv_biases})
    problems = [
        f"{name!r} expected {shape}, got {_shape(params[name])}"
        for name, shape in expected.items()
        if _shape(params[name]) != shape
    ]
    if problems:
        raise ValueError(
            f"layer parameters (num_heads={heads} from 'beta_log', head_dim={head_dim} from "
            f"'o_norm.weight', hidden_size={hidden_size} from the input): " + "; ".join(problems)
        )
    return heads, head_dim


def _causal_conv_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """SiLU of a causal depthwise convolution over time: ``x [B, T, C]``, ``weight [C, 1, K]``.

    ``y_t = sum_j weight[:, 0, j] * x_{t-K+1+j}`` (zeros before the start), i.e. ``nn.Conv1d``
    with left padding K-1, written as K multiply-adds so that no backend (cuDNN's TF32, say)
    changes its precision.
    """
    kernel, length = weight.shape[-1], x.shape[1]
    padded = F.pad(x, (0, 0, kernel - 1, 0))
    y = padded[:, :length] * weight[:, 0, 0]
    for j in range(1, kernel):
        y.addcmul_(padded[:, j : j + length], weight[:, 0, j])
    if bias is not None:
        y += bias
    return F.silu(y)


def _forward_sequence(
    params: Mapping[str, torch.Tensor], x: torch.Tensor, heads: int, head_dim: int, norm_eps: float
) -> torch.Tensor:
    """The layer on ``x [B, T, hidden]`` whose rows are whole sequences; params already cast."""
    batch, length, _ = x.shape
    use_short_conv = CONV_WEIGHTS[0] in params

    def branch(name: str) -> torch.Tensor:
        y = F.linear(x, params[f"{name}_proj.weight"])
        if use_short_conv:
            y = _causal_conv_silu(y, params[f"{name}_conv1d.weight"], params.get(f"{name}_conv1d.bias"))
        return y.reshape(batch, length, heads, head_dim)

    q, k, v = (branch(name) for name in PROJECTIONS)
    beta = F.softplus(params["beta_log"])
    o, _ = chunk_quasar_reference(q, k, v, beta)
    del q, k, v
    gate = F.linear(F.linear(x, params["g_proj.0.weight"]), params["g_proj.1.weight"], params["g_proj.1.bias"])
    gate = gate.reshape(batch, length, heads, head_dim)
    normed = o * torch.rsqrt(o.square().mean(dim=-1, keepdim=True) + norm_eps)
    y = normed * params["o_norm.weight"] * torch.sigmoid(gate)
    return F.linear(y.reshape(batch, length, heads * head_dim), params["o_proj.weight"])


def _check_cu_seqlens(cu_seqlens: torch.Tensor, batch: int, length: int) -> list[int]:
    """Boundaries of packed sequences as a list; ``ValueError`` if they do not describe ``[0, T)``."""
    if batch != 1:
        raise ValueError(f"cu_seqlens: packed sequences need batch size 1, got {batch}")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2 or cu_seqlens.is_floating_point():
        raise ValueError(f"cu_seqlens: expected a 1-D integer tensor [0, ..., T], got {cu_seqlens!r}")
    bounds = [int(b) for b in cu_seqlens.tolist()]
    if bounds[0] != 0 or bounds[-1] != length or any(nxt < prev for prev, nxt in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0 to T={length}, got {bounds}")
    return bounds


@torch.no_grad()
def reference_layer_forward(
    params: Mapping[str, torch.Tensor],
    hidden_states: torch.Tensor,
    *,
    norm_eps: float = 1e-5,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The QuasarAttention layer's output for ``hidden_states [B, T, hidden]``.

    Args:
        params: the layer's parameters by their fla names (a fork layer's ``state_dict()``);
            num_heads, head_dim, conv size and whether there is a short conv (and its bias)
            are read from their shapes and presence. Any dtype or device: they are cast to the
            compute dtype on the input's device.
        hidden_states: ``[B, T, hidden]``, any floating dtype.
        norm_eps: the RMSNorm epsilon (the layer's ``norm_eps``).
        cu_seqlens: optional offsets ``[0, ..., T]`` of independent sequences packed in a
            batch of one (fla's varlen convention): the conv and the state restart at each.

    Returns:
        ``[B, T, hidden]`` in float32, or float64 for float64 input; autocast is off inside.
        Forward only (no autograd).
    """
    if hidden_states.dim() != 3:
        raise ValueError(f"hidden_states: expected shape [B, T, hidden], got {_shape(hidden_states)}")
    if not hidden_states.is_floating_point():
        raise ValueError(f"hidden_states: expected a floating dtype, got {hidden_states.dtype}")
    batch, length, hidden_size = hidden_states.shape
    heads, head_dim = check_layer_parameters(params, hidden_size)
    dtype = compute_dtype_for(hidden_states.dtype)
    with torch.autocast(device_type=hidden_states.device.type, enabled=False), float32_matmul_precision():
        cast = {name: t.detach().to(device=hidden_states.device, dtype=dtype) for name, t in params.items()}
        x = hidden_states.to(dtype)
        bounds = [0, length] if cu_seqlens is None else _check_cu_seqlens(cu_seqlens, batch, length)
        pieces = [
            _forward_sequence(cast, x[:, start:stop], heads, head_dim, norm_eps)
            for start, stop in zip(bounds[:-1], bounds[1:])
            if stop > start
        ]
        if len(pieces) == 1:
            return pieces[0]
        return torch.cat(pieces, dim=1) if pieces else x.new_zeros(batch, 0, hidden_size)


class _NormWeight(nn.Module):
    """Holds ``o_norm.weight`` under fla's name; the gated RMSNorm itself is in the forward."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))


class QuasarAttentionReference(nn.Module):
    """QuasarAttention as plain PyTorch, with fla's constructor and parameter names.

    ``QuasarAttentionReference(hidden_size=512, head_dim=64, num_heads=8, mode="chunk")`` has
    the benchmark layer's 1,120,840 parameters. ``mode`` is checked ("chunk" or
    "fused_recurrent", as in fla) but both name the same function, computed the same way.
    With ``use_short_conv=False`` q, k, v are the plain projections (no conv, no SiLU), as in fla.
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
    ):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
        self.mode = mode
        self.hidden_size = hidden_size
        self.head_dim = head_dim
        self.num_heads = num_heads
        self.use_short_conv = use_short_conv
        self.conv_size = conv_size
        self.conv_bias = conv_bias
        self.layer_idx = layer_idx
        self.norm_eps = norm_eps
        width = num_heads * head_dim

        self.q_proj = nn.Linear(hidden_size, width, bias=False)
        self.k_proj = nn.Linear(hidden_size, width, bias=False)
        self.v_proj = nn.Linear(hidden_size, width, bias=False)
        if use_short_conv:
            # Depthwise: weight [width, 1, conv_size]; the causal left padding is applied in forward.
            self.q_conv1d = nn.Conv1d(width, width, conv_size, groups=width, bias=conv_bias)
            self.k_conv1d = nn.Conv1d(width, width, conv_size, groups=width, bias=conv_bias)
            self.v_conv1d = nn.Conv1d(width, width, conv_size, groups=width, bias=conv_bias)
        self.beta_log = nn.Parameter(torch.empty(num_heads).uniform_(1, 16).log())
        self.g_proj = nn.Sequential(
            nn.Linear(hidden_size, head_dim, bias=False),
            nn.Linear(head_dim, width, bias=True),
        )
        self.o_norm = _NormWeight(head_dim)
        self.o_proj = nn.Linear(width, hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: object | None = None,
        use_cache: bool | None = False,
        output_attentions: bool | None = False,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None, None]:
        """fla's call: returns ``(output, None, past_key_values)`` with ``past_key_values`` None.

        ``attention_mask [B, S]`` (1 = token, 0 = padding; its last T columns are used) runs each
        row's tokens as one sequence and leaves zeros at padding, as fla's unpadding does;
        ``cu_seqlens`` may be passed as a keyword instead (see ``reference_layer_forward``).
        The reference evaluates whole sequences: a cache (``past_key_values``, ``use_cache``)
        is refused. ``output_attentions`` is accepted and, as in fla, returns nothing.
        """
        if past_key_values is not None or use_cache:
            raise ValueError(
                "QuasarAttentionReference evaluates whole sequences: past_key_values and use_cache are not supported"
            )
        cu_seqlens = kwargs.pop("cu_seqlens", None)
        if kwargs:
            raise TypeError(f"QuasarAttentionReference.forward: unexpected keyword arguments {sorted(kwargs)}")
        params = dict(self.named_parameters())
        if attention_mask is None:
            out = reference_layer_forward(params, hidden_states, norm_eps=self.norm_eps, cu_seqlens=cu_seqlens)
        elif cu_seqlens is not None:
            raise ValueError("pass either attention_mask or cu_seqlens, not both")
        else:
            out = self._forward_masked(params, hidden_states, attention_mask)
        return out, None, None

    def _forward_masked(
        self, params: Mapping[str, torch.Tensor], hidden_states: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Each row's unmasked tokens as one sequence; zeros where the mask is 0."""
        if hidden_states.dim() != 3:
            raise ValueError(f"hidden_states: expected shape [B, T, hidden], got {_shape(hidden_states)}")
        batch, length, hidden_size = hidden_states.shape
        if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < length:
            raise ValueError(
                f"attention_mask: expected shape [B, S] with B={batch} and S >= T={length} "
                f"(0 marks padding), got {_shape(attention_mask)}"
            )
        keep = attention_mask[:, -length:].to(device=hidden_states.device) != 0
        out = torch.zeros(
            batch, length, hidden_size, dtype=compute_dtype_for(hidden_states.dtype), device=hidden_states.device
        )
        for row in range(batch):
            positions = keep[row].nonzero().squeeze(1)
            if positions.numel():
                tokens = hidden_states[row : row + 1, positions]
                out[row, positions] = reference_layer_forward(params, tokens, norm_eps=self.norm_eps)[0]
        return out
