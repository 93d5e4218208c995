"""Building blocks of the layers."""

from fla.modules.convolution import ShortConvolution
from fla.modules.fused_norm_gate import FusedRMSNormGated

__all__ = ["FusedRMSNormGated", "ShortConvolution"]
