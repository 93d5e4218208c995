"""The API server's HTTP/1.1 connections: uvicorn's httptools protocol with a limit on the size of
a request's line and headers and a deadline for them.

uvicorn's httptools protocol reads a request's headers without any limit (its parser concatenates
a header's pieces as they arrive: one 64 MB header cost a worker 63 MB, and quadratic time) and
waits for them forever (a connection that never finishes its headers stays open). Here:

- a request whose line and headers pass ``max_header_bytes`` is answered ``431`` and its
  connection closed, as soon as that many bytes arrived without the end of the headers: the
  parser never holds much more than the limit (plus one read from the socket, 256 KiB at most);
- a connection must send a request's whole line and headers within ``header_timeout_s`` of its
  start (or of the request's first byte, on a kept-alive connection), else it is answered ``408``
  and closed. Idle kept-alive connections are closed by uvicorn's keep-alive timeout as before.

Bytes are counted as they arrive from the socket, from the first byte of the request; on a
connection that pipelines requests, the bytes of a read that ends one request and starts the next
all count against the next, so the limit is then approximate by up to one read.

``python -m quasar.api serve`` runs every worker with it (``protocol_factory``); a reverse proxy in
front (docs/api.md, "Deployment") adds per-IP connection and request limits.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol


class Deadline:
    """A call of ``on_expiry`` ``seconds`` after :meth:`arm` unless :meth:`disarm` comes first;
    arming an armed deadline keeps its time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, on_expiry: Callable[[], None]):
        self.seconds = seconds
        self._loop = loop
        self._on_expiry = on_expiry
        self._handle: asyncio.TimerHandle | None = None

    def arm(self) -> None:
        if self._handle is None:
            self._handle = self._loop.call_later(self.seconds, self._expire)

    def disarm(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        self._on_expiry()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header limit and deadline of the module docstring."""

    def __init__(self, *args, max_header_bytes: int, header_timeout_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_header_bytes = max_header_bytes
        self.header_timeout_s = header_timeout_s
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_deadline = Deadline(self.loop, header_timeout_s, self._header_timeout)
        self._refused: int | None = None  # the status a request was refused with; the connection is closing
        self._refusal_pending = False  # decided inside the parser, answered once it has returned

    # --- the deadline ---

    def _header_timeout(self) -> None:
        if self._awaiting_headers and not self.transport.is_closing():
            self._refuse(408, f"the request line and headers did not arrive within {self.header_timeout_s:g} s")

    # --- refusing ---

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` (unless a response is under way on this connection) and close it."""
        self._refused = status
        self._header_deadline.disarm()
        if self.cycle is None or self.cycle.response_complete:
            body = message.encode("ascii")
            self.transport.write(
                b"".join(
                    [
                        STATUS_LINE[status],
                        b"content-type: text/plain; charset=utf-8\r\n",
                        b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
                        b"connection: close\r\n\r\n",
                        body,
                    ]
                )
            )
        self.transport.close()

    def _too_large(self) -> str:
        return f"the request line and headers are larger than {self.max_header_bytes} bytes"

    # --- the protocol ---

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._header_deadline.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._header_deadline.disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return
        super().data_received(data)
        if self._refusal_pending:
            self._refusal_pending = False
            self._refuse(431, self._too_large())
        elif self._refused is None and self._awaiting_headers and not self.transport.is_closing():
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes:
                self._refuse(431, self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._header_bytes = 0
        self._header_deadline.arm()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._header_deadline.disarm()
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            # Answered once the parser returns (data_received); the rest of this request is not read.
            self._refused, self._refusal_pending = 431, True
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refused is None:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused is None:
            super().on_message_complete()


def protocol_factory(max_header_bytes: int, header_timeout_s: float) -> Callable[..., LimitedHttpToolsProtocol]:
    """What uvicorn's ``http`` option takes: a picklable factory of :class:`LimitedHttpToolsProtocol`
    with these limits (``serve --workers N`` hands its options to each worker process)."""
    return functools.partial(
        LimitedHttpToolsProtocol, max_header_bytes=max_header_bytes, header_timeout_s=header_timeout_s
    )
