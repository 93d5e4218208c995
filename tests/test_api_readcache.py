"""The per-block read cache (quasar/api/readcache.py) on its own: JSON bodies exact per block, pages
rendered one at a time, and a page of the block before sent while the new block's renders."""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from quasar.api.readcache import BlockCache


class Body(BaseModel):
    block: int


def request(path: str) -> Request:
    return Request({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []})


def test_pages_render_again_one_at_a_time_and_the_previous_block_is_served_meanwhile():
    block = [1]
    cache = BlockCache(lambda: block[0])
    running, most, renders = [0], [0], []
    lock = threading.Lock()

    def render(path: str):
        def page() -> Response:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            time.sleep(0.2)
            with lock:
                running[0] -= 1
            renders.append(path)
            return Response(f"{path} at {block[0]}".encode())
        return page

    paths = [f"/dashboard/miners/{n}" for n in range(8)]

    async def scenario() -> None:
        first = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        assert [r.body.decode() for r in first] == [f"{p} at 1" for p in paths]
        assert most[0] > 1  # first seen: nothing to send meanwhile, so rendered in parallel
        most[0] = 0
        block[0] = 2
        started = time.monotonic()
        stale = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        assert time.monotonic() - started < 0.1  # answered without waiting for any render (0.2 s each)
        assert [r.body.decode() for r in stale] == [f"{p} at 1" for p in paths]
        again = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))  # still rendering
        assert all(r.body.decode().endswith(("at 1", "at 2")) for r in again)
        while len(renders) < 2 * len(paths):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.01)  # the done callbacks run
        fresh = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        assert [r.body.decode() for r in fresh] == [f"{p} at 2" for p in paths]

    asyncio.run(scenario())
    cache.close()
    assert most[0] == 1  # rendered again for the new block: never two pages at once
    assert len(renders) == 2 * len(paths)  # once per target and block, however many asked


def test_json_reads_wait_for_the_current_block():
    block = [5]
    cache = BlockCache(lambda: block[0])

    async def scenario() -> list[int]:
        seen = [await cache.response(request("/get_current_round"), lambda: Body(block=block[0]))]
        block[0] = 6
        seen.append(await cache.response(request("/get_current_round"), lambda: Body(block=block[0])))
        return [Body.model_validate_json(r.body).block for r in seen]

    assert asyncio.run(scenario()) == [5, 6]
    cache.close()
