"""The per-block read cache (quasar/api/readcache.py) on its own: JSON bodies exact per block, pages
rendered one at a time, a page of the block before sent while the new block's renders, the page
thread resting between renders, and a render skipped when its block ended before its turn."""

from __future__ import annotations

import asyncio
import threading
import time

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel

from quasar.api.readcache import FIRST_RENDERS, BlockCache


class Body(BaseModel):
    block: int


def request(path: str) -> Request:
    return Request({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []})


def test_pages_render_again_one_at_a_time_and_the_previous_block_is_served_meanwhile():
    block = [1]
    cache = BlockCache(lambda: block[0], page_render_duty=1.0)  # no rest between renders: see below
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
        assert 1 < most[0] <= FIRST_RENDERS  # first seen: nothing to send meanwhile, so rendered in parallel
        most[0] = 0
        block[0] = 2
        started = time.monotonic()
        stale = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        # Answered without waiting for any render: one would take its 0.2 s, the bound a loaded machine gets.
        assert time.monotonic() - started < 0.2
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


def test_the_page_thread_rests_between_renders_and_skips_a_block_that_has_ended():
    block = [1]
    cache = BlockCache(lambda: block[0], page_render_duty=0.25)
    renders: list[tuple[str, int, float, float]] = []  # (path, block, start, end)

    def render(path: str):
        def page() -> Response:
            began = time.monotonic()
            time.sleep(0.05)
            renders.append((path, block[0], began, time.monotonic()))
            return Response(f"{path} at {block[0]}".encode())

        return page

    paths = [f"/dashboard/submissions/{n}" for n in range(6)]

    async def scenario() -> None:
        await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))  # first renders: the pool
        block[0] = 2
        await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))  # six queued on the page thread
        while len(renders) < len(paths) + 2:
            await asyncio.sleep(0.01)
        block[0] = 3  # the other four renders for block 2 are now pointless
        await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        while len(renders) < 3 * len(paths) - 4 or cache._computing:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # nothing else renders
        fresh = await asyncio.gather(*(cache.page(request(p), render(p)) for p in paths))
        assert [r.body.decode() for r in fresh] == [f"{p} at 3" for p in paths]

    asyncio.run(scenario())
    cache.close()
    on_thread = renders[len(paths) :]
    # Two renders for block 2, then the ones for block 3: the four left for block 2 were skipped.
    assert [b for _, b, _, _ in on_thread] == [2, 2] + [3] * len(paths)
    # Each render began at least three times its length after the one before ended (a quarter of the time).
    for (_, _, _, ended), (_, _, began, _), (_, _, b0, e0) in zip(on_thread, on_thread[1:], on_thread):
        assert began - ended >= 3 * (e0 - b0) * 0.95


def test_the_middleware_answers_what_the_route_would_without_routing():
    """Cached at this block: answered before routing. A page whose render for this block is under
    way: its earlier block's page, as the route would send, also before routing. Exact JSON of an
    earlier block never: the route computes it."""
    block = [1]
    cache = BlockCache(lambda: block[0], page_render_duty=1.0)
    routed: list[str] = []
    release = threading.Event()

    def page() -> Response:
        if block[0] > 1:
            release.wait(5)
        return Response(f"page at {block[0]}".encode())

    def body() -> Body:
        if block[0] > 1:
            release.wait(5)
        return Body(block=block[0])

    async def route(scope, receive, send) -> None:
        routed.append(scope["path"])
        if scope["path"] == "/page":
            response = await cache.page(Request(scope), page)
        else:
            response = await cache.response(Request(scope), body)
        await response(scope, receive, send)

    app = cache.middleware(route)

    async def get(path: str) -> bytes:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        await app({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}, None, send)
        assert sent[0]["status"] == 200
        return b"".join(m.get("body", b"") for m in sent[1:])

    async def scenario() -> None:
        assert (await get("/page"), await get("/json")) == (b"page at 1", b'{"block":1}')
        assert (await get("/page"), await get("/json")) == (b"page at 1", b'{"block":1}')
        assert routed == ["/page", "/json"]  # the second of each was answered from the cache
        block[0] = 2
        assert await get("/page") == b"page at 1"  # the route starts the render and sends the kept page
        assert [await get("/page") for _ in range(3)] == [b"page at 1"] * 3
        assert routed == ["/page", "/json", "/page"]  # the render is under way: answered before routing
        computing = asyncio.ensure_future(get("/json"))
        while len(cache._computing) < 2:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(get("/json"))  # exact: it waits in the route for block 2's
        await asyncio.sleep(0.05)
        release.set()
        assert await asyncio.gather(computing, waiting) == [b'{"block":2}'] * 2
        while cache._computing:
            await asyncio.sleep(0.01)
        assert await get("/page") == b"page at 2"
        assert routed == ["/page", "/json", "/page", "/json", "/json"]

    asyncio.run(scenario())
    cache.close()
