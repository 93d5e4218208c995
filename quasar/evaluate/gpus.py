"""Which GPU a sandbox is given, as the NVIDIA driver lists them: its device node and its UUID.

A sandbox holds its own GPU's device node only (sandbox_contents.py), so a fork cannot reach the GPU a
neighbour's evaluation is timed on; CUDA is told the GPU by its UUID.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from dataclasses import dataclass

from quasar.errors import QuasarError

DRIVER_GPUS = "/proc/driver/nvidia/gpus"


class GpuOrderError(QuasarError, ValueError):
    """``CUDA_DEVICE_ORDER`` is set to an order other than the PCI bus order QUASAR numbers GPUs in."""


@dataclass(frozen=True)
class NvidiaGpu:
    """A GPU as the NVIDIA driver lists it (/proc/driver/nvidia/gpus): PCI bus, device node minor,
    UUID and model name."""

    bus: str
    minor: int
    uuid: str
    model: str = ""


def nvidia_gpus() -> list[NvidiaGpu]:
    """The driver's GPUs in PCI bus order (the order ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers them),
    from :data:`DRIVER_GPUS`; empty where there is no NVIDIA driver or its listing is unreadable."""
    root = DRIVER_GPUS
    found = []
    try:
        buses = os.listdir(root)
    except OSError:
        return []
    for bus in buses:
        fields = {}
        try:
            with open(os.path.join(root, bus, "information")) as information:
                for line in information:
                    key, _, value = line.partition(":")
                    fields[key.strip()] = value.strip()
            found.append(
                NvidiaGpu(bus.lower(), int(fields["Device Minor"]), fields["GPU UUID"], fields.get("Model", ""))
            )
        except (OSError, KeyError, ValueError):
            return []
    return sorted(found, key=lambda gpu: gpu.bus)


def assigned_gpu(physical: str, gpus: list[NvidiaGpu]) -> NvidiaGpu | None:
    """The GPU ``physical`` names, or None (a MIG id, or unknown): a PCI-order index, a UUID, or
    the start of one UUID only (``GPU-8a1f0c2e``, as CUDA takes it)."""
    if physical.isdigit():
        return gpus[int(physical)] if int(physical) < len(gpus) else None
    if not physical.startswith("GPU-"):
        return None
    matches = [gpu for gpu in gpus if gpu.uuid.startswith(physical)]
    return matches[0] if len(matches) == 1 else None


def describe_gpus(gpus: list[NvidiaGpu]) -> str:
    """The driver's GPUs as an error message lists them: index, PCI bus, model, UUID."""
    if not gpus:
        return f"the NVIDIA driver lists no GPU ({DRIVER_GPUS} is missing or unreadable)"
    listed = "; ".join(f"{index}: {gpu.bus} {gpu.model or '?'} {gpu.uuid}" for index, gpu in enumerate(gpus))
    return f"the NVIDIA driver lists {len(gpus)} GPU(s) (nvidia-smi's numbering, PCI bus order): {listed}"


def missing_gpu(device: str, cuda_count: int, visible: str | None = None) -> str | None:
    """Why ``device`` (``cuda`` or ``cuda:N``) names none of the ``cuda_count`` GPUs torch sees, or
    None where it names one (or is ``cpu``). ``visible`` is the process's ``CUDA_VISIBLE_DEVICES``,
    named in the message. Each tool says this at start: torch says it late and obscurely ("Invalid
    device id", or CUDA's "invalid device ordinal" from whatever first touches that GPU)."""
    if not device.startswith("cuda"):
        return None
    index = int(device.partition(":")[2] or 0)
    if index < cuda_count:
        return None
    if cuda_count == 0:
        return "CUDA is not available here: torch sees no CUDA device"
    seen = "cuda:0" if cuda_count == 1 else f"cuda:0 to cuda:{cuda_count - 1}"
    narrowed = f" of CUDA_VISIBLE_DEVICES={visible}" if visible is not None else ""
    return f"torch sees {cuda_count} CUDA device(s), {seen}{narrowed}"


def missing_gpu_here(device: str) -> str | None:
    """:func:`missing_gpu` in this process: the GPUs torch counts, and its ``CUDA_VISIBLE_DEVICES``."""
    if not device.startswith("cuda"):
        return None
    import torch  # only where a GPU is asked for: the rest of this module reads the driver's files alone

    return missing_gpu(device, torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))


def use_pci_bus_order(environ: MutableMapping[str, str]) -> None:
    """Make CUDA in this process number GPUs in PCI bus order, as nvidia-smi, the driver's listing
    and the sandbox do, so that ``CUDA_VISIBLE_DEVICES=2`` means nvidia-smi's GPU 2 everywhere
    (CUDA's own default, FASTEST_FIRST, can differ on a host with mixed GPU models). Call it before
    CUDA starts. Raises GpuOrderError where ``CUDA_DEVICE_ORDER`` asks for another order."""
    order = environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if order != "PCI_BUS_ID":
        raise GpuOrderError(
            f"CUDA_DEVICE_ORDER={order}: QUASAR numbers GPUs in PCI bus order, as nvidia-smi does "
            "(its evaluations run with CUDA_DEVICE_ORDER=PCI_BUS_ID); unset it or set PCI_BUS_ID, and "
            "name GPUs in CUDA_VISIBLE_DEVICES and DEVICE by nvidia-smi's index or UUID"
        )
    environ["CUDA_DEVICE_ORDER"] = order
