"""Helpers the kernels share, with the meanings flash-linear-attention gives them.

Everything here also works on a machine without a GPU: the answers are then the safe ones
(no AMD, no large shared memory, plain decorators).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch
import triton

# ROCm builds of PyTorch set torch.version.hip; CUDA and CPU builds leave it None.
IS_AMD: bool = torch.version.hip is not None

# Under TRITON_INTERPRET=1 Triton runs kernels on the CPU with NumPy (slow; for tests), and
# autotuning, which times configurations with a GPU benchmarker, cannot run.
IS_TRITON_INTERPRETER: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

# torch.amp.custom_fwd/custom_bwd with the device fixed to CUDA: under CUDA autocast the
# forward runs with the caller's autocast state and the backward with the same one.
autocast_custom_fwd = functools.partial(torch.amp.custom_fwd, device_type="cuda")
autocast_custom_bwd = functools.partial(torch.amp.custom_bwd, device_type="cuda")

# Extra arguments for triton.autotune: keep tuning results on disk where this Triton can.
autotune_cache_kwargs: dict[str, Any] = (
    {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}
)

# Shared memory per block (opt-in maximum, bytes) of the architectures fla tunes for.
_SHARED_MEMORY_BYTES = {
    "ada": 101_376,
    "ampere": 166_912,
    "hopper": 232_448,
    "none": 102_400,
}


@functools.cache
def _max_shared_memory(device_index: int) -> int:
    """Opt-in shared memory per block of one CUDA device, or 0 where none can be read."""
    if not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
        return 0
    properties = torch.cuda.get_device_properties(device_index)
    optin = getattr(properties, "shared_memory_per_block_optin", 0)
    if optin:
        return int(optin)
    try:
        return int(triton.runtime.driver.active.utils.get_device_properties(device_index)["max_shared_mem"])
    except (RuntimeError, KeyError, AttributeError):
        return 0


def check_shared_mem(arch: str = "none", tensor_idx: int = 0) -> bool:
    """Whether CUDA device ``tensor_idx`` has at least the shared memory of ``arch``.

    ``arch`` is one of "ada", "ampere", "hopper" or "none" (a conservative default); an
    unknown name counts as "none". False on a machine without a GPU.
    """
    needed = _SHARED_MEMORY_BYTES.get(arch.lower(), _SHARED_MEMORY_BYTES["none"])
    return _max_shared_memory(tensor_idx) >= needed


def _first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def input_guard(fn: Callable) -> Callable:
    """Make every tensor argument contiguous and run ``fn`` on the CUDA device of the first one."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        args = tuple(a.contiguous() if isinstance(a, torch.Tensor) else a for a in args)
        kwargs = {k: (v.contiguous() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        tensor = _first_tensor(args, kwargs)
        device = torch.cuda.device(tensor.device) if tensor is not None and tensor.is_cuda else contextlib.nullcontext()
        with device:
            return fn(*args, **kwargs)

    return wrapper


def triton_can_run_on(tensor: torch.Tensor) -> bool:
    """Whether the Triton kernels can take this tensor: on CUDA, or on any device in the interpreter."""
    return tensor.is_cuda or IS_TRITON_INTERPRETER
