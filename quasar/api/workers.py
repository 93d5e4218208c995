"""``serve --workers N``: N API processes on one port, each with a listening socket of its own.

uvicorn's own workers share one listening socket, and whichever process wakes first accepts every
connection waiting, so keep-alive clients that connect together land on one worker (measured: one
of two workers did 95% of the work). Here every worker binds the port with
``SO_REUSEPORT`` and the kernel spreads new connections evenly across the workers' sockets.

The supervisor (the ``serve`` process) starts the workers, starts a new one when one dies, and
stops them all on SIGTERM or SIGINT; a worker also exits when the supervisor dies, so no worker
outlives a killed server. The workers share nothing but the database and the chain.
"""

from __future__ import annotations

import asyncio
import ctypes
import importlib
import logging
import multiprocessing
import signal
import socket
import sys
import threading
from typing import Any, TypedDict

import uvicorn

logger = logging.getLogger(__name__)

# prctl(2): deliver this signal to the calling process when its parent dies.
_PR_SET_PDEATHSIG = 1
# A worker that dies this soon after it started is not started again (it would only die again).
RESTART_AFTER_S = 5.0


class ServerOptions(TypedDict):
    """The uvicorn options the API's server is run with (``uvicorn.run``/``uvicorn.Config``)."""

    host: str
    port: int
    proxy_headers: bool
    server_header: bool
    log_config: dict[str, Any] | None
    access_log: bool
    limit_concurrency: int
    timeout_graceful_shutdown: int
    http: type[asyncio.Protocol]


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with SO_REUSEPORT (uvicorn listens on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock


def refuse_taken_port(host: str, port: int) -> None:
    """Raise OSError when ``host:port`` cannot be bound, as when another process listens there.

    Bound here without SO_REUSEPORT, so that a listener of any kind conflicts: the workers' own
    sockets would join those of another server with SO_REUSEPORT on the port (another API of the
    same user, started twice), and the kernel would share the connections, and so the
    submissions, between the two servers and their databases."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart's TIME_WAIT is no listener
        probe.bind((host, port))


def _exit_with_parent() -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _worker(make_app: str, make_app_args: tuple, number: int, options: ServerOptions) -> None:
    _exit_with_parent()
    module, _, function = make_app.partition(":")
    app = getattr(importlib.import_module(module), function)(*make_app_args, number)
    sock = listening_socket(options["host"], options["port"])
    uvicorn.Server(uvicorn.Config(app, **options)).run(sockets=[sock])


def run_workers(count: int, make_app: str, make_app_args: tuple, options: ServerOptions) -> None:
    """Run ``count`` worker processes, each serving ``make_app(*make_app_args, number)``
    (``"module:function"``: the workers are spawned, not forked, and import it; ``number``: the
    worker's, from 0, which one started in place of a worker that died takes over) with uvicorn
    ``options`` (host and port included), until SIGTERM or SIGINT."""
    context = multiprocessing.get_context("spawn")
    stopping = threading.Event()
    workers: list[multiprocessing.process.BaseProcess] = []

    def start(number: int) -> multiprocessing.process.BaseProcess:
        process = context.Process(target=_worker, args=(make_app, make_app_args, number, options), daemon=False)
        process.start()
        return process

    def stop(signum: int, _frame: Any) -> None:
        logger.info("stopping %d workers (%s)", len(workers), signal.Signals(signum).name)
        stopping.set()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        workers.extend(start(number) for number in range(count))
        logger.info(
            "started %d workers on %s:%d: %s",
            count,
            options["host"],
            options["port"],
            ", ".join(str(w.pid) for w in workers),
        )
        started = {w.pid: 0.0 for w in workers}
        clock = 0.0
        while not stopping.wait(0.5):
            clock += 0.5
            for index, worker in enumerate(workers):
                if worker.is_alive():
                    continue
                if clock - started.get(worker.pid, 0.0) < RESTART_AFTER_S:
                    logger.error("worker %d exited (%s) right after it started; stopping", worker.pid, worker.exitcode)
                    stopping.set()
                    break
                logger.warning("worker %d exited (%s); starting another", worker.pid, worker.exitcode)
                workers[index] = start(index)
                started[workers[index].pid] = clock
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()  # SIGTERM: uvicorn finishes the requests in flight
        for worker in workers:
            worker.join(timeout=15)
            if worker.is_alive():
                worker.kill()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
