"""Stopping a long-running process (the miner, the local network) on SIGINT or SIGTERM (pm2 stop)."""

from __future__ import annotations

import signal
import threading


def stop_on_signals(stop: threading.Event) -> None:
    """Make SIGINT and SIGTERM set ``stop`` and raise KeyboardInterrupt in the main thread. The
    exception ends the work under way at once; the flag holds where Python drops the exception (a
    signal landing in a finaliser or a weakref callback: "Exception ignored in ..."), so the
    process's loops and waits still end at their next check instead of running until it is killed."""

    def handler(signum: int, frame: object) -> None:
        stop.set()
        raise KeyboardInterrupt(f"signal {signum}")

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handler)
