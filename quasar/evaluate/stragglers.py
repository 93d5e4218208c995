"""Processes that slip out of a sandbox: found by the marker variable in their environment, killed.

In the namespaced sandbox the PID namespace ends every process with its init; this catches what
a fork starts without it (``--allow-unsandboxed``: a double fork with setsid).
"""

from __future__ import annotations

import os
import signal
import time

# The variable every sandboxed process carries (sandbox_contents.scrubbed_environment), set to the sandbox's marker.
MARKER_VARIABLE = "QUASAR_SANDBOX_ID"


def _marked(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return needle in environ.read().split(b"\0")
    except OSError:
        return False


def kill_marked_processes(marker: str, grace_seconds: float = 2.0) -> int:
    """Kill processes whose environment carries ``QUASAR_SANDBOX_ID=marker``; return how many.

    The PID namespace already ends every sandboxed process with its init; this catches what
    slips out in unsandboxed mode (a double fork with setsid) and waits ``grace_seconds`` for a
    dying namespace to empty before counting.
    """
    if not os.path.isdir("/proc"):
        return 0
    needle = f"{MARKER_VARIABLE}={marker}".encode()
    killed: set[int] = set()
    deadline = time.monotonic() + grace_seconds
    while True:
        found = [int(name) for name in os.listdir("/proc") if name.isdigit() and _marked(int(name), needle)]
        if not found:
            return len(killed)
        if time.monotonic() >= deadline:
            for pid in found:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            if killed.issuperset(found):
                time.sleep(0.1)
                return len(killed)
        time.sleep(0.05)
