"""One deadline for a whole HTTP exchange made with httpx, whichever read or write it is blocked in.

httpx's timeouts hold per operation: a peer that trickles its status line, headers or body a byte
at a time never ends them. :class:`Cutoff` takes each connection's socket as it is made (httpcore's
``trace`` extension) and shuts it down when the deadline passes, so the blocked read ends at once.
A request must have a connection of its own (``Connection: close``) for the cut-off to see it made.
:func:`exchange` makes such a request and reads its answer within a deadline and a size, and
:func:`quoted` is what of the answer a message may quote. Used where the peer may be hostile: the
miner's chat endpoint and the submission API's answers.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Mapping
from typing import Any

import httpx

from quasar.errors import QuasarError

# How much of an unexpected answer an error message quotes: enough to recognize it (a proxy's
# page title, the first wrong fields), never a whole page in the log.
MAX_QUOTED_CHARS = 200


class AnswerLate(QuasarError):
    """The exchange did not end within its deadline."""


class AnswerRefused(QuasarError):
    """The answer is compressed or too large; the message says which, from the word "answered"."""


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


def exchange(
    http: httpx.Client,
    method: str,
    url: str,
    seconds: float,
    max_bytes: int,
    headers: Mapping[str, str] | None = None,
    **options: Any,
) -> httpx.Response:
    """One request of ``http`` and its whole answer, read, within ``seconds`` in all (connecting,
    sending, the status line, headers and body) and ``max_bytes``, uncompressed; ``options`` go to
    the request. Raises :class:`AnswerLate`, :class:`AnswerRefused`, or httpx.HTTPError when the
    peer cannot be reached or breaks the exchange. The request gets a connection of its own
    (``Connection: close``), so :class:`Cutoff` sees it made."""
    headers = {**(headers or {}), "Accept-Encoding": "identity", "Connection": "close"}
    deadline = time.monotonic() + seconds
    with Cutoff(seconds) as cutoff:
        try:
            with http.stream(method, url, headers=headers, extensions={"trace": cutoff.trace}, **options) as response:
                body = _read(response, max_bytes, deadline)
        except httpx.HTTPError:
            if cutoff.expired:
                raise AnswerLate from None
            raise
        if cutoff.expired or time.monotonic() > deadline:
            raise AnswerLate  # the cut may look like the end of a body without a length
    return httpx.Response(response.status_code, headers=response.headers, content=body, request=response.request)


def _read(response: httpx.Response, max_bytes: int, deadline: float) -> bytes:
    """The answer's body, at most ``max_bytes``, read until ``deadline`` (then :func:`exchange` says it was late)."""
    encoding = response.headers.get("Content-Encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise AnswerRefused(f"answered compressed ({quoted(encoding)}); it was asked for identity")
    too_large = AnswerRefused(f"answered with more than {max_bytes:,} bytes")
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    data = bytearray()
    for chunk in response.iter_raw():
        data += chunk
        if len(data) > max_bytes:
            raise too_large
        if time.monotonic() > deadline:
            break
    return bytes(data)


def quoted(text: str, limit: int = MAX_QUOTED_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(text[: limit * 4].split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
