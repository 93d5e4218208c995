"""The out-of-memory killer's preference for the sandbox's processes: sandbox_init.py writes the
highest, :data:`OOM_SCORE_ADJ`, so that short of memory the host's killer takes them first. That is
a floor only where the validator's root has CAP_SYS_RESOURCE (a container's root lacks it): without,
a process may write its value back down, for the killer to take another process (the validator's, a
neighbour's evaluation) before it. Without a cgroup bounding all of the sandbox's memory, the memory
watchdog (confinement.py) fails a fork that does."""

from __future__ import annotations

OOM_SCORE_ADJ = 1000


def lowered_oom_preference(pids: list[int], uid: int) -> tuple[int, int] | None:
    """A process of ``pids`` running as ``uid`` (the sandbox's own, taken after its setup wrote
    :data:`OOM_SCORE_ADJ`) whose ``oom_score_adj`` is below it, and that value; else None."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as lines:
                real_uid = next((int(line.split()[1]) for line in lines if line.startswith("Uid:")), None)
            if real_uid != uid:
                continue
            with open(f"/proc/{pid}/oom_score_adj") as adjust:
                value = int(adjust.read())
        except (OSError, ValueError):  # gone meanwhile
            continue
        if value < OOM_SCORE_ADJ:
            return pid, value
    return None
