"""Layers."""

from fla.layers.quasar import QuasarAttention

__all__ = ["QuasarAttention"]
