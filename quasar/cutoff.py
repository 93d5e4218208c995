"""One deadline for a whole HTTP exchange made with httpx, whichever read or write it is blocked in.

httpx's timeouts hold per operation: a peer that trickles its status line, headers or body a byte
at a time never ends them. :class:`Cutoff` takes each connection's socket as it is made (httpcore's
``trace`` extension) and shuts it down when the deadline passes, so the blocked read ends at once.
A request must have a connection of its own (``Connection: close``) for the cut-off to see it made.
Used where the peer may be hostile: the miner's chat endpoint and the submission API's answers.
"""

from __future__ import annotations

import socket
import threading


class Cutoff:
    """``with Cutoff(seconds) as cutoff:`` pass ``extensions={"trace": cutoff.trace}`` to the
    request; ``cutoff.expired`` says afterwards whether the deadline cut it."""

    def __init__(self, seconds: float):
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self.expired = False
        self._timer = threading.Timer(seconds, self._cut)
        self._timer.daemon = True

    def __enter__(self) -> Cutoff:
        self._timer.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._timer.cancel()
        with self._lock:
            for kept in self._sockets:
                kept.close()
            self._sockets.clear()

    def trace(self, event: str, info: dict) -> None:
        """httpcore's trace callback: keeps a duplicate of each new connection's socket (TLS later
        wraps the original, whose shutdown then no longer reaches the connection)."""
        if event != "connection.connect_tcp.complete":
            return
        raw = info["return_value"].get_extra_info("socket")
        if raw is None:
            return
        with self._lock:
            kept = raw.dup()
            self._sockets.append(kept)
            if self.expired:
                _shut(kept)

    def _cut(self) -> None:
        with self._lock:
            self.expired = True
            for kept in self._sockets:
                _shut(kept)


def _shut(kept: socket.socket) -> None:
    try:
        kept.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed by the other side
