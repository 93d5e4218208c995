"""Public read routes answered from a cache per chain block.

The leaderboard, the current round (and the dashboard's pages) are read far more often than they
change, and most of what they show moves with the chain: a body is computed at most once per key
and chain block in each worker process, rendered to JSON once, and served as bytes until the chain
moves to the next block. So a report or submission shows up on a cached page from the next block
on (12 s on Bittensor), never later. Concurrent requests for a body that is being computed wait
for that one computation instead of starting their own.

A route uses it in one line: ``return await reads.response(("leaderboard", round_id), lambda: ...)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable

from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel

DEFAULT_MAX_ENTRIES = 1024


class BlockCache:
    """Rendered JSON bodies by (key, block); ``current_block`` must be cheap (it is asked on every read)."""

    def __init__(self, current_block: Callable[[], int], max_entries: int = DEFAULT_MAX_ENTRIES):
        self.current_block = current_block
        self.max_entries = max_entries
        self._bodies: dict[Hashable, tuple[int, bytes]] = {}
        self._computing: dict[tuple[Hashable, int], asyncio.Future[bytes]] = {}

    async def response(self, key: Hashable, compute: Callable[[], BaseModel]) -> Response:
        """The body for ``key`` at the current block: cached, or ``compute()`` run in the thread pool
        (it may read the database) and kept until the block changes. Exceptions of ``compute``
        reach every request that waited for it, and nothing is cached."""
        block = self.current_block()
        cached = self._bodies.get(key)
        if cached is not None and cached[0] == block:
            return Response(cached[1], media_type="application/json")
        computing = self._computing.get((key, block))
        if computing is None:
            computing = asyncio.ensure_future(run_in_threadpool(lambda: compute().model_dump_json().encode()))
            self._computing[(key, block)] = computing
            computing.add_done_callback(lambda done: self._finished(key, block, done))
        # shield: a client that hangs up must not cancel the computation the others wait for.
        return Response(await asyncio.shield(computing), media_type="application/json")

    def _finished(self, key: Hashable, block: int, done: asyncio.Future[bytes]) -> None:
        del self._computing[(key, block)]
        if done.cancelled() or done.exception() is not None:
            return
        cached = self._bodies.get(key)
        if cached is None or cached[0] <= block:
            self._bodies.pop(key, None)  # re-inserted last: the dict's order is least recently computed first
            self._bodies[key] = (block, done.result())
            while len(self._bodies) > self.max_entries:
                del self._bodies[next(iter(self._bodies))]
