"""QuasarAttention kernels: chunked (the benchmarked path) and token-by-token."""

from fla.ops.quasar.chunk import chunk_quasar
from fla.ops.quasar.fused_recurrent import fused_recurrent_quasar

__all__ = ["chunk_quasar", "fused_recurrent_quasar"]
