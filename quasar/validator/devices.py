"""Where a validator's evaluations run: one worker per visible GPU, or one on CPU (pure rules).

Each worker's processes get ``CUDA_VISIBLE_DEVICES`` set to their one GPU, so the evaluation (and
the sandboxed child under it) sees only that GPU, as ``cuda``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quasar.config import DEV_NETWORK
from quasar.errors import QuasarError
from quasar.evaluate.gpus import NvidiaGpu, describe_gpus, missing_gpu


class ValidatorSetupError(QuasarError, RuntimeError):
    """The validator cannot start as configured; the message says what to fix."""


CPU_WARNING = (
    "DEVICE=cpu on {network}: CPU evaluations are not benchmarks (tests and small lengths only); "
    "the tokens/sec this validator reports and ranks by are not comparable to a GPU's"
)


@dataclass(frozen=True)
class Device:
    """Where one evaluation at a time runs: ``name`` as logged, and the ``CUDA_VISIBLE_DEVICES``
    the evaluation's processes get (empty on CPU), so each sees only its own GPU as ``cuda``."""

    name: str
    cuda_visible_devices: str

    @property
    def torch_device(self) -> str:
        return "cpu" if self.name == "cpu" else "cuda"


def evaluation_devices(
    device: str, cuda_count: int, visible: str | None, gpus: Sequence[NvidiaGpu] = ()
) -> list[Device]:
    """The devices evaluations run on: DEVICE=cpu gives one CPU worker, ``cuda`` one worker per
    visible GPU, ``cuda:N`` the N-th visible GPU only. ``visible`` is this process's
    ``CUDA_VISIBLE_DEVICES`` (None when unset); ``cuda_count`` what torch counts; ``gpus`` the
    driver's listing, named in the errors. Raises ValidatorSetupError where CUDA_VISIBLE_DEVICES
    lists a GPU CUDA does not use (CUDA stops at an entry past the last GPU, and uses none when
    one repeats, the list is empty or starts with -1)."""
    if device == "cpu":
        return [Device("cpu", "")]
    found = describe_gpus(list(gpus))
    ids = (
        [item.strip() for item in visible.split(",") if item.strip()]
        if visible is not None
        else [str(index) for index in range(cuda_count)]
    )
    if visible is not None and (not ids or len(ids) != cuda_count):
        raise ValidatorSetupError(
            f"CUDA_VISIBLE_DEVICES={visible!r} lists {len(ids)} GPU(s) but CUDA uses {cuda_count} of them: "
            "an entry past the last GPU ends the list there, a repeated entry, an empty list or -1 leaves "
            f"none, and CUDA takes one MIG instance per process; {found}. List each GPU this validator "
            "may use once, by that index or UUID"
        )
    if not ids:
        raise ValidatorSetupError(
            f"DEVICE is {device} but torch sees no CUDA device ({found}): install the NVIDIA driver and a CUDA "
            "build of torch, or set DEVICE=cpu (dev chain and tests only: CPU results are not benchmarks)"
        )
    if device == "cuda":
        return [Device(f"cuda:{index}", physical) for index, physical in enumerate(ids)]
    no_gpu = missing_gpu(device, len(ids), visible)
    if no_gpu is not None:
        raise ValidatorSetupError(f"DEVICE is {device} but {no_gpu}; {found}")
    return [Device(device, ids[int(device.split(":", 1)[1])])]


def device_warnings(network: str, device: str) -> list[str]:
    """Warnings to log for a device choice that is allowed but not a benchmark."""
    if device == "cpu" and network != DEV_NETWORK:
        return [CPU_WARNING.format(network=network)]
    return []
