"""A minimal flash-linear-attention tree holding QuasarAttention and its kernels.

Written as the QUASAR subnet's starter fork: the layer, its Triton kernels, and the helpers they
import, with fla's module paths and names.
"""

from fla.layers import QuasarAttention
from fla.models import Cache
from fla.ops import chunk_quasar, fused_recurrent_quasar

__version__ = "0.1.0"

__all__ = ["Cache", "QuasarAttention", "chunk_quasar", "fused_recurrent_quasar"]
