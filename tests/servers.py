"""Real HTTP servers for tests: an ASGI app under uvicorn on a free 127.0.0.1 port, in a thread."""

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn


@contextmanager
def serving(app, start_timeout_s: float = 20.0, **options):
    """Run ``app`` on a free 127.0.0.1 port until the block ends; yields the port. ``options`` are
    more of uvicorn's (a server's own, such as quasar.inference.server.server_options)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, log_level="warning", lifespan="on", **options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "server did not start"
        time.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
