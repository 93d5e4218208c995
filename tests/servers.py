"""Real HTTP servers for tests on free 127.0.0.1 ports, each in a thread: an ASGI app under uvicorn
(:func:`serving`); the base of the stand-ins written with http.server (:class:`ThreadedServers`,
:class:`QuietHandler`); and, for servers that answer on the raw socket, :func:`accept_connections` and
:func:`read_head`."""

import socket
import threading
from collections.abc import Callable
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from quasar.api.devdb import ThreadedServer


@contextmanager
def serving(app, start_timeout_s: float = 20.0, **options):
    """Run ``app`` on a free 127.0.0.1 port until the block ends; yields the port. ``options`` are
    more of uvicorn's (a server's own, such as quasar.inference.server.server_options)."""
    with ThreadedServer(app, start_timeout_s, lifespan="on", **options) as server:
        yield server.port


class QuietHandler(BaseHTTPRequestHandler):
    """A handler speaking HTTP/1.1 (connections kept open, as the clients under test keep them)
    that logs nothing: the tests read what their stand-in records instead."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass


class ThreadedServers:
    """``count`` http.server servers on free 127.0.0.1 ports, each in a daemon thread, all answering
    through ``handler``, until :meth:`close`; a context manager. A stand-in sets what its handler
    reads before calling this ``__init__``: the servers answer at once."""

    def __init__(self, handler: type[BaseHTTPRequestHandler], count: int = 1):
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(count)]
        self._threads = []
        for server in self._servers:
            server.daemon_threads = True
            self._threads.append(threading.Thread(target=server.serve_forever, daemon=True))
            self._threads[-1].start()

    def server_url(self, index: int = 0) -> str:
        """``http://127.0.0.1:PORT`` of the ``index``-th server."""
        return f"http://127.0.0.1:{self._servers[index].server_address[1]}"

    def close(self) -> None:
        """Stop serving."""
        for server, thread in zip(self._servers, self._threads):
            server.shutdown()
            server.server_close()
            thread.join(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def accept_connections(listener: socket.socket, handle: Callable[[socket.socket], None]) -> None:
    """From now until ``listener`` is closed, hand each connection it accepts to ``handle``, in a
    daemon thread of its own (the accepting is one too)."""

    def accept() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=handle, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


def read_head(connection: socket.socket) -> bytes:
    """A request's head and what came after it in the same reads (b"" when the connection closed first)."""
    head = b""
    while b"\r\n\r\n" not in head:
        data = connection.recv(65536)
        if not data:
            return b""
        head += data
    return head
