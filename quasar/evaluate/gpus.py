"""Which GPU a sandbox is given, as the NVIDIA driver lists them: its device node and its UUID.

A sandbox holds its own GPU's device node only (sandbox_contents.py), so a fork cannot reach the GPU a
neighbour's evaluation is timed on; CUDA is told the GPU by its UUID.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class NvidiaGpu:
    """A GPU as the NVIDIA driver lists it (/proc/driver/nvidia/gpus): PCI bus, device node minor,
    UUID and model name."""

    bus: str
    minor: int
    uuid: str
    model: str = ""


def nvidia_gpus(root: str = "/proc/driver/nvidia/gpus") -> list[NvidiaGpu]:
    """The driver's GPUs in PCI bus order (the order ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` numbers them);
    empty where there is no NVIDIA driver or its listing is unreadable."""
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
    """The GPU ``physical`` (a PCI-order index or a UUID) names, or None (a MIG id, or unknown)."""
    if physical.isdigit() and int(physical) < len(gpus):
        return gpus[int(physical)]
    return next((gpu for gpu in gpus if gpu.uuid == physical), None)
