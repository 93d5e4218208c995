"""The throwaway servers the tests and benchmarks start (quasar/api/devdb.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from quasar.api.devdb import ThreadedServer


async def slow_to_start(scope, receive, send):
    """An ASGI app whose start-up (lifespan) takes 1.5 s."""
    if scope["type"] == "lifespan":
        await receive()
        await asyncio.sleep(1.5)
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await send({"type": "lifespan.shutdown.complete"})


def test_a_server_that_misses_its_start_timeout_is_stopped_before_its_socket_closes(monkeypatch):
    """Closing the socket under a server still starting had uvicorn's thread die on 'Bad file
    descriptor' after the timeout's error was raised."""
    died: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: died.append(args.exc_value))
    server = ThreadedServer(slow_to_start, start_timeout_s=0.3, lifespan="on")
    with pytest.raises(RuntimeError, match="did not start"), server:
        pass
    server.thread.join(10)
    assert not server.thread.is_alive() and died == [], died
    assert server.socket.fileno() == -1
