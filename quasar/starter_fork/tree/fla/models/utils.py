"""Cache: the per-layer states a recurrent layer carries from one call to the next (decoding)."""

from __future__ import annotations

from typing import Any


class Cache:
    """States of each layer, the interface fla's layers use (``past_key_values``).

    ``cache[layer_idx]`` is a dict with ``recurrent_state`` and ``conv_state``; layers write
    theirs with :meth:`update`, in layer order.
    """

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []
        self._seen_tokens = 0

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, layer_idx: int) -> dict[str, Any]:
        return self.states[layer_idx]

    def update(self, recurrent_state: Any = None, conv_state: Any = None, layer_idx: int = 0, offset: int = 1) -> dict[str, Any]:
        """Store a layer's states after a call that consumed ``offset`` tokens."""
        if layer_idx > len(self.states):
            raise ValueError(f"layer {layer_idx} updated before layer {len(self.states)}: update layers in order")
        state = {"recurrent_state": recurrent_state, "conv_state": conv_state}
        if layer_idx == len(self.states):
            self.states.append(state)
        else:
            self.states[layer_idx] = state
        if layer_idx == 0:
            self._seen_tokens += offset
        return state

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen so far (0 before the layer's first update)."""
        return self._seen_tokens if layer_idx < len(self.states) else 0
