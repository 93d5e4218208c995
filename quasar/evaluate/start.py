"""What an evaluation starts before it has its fork: the sandboxed child, without torch here.

The child's start (its interpreter importing torch on one pinned core, 3.5-6 s on an H100 machine)
does not need the fork: no fork code runs in the child before ``load``, and the fork's files are
copied into its read-only fork directory later (:meth:`SandboxStart.provide_fork`). A validator's
worker therefore starts the child first, then clones the fork and imports torch itself while the
child starts (quasar/validator/worker.py), and hands the started child to ``evaluate``. This module
imports neither torch nor the harness, so the worker can start the child before paying for either.

Nothing here is reused between evaluations: each SandboxStart is one fresh child for one fork.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from quasar.evaluate import pinning, protocol
from quasar.evaluate.sandbox import SandboxedChild, SandboxError, SandboxPolicy

# The benchmark layer's width (workload.HIDDEN_SIZE, which a test holds equal: workload imports torch).
LAYER_WIDTH = 512
# On CUDA both ends busy-poll the pipe this long before sleeping (protocol.Channel): a woken
# process and a cooled-down core add a varying delay to a forward of a millisecond or two.
GPU_SPIN_SECONDS = 0.5


def evaluation_lengths(seq_lens: Sequence[int], target_seq_len: int) -> list[int]:
    """The lengths an evaluation runs, shortest first: ``seq_lens`` plus the target (unchecked:
    the harness's ``check_lengths`` refuses a bad one)."""
    return sorted(set(seq_lens) | {target_seq_len})


def output_offsets(lengths: Sequence[int]) -> tuple[dict[int, int], int]:
    """Where each length's region of the shared area begins (room for a float32 output), and the area's size."""
    offsets, end = {}, 0
    for length in sorted(lengths):
        offsets[length] = end
        end += length * LAYER_WIDTH * 4
    return offsets, end


def cpu_plan(device: str, pin_cpus: bool | None) -> tuple[pinning.CpuPlan | None, str]:
    """Where the child and the timing thread run (pinning.py), and a note for the report;
    ``pin_cpus`` None pins on CUDA only."""
    pin = pin_cpus if pin_cpus is not None else device.startswith("cuda")
    if not pin:
        return None, "not pinned (" + ("pin_cpus is off" if pin_cpus is False else "CPU device") + ")"
    return pinning.plan_for(device)


class SandboxStart:
    """One evaluation's sandboxed child, started at once (its first reply not awaited), with the
    shared area for its outputs (a region per length at ``offsets``), the CPU plan, and the
    SandboxError that kept it from starting, if any. ``repo`` None starts it without its fork:
    :meth:`provide_fork` copies the fork in before the child loads anything."""

    def __init__(
        self,
        lengths: Sequence[int],
        device: str,
        policy: SandboxPolicy,
        pin_cpus: bool | None = None,
        repo: str | os.PathLike | None = None,
    ):
        self.started = time.monotonic()
        self.lengths = sorted(lengths)
        self.device = device
        self.plan, self.note = cpu_plan(device, pin_cpus)
        self.offsets, size = output_offsets(self.lengths)
        self.area = protocol.SharedArea.create(size)
        if self.area is not None and device.startswith("cuda"):
            # Its pages made now, on a thread beside the child's start, not by the child's one
            # core in the middle of the evaluation (the 1M output: 1 GiB). The mapping is made
            # here, so the thread never races close() to make it.
            self.area.mapping()
            threading.Thread(target=self.area.populate, name="quasar-area-populate", daemon=True).start()
        spin = GPU_SPIN_SECONDS if device.startswith("cuda") else 0.0
        self.child = SandboxedChild(
            repo,
            device,
            policy,
            spin_seconds=spin,
            cpus=self.plan.child if self.plan is not None else None,
            shared=self.area,
        )
        self.error: SandboxError | None = None
        try:
            self.child.start()
        except SandboxError as error:
            self.error = error

    def provide_fork(self, repo: str | os.PathLike) -> None:
        """Copy the fork into a child started without one; a fork that cannot be copied (too
        large) is kept as the start's error, reported where the evaluation waits for the child."""
        if self.error is not None:
            return
        try:
            self.child.provide_fork(repo)
        except SandboxError as error:
            self.error = error
            self.child.close()

    def wait(self) -> SandboxedChild:
        """The child once it has replied; raises the SandboxError that kept it from starting."""
        if self.error is not None:
            raise self.error
        self.child.wait_started()
        return self.child

    def close(self) -> None:
        """Kill the child if it is still there, then close the shared area (idempotent)."""
        self.child.close()
        if self.area is not None:
            self.area.close()
            self.area = None
