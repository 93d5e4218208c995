"""Where the QuasarAttention ops can run their Triton kernels.

Kept inside ``fla/ops/quasar`` (rather than ``fla.utils``) so that these files can be dropped into
any flash-linear-attention fork: from ``fla.utils`` they need only what upstream fla defines.
"""

from __future__ import annotations

import os

import torch

# Under TRITON_INTERPRET=1 Triton runs kernels on the CPU with NumPy (slow; for tests).
IS_TRITON_INTERPRETER: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_can_run_on(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernels can take this tensor: on CUDA, or on any device in the interpreter."""
    return tensor.is_cuda or IS_TRITON_INTERPRETER
