"""Kernels. QuasarAttention's live in fla.ops.quasar."""

from fla.ops.quasar import chunk_quasar, fused_recurrent_quasar

__all__ = ["chunk_quasar", "fused_recurrent_quasar"]
