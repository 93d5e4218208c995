"""Which CPUs an evaluation's two busy processes run on: the sandboxed child and the parent's timing thread.

At 512–2,048 tokens a forward takes about a millisecond and is bound by the host CPU launching
kernels, so its speed follows the core the child's Python thread runs on and whatever shares that
core: the parent's timing thread busy-polls the pipe, and on an SMT sibling of the child it takes
half the core. Left to the scheduler, placement differs from one evaluation to the next, and so
does the speed. The child therefore gets one physical core (all its hardware threads, for its own
helper threads) and the parent's timing thread another, chosen by :func:`choose_cpus` from the
CPUs this process may use, deterministically from the GPU's index (:func:`device_slot`), so that
a validator running one evaluation per GPU in parallel worker processes gives each GPU its own
cores without the workers talking to each other.

Pinning never fails an evaluation: where the topology is unknown each CPU counts as a core, where
there are too few cores nothing is pinned, and where setting an affinity fails it is logged once
and the evaluation goes on unpinned.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quasar.evaluate.gpus import NvidiaGpu, assigned_gpu, nvidia_gpus

logger = logging.getLogger(__name__)

SYSFS_CPU = Path("/sys/devices/system/cpu")
_failure_logged = False


@dataclass(frozen=True)
class CpuPlan:
    """The CPUs of the sandboxed child and of the parent's timing thread (disjoint physical cores).

    ``shared``: the slot is past the number of core pairs, so its cores are also a lower slot's.
    """

    child: frozenset[int]
    timing: frozenset[int]
    shared: bool = False

    def describe(self) -> str:
        text = f"child on CPUs {format_cpu_list(self.child)}, timing thread on CPUs {format_cpu_list(self.timing)}"
        return text + (" (also another GPU slot's cores: fewer core pairs than GPU slots)" if self.shared else "")


def parse_cpu_list(text: str) -> frozenset[int]:
    """CPUs of a kernel CPU list such as ``0-3,8,10-11``; raises ValueError on anything else."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last) if last else int(first)
        if low < 0 or high < low:
            raise ValueError(f"bad CPU range {part!r} in {text!r}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel's CPU list notation of ``cpus`` (``0-3,8``)."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    start: int | None = None
    previous = -1
    for cpu in [*ordered, None]:
        if start is not None and (cpu is None or cpu != previous + 1):
            parts.append(str(start) if start == previous else f"{start}-{previous}")
            start = None
        if cpu is not None:
            start = cpu if start is None else start
            previous = cpu
    return ",".join(parts)


def read_thread_siblings(cpus: Iterable[int], sysfs_cpu: Path = SYSFS_CPU) -> dict[int, frozenset[int]]:
    """Each CPU's hardware-thread siblings (itself included) from sysfs; a CPU whose file is
    missing or unreadable counts as a core of its own."""
    siblings: dict[int, frozenset[int]] = {}
    for cpu in cpus:
        try:
            found = parse_cpu_list((sysfs_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text())
        except (OSError, ValueError):
            found = frozenset()
        siblings[cpu] = found | {cpu}
    return siblings


def physical_cores(allowed: Iterable[int], siblings: Mapping[int, frozenset[int]]) -> list[frozenset[int]]:
    """The allowed CPUs grouped by physical core, in a fixed order: by lowest CPU, with the core
    of CPU 0 last (it takes more of the system's interrupts and housekeeping)."""
    allowed = frozenset(allowed)
    cores = {(siblings.get(cpu, frozenset()) | {cpu}) & allowed for cpu in allowed}
    return sorted(cores, key=lambda core: (0 in core, min(core)))


def choose_cpus(allowed: Iterable[int], siblings: Mapping[int, frozenset[int]], slot: int) -> CpuPlan | None:
    """The child's and the timing thread's cores for GPU ``slot``, or None where there is only one core.

    Slot ``s`` takes cores ``2s`` and ``2s + 1`` (mod the number of cores) of
    :func:`physical_cores`, so slots ``0 .. n/2 - 1`` get pairwise distinct cores; beyond that
    they wrap round and share (``shared``). The child and the timing thread never share a core.
    """
    cores = physical_cores(allowed, siblings)
    if len(cores) < 2:
        return None
    child, timing = cores[(2 * slot) % len(cores)], cores[(2 * slot + 1) % len(cores)]
    return CpuPlan(child=child, timing=timing, shared=slot >= len(cores) // 2)


def device_slot(device: str, visible: str | None, gpus: Sequence[NvidiaGpu] = ()) -> int:
    """The slot of ``device`` (``cuda`` or ``cuda:N``): the physical GPU index (PCI bus order)
    where ``CUDA_VISIBLE_DEVICES`` (``visible``) names it by number, or by a UUID among ``gpus``
    (the driver's listing), as a validator's worker sees its GPU as ``cuda`` with
    ``CUDA_VISIBLE_DEVICES`` set to it; else the index ``N`` itself."""
    index = int(device.split(":", 1)[1]) if ":" in device else 0
    entries = [entry.strip() for entry in visible.split(",")] if visible else []
    if index >= len(entries):
        return index
    if entries[index].isdigit():
        return int(entries[index])
    gpu = assigned_gpu(entries[index], list(gpus))
    return gpus.index(gpu) if gpu is not None else index


def plan_for(device: str) -> tuple[CpuPlan | None, str]:
    """The plan for ``device`` on this machine, and a note saying what it is or why there is none."""
    try:
        allowed = os.sched_getaffinity(0)
    except (AttributeError, OSError) as error:
        return None, f"not pinned: this process's CPUs cannot be read ({error})"
    slot = device_slot(device, os.environ.get("CUDA_VISIBLE_DEVICES"), nvidia_gpus())
    plan = choose_cpus(allowed, read_thread_siblings(allowed), slot)
    if plan is None:
        return None, f"not pinned: one physical core among CPUs {format_cpu_list(allowed)}"
    return plan, plan.describe()


def _log_failure(cpus: frozenset[int], error: Exception) -> None:
    global _failure_logged
    level = logging.DEBUG if _failure_logged else logging.INFO
    _failure_logged = True
    logger.log(level, "cannot pin to CPUs %s (%s); the evaluation goes on unpinned", format_cpu_list(cpus), error)


@contextlib.contextmanager
def pinned(cpus: frozenset[int] | None) -> Iterator[bool]:
    """Run the calling thread on ``cpus`` inside the block (True if that took effect), then restore
    its affinity; None, or a failure to set it, leaves it as it is. Processes started inside the
    block inherit ``cpus``."""
    if not cpus:
        yield False
        return
    try:
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, cpus)
    except (AttributeError, OSError) as error:
        _log_failure(cpus, error)
        yield False
        return
    try:
        yield True
    finally:
        try:
            os.sched_setaffinity(0, saved)
        except OSError as error:
            logger.warning("cannot restore this thread's CPUs %s: %s", format_cpu_list(saved), error)
