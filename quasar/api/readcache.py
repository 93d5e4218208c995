"""Public read routes answered from a cache per chain block.

The leaderboard, the current round (and the dashboard's pages) are read far more often than they
change, and what they show moves with the chain: a body is computed at most once per request
target (path and query string) and chain block in each worker process, rendered to JSON once, and
served as bytes until the chain moves to the next block. So a report or submission shows up on a
cached page from the next block on (12 s on Bittensor), never later. Concurrent requests for a body
that is being computed wait for that one computation instead of starting their own.

A route fills the cache in one line, ``return await reads.response(request, lambda: ...)``; the
route validated the request, so a later request for the same target at the same block is answered
by :meth:`BlockCache.middleware` before routing (a dictionary look-up and the current block).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

DEFAULT_MAX_ENTRIES = 1024
JSON_TYPE = "application/json"

Target = tuple[str, bytes]  # (path, query string) as received


class BlockCache:
    """Rendered JSON bodies by request target and block; ``current_block`` must be cheap (it is asked
    on every cached read). At most ``max_entries`` targets are kept, the least recently computed
    dropped first."""

    def __init__(self, current_block: Callable[[], int], max_entries: int = DEFAULT_MAX_ENTRIES):
        self.current_block = current_block
        self.max_entries = max_entries
        self._bodies: dict[Target, tuple[int, bytes]] = {}
        self._computing: dict[tuple[Target, int], asyncio.Future[bytes]] = {}

    async def response(self, request: Request, compute: Callable[[], BaseModel]) -> Response:
        """The body for ``request``'s target at the current block: cached, or ``compute()`` run in the
        thread pool (it may read the database) and kept until the block changes. Exceptions of
        ``compute`` reach every request that waited for it, and nothing is cached."""
        target = (request.scope["path"], request.scope.get("query_string", b""))
        block = self.current_block()
        cached = self._bodies.get(target)
        if cached is not None and cached[0] == block:
            return Response(cached[1], media_type=JSON_TYPE)
        computing = self._computing.get((target, block))
        if computing is None:
            computing = asyncio.ensure_future(run_in_threadpool(lambda: compute().model_dump_json().encode()))
            self._computing[(target, block)] = computing
            computing.add_done_callback(lambda done: self._finished(target, block, done))
        # shield: a client that hangs up must not cancel the computation the others wait for.
        return Response(await asyncio.shield(computing), media_type=JSON_TYPE)

    def _finished(self, target: Target, block: int, done: asyncio.Future[bytes]) -> None:
        del self._computing[(target, block)]
        if done.cancelled() or done.exception() is not None:
            return
        cached = self._bodies.get(target)
        if cached is None or cached[0] <= block:
            self._bodies.pop(target, None)  # re-inserted last: the dict's order is least recently computed first
            self._bodies[target] = (block, done.result())
            while len(self._bodies) > self.max_entries:
                del self._bodies[next(iter(self._bodies))]

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """ASGI middleware: a GET whose target has a body cached at the current block is answered
        here; everything else (and any failure to read the block) goes on to ``app``."""

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "GET":
                cached = self._bodies.get((scope["path"], scope.get("query_string", b"")))
                if cached is not None:
                    try:
                        fresh = cached[0] == self.current_block()
                    except Exception:  # the route reports the chain's failure properly
                        fresh = False
                    if fresh:
                        await send({"type": "http.response.start", "status": 200,
                                    "headers": [(b"content-type", JSON_TYPE.encode()),
                                                (b"content-length", str(len(cached[1])).encode())]})
                        await send({"type": "http.response.body", "body": cached[1]})
                        return
            await app(scope, receive, send)

        return serve
