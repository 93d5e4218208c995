"""Public read routes answered from a cache per chain block.

The leaderboard, the current round and the dashboard's pages are read far more often than they
change, and what they show moves with the chain: a response is computed at most once per request
target and chain block in each worker process, rendered once, and served as bytes until the chain
moves to the next block. Concurrent requests for a body that is being computed wait for that one
computation instead of starting their own. A target is the path and the query string the route
builds from its validated parameters (:func:`canonical_query`), never the query string as sent:
``?x=1`` or ``?round_id=05`` make no entry of their own, so a client cannot fill the cache with
targets of its own making and evict the pages in use. A route refuses a round that has not begun,
and marks a read of a past round ``pooled``: those share :data:`POOLED_ENTRIES` entries among
themselves, so asking for every past round (thousands on a chain that has run for months) evicts
only each other.

The JSON reads (``reads.response``: the leaderboard, the current round; validators and miners act
on them) are exact: from the next block on (12 s on Bittensor) a request gets that block's body,
waiting for it if need be. The dashboard's pages (``reads.page``: HTML for people) are rendered
again for a new block on one thread of their own, and meanwhile requests for a page get the page
of the block before at once: when the chain moves on, every page in use is rendered again, and on
many threads at once that burst would take the process's interpreter (the GIL) from the event
loop and from the database writers for a good part of a second. The page thread renders for at
most ``PAGE_RENDER_DUTY`` of the time (after a render it rests for the rest of that share), so
the burst is spread out and the requests and writes around it keep their pace; a new report
shows on a page as soon as the page is rendered (milliseconds into the block on an idle server;
under the load benchmark's 67 pages in use and 1,430 requests a second, up to about 10 s). A
render whose block ended before its turn came is skipped. A page asked for the first time has
nothing to send meanwhile: it renders in the thread pool, at most ``FIRST_RENDERS`` at once (each
of a new worker's pages is asked for in its first second: forty renders at once on forty threads
took the interpreter from the submissions and finished no sooner).

A route fills the cache in one line, ``return await reads.response(request, lambda: ..., params)``
(a model, sent as JSON) or ``reads.page(request, render, params)`` (any response, a dashboard page),
``params`` being its validated query parameters; the route validated the request, so a later
request sent with exactly that target at the same block is answered by
:meth:`BlockCache.middleware` before routing (a dictionary look-up and the current block). So
is a request for a page whose new block's render is already under way: the route would send the
page kept from the block before, and going through it costs several times the look-up, for every
request of every page in use until the page thread has rendered them all.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlencode

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import ASGIApp, Receive, Scope, Send

from quasar.api.rendered import Rendered, SharedRenders, Target

DEFAULT_MAX_ENTRIES = 1024
# Entries kept for pooled targets (reads of past rounds), out of the whole cache's: plenty for people
# browsing a few rounds back, and a flood of them evicts only each other.
POOLED_ENTRIES = 64
# Share of the time the page thread spends rendering. Under 330 signed submissions and 1,100 reads
# a second with two workers (benchmarks/RESULTS.md), the re-rendering of every page at a block
# change back to back slowed the submissions around it to 500-650 ms (p99 of those seconds); at a
# quarter of the time, to 100-300 ms; at a tenth, no second's p99 went past 120 ms.
PAGE_RENDER_DUTY = 0.1
# Pages rendered at once for the first time, per worker. PostgreSQL with two workers, six runs each
# alternating (benchmarks/RESULTS.md): 4 of 6 met the targets with 4, 2 of 6 with the pool's 40.
FIRST_RENDERS = 4
JSON_TYPE = "application/json"

Params = Mapping[str, object]


def _target(scope: Scope) -> Target:
    return (scope["path"], scope.get("query_string", b""))


def canonical_query(params: Params | None) -> bytes:
    """The query string of validated parameters, in the route's order, leaving out those not given."""
    return urlencode([(name, str(value)) for name, value in (params or {}).items() if value is not None]).encode()


class _Superseded(Exception):
    """A page's render for a block that ended before its turn came (the next block's is wanted)."""


@dataclass(frozen=True)
class _Kept:
    """A target's newest rendered response: the block it was computed at, and whether it is a page
    (sent while its next block's render is under way) or exact JSON."""

    block: int
    rendered: Rendered
    page: bool


@dataclass(eq=False)
class BlockCache:
    """Rendered bodies by request target and block; ``current_block`` must be cheap (it is asked on
    every cached read). Only 200 responses are kept (an error page is computed each time); at most
    ``max_entries`` targets are kept, the least recently computed dropped first. The page thread
    renders for at most ``page_render_duty`` of the time. With ``shared``, what a (target, block)
    renders to is computed once by all the server's workers (quasar.api.sharedpages). Pooled
    targets keep at most ``pooled_entries`` of the entries, the least recently computed of them
    dropped first."""

    current_block: Callable[[], int]
    max_entries: int = DEFAULT_MAX_ENTRIES
    page_render_duty: float = PAGE_RENDER_DUTY
    shared: SharedRenders | None = None
    pooled_entries: int = POOLED_ENTRIES

    def __post_init__(self) -> None:
        if not 0 < self.page_render_duty <= 1:
            raise ValueError(f"page_render_duty must be in (0, 1], got {self.page_render_duty}")
        self._rendered: dict[Target, _Kept] = {}
        self._pooled: dict[Target, None] = {}  # the pooled targets kept, least recently computed first
        self._computing: dict[tuple[Target, int], asyncio.Future[Rendered]] = {}
        self._page_renderer = ThreadPoolExecutor(1, thread_name_prefix="render-page")
        self._next_page_render = 0.0  # monotonic time before which the page thread rests
        self._first_renders: anyio.CapacityLimiter | None = None  # made in the event loop, on first use

    def close(self) -> None:
        """Let the page being rendered finish, and end the page-rendering thread."""
        self._page_renderer.shutdown(wait=True)

    async def response(
        self, request: Request, compute: Callable[[], BaseModel], params: Params | None = None, pooled: bool = False
    ) -> Response:
        """The JSON of ``compute()`` for ``request``'s path with the validated ``params`` at the
        current block: cached, or computed in the thread pool (it may read the database) and kept
        until the block changes. Exceptions of ``compute`` reach every request that waited for it,
        and nothing is cached. ``pooled``: kept among the pooled targets (a past round)."""

        def render() -> Rendered:
            return Rendered.of(Response(compute().model_dump_json().encode(), media_type=JSON_TYPE))

        return await self._serve(
            request,
            params,
            lambda _stale, target, block: run_in_threadpool(self._computed, target, block, render),
            stale_ok=False,
            pooled=pooled,
        )

    async def page(
        self, request: Request, render: Callable[[], Response], params: Params | None = None, pooled: bool = False
    ) -> Response:
        """``render()``'s response for ``request``'s path with the validated ``params``, kept while
        the block lasts if it is a 200. A target seen for the first time renders in the thread pool
        and its requests wait; a page kept from an earlier block is sent at once while its new
        block's page renders on the page thread. ``pooled``: kept among the pooled targets."""
        loop = asyncio.get_running_loop()

        def rendered() -> Rendered:
            return Rendered.of(render())

        def rendered_in_turn(target: Target, block: int) -> Rendered:
            """On the page thread: rest out the last render's share, then render (unless the chain
            has moved past ``block`` meanwhile)."""
            time.sleep(max(0.0, self._next_page_render - time.monotonic()))
            if self.current_block() != block:
                raise _Superseded
            began = time.monotonic()
            try:
                return self._computed(target, block, rendered)
            finally:
                ended = time.monotonic()
                self._next_page_render = ended + (ended - began) * (1 / self.page_render_duty - 1)

        def start(stale: bool, target: Target, block: int) -> Awaitable[Rendered]:
            if stale:
                return loop.run_in_executor(self._page_renderer, rendered_in_turn, target, block)
            if self._first_renders is None:
                self._first_renders = anyio.CapacityLimiter(FIRST_RENDERS)
            return anyio.to_thread.run_sync(self._computed, target, block, rendered, limiter=self._first_renders)

        return await self._serve(request, params, start, stale_ok=True, pooled=pooled)

    def _kept_answer(self, target: Target, block: int) -> Rendered | None:
        """What answers a request for ``target`` at ``block`` without starting any work: the response
        kept for ``block`` itself, or, for a page whose render for ``block`` is under way, the page
        kept from the block before. None when there is none."""
        cached = self._rendered.get(target)
        if cached is not None and (cached.block == block or (cached.page and (target, block) in self._computing)):
            return cached.rendered
        return None

    def _computed(self, target: Target, block: int, compute: Callable[[], Rendered]) -> Rendered:
        return compute() if self.shared is None else self.shared.render(target, block, compute)

    async def _serve(
        self,
        request: Request,
        params: Params | None,
        start: Callable[[bool, Target, int], Awaitable[Rendered]],
        stale_ok: bool,
        pooled: bool,
    ) -> Response:
        """The cached response, or ``start(stale, target, block)``'s (``stale``: an earlier block's
        response will be sent meanwhile)."""
        target = (request.scope["path"], canonical_query(params))
        block = self.current_block()
        answer = self._kept_answer(target, block)
        if answer is not None:
            return answer.response()
        cached = self._rendered.get(target)
        stale = stale_ok and cached is not None
        computing = self._computing.get((target, block))
        if computing is None:
            computing = asyncio.ensure_future(start(stale, target, block))
            self._computing[(target, block)] = computing
            computing.add_done_callback(lambda done: self._finished(target, block, done, stale_ok, pooled))
        if stale and cached is not None:  # stale implies cached
            return cached.rendered.response()
        # shield: a client that hangs up must not cancel the computation the others wait for.
        return (await asyncio.shield(computing)).response()

    def _finished(self, target: Target, block: int, done: asyncio.Future[Rendered], page: bool, pooled: bool) -> None:
        del self._computing[(target, block)]
        if done.cancelled() or done.exception() is not None or done.result().status != 200:
            return
        cached = self._rendered.get(target)
        if cached is None or cached.block <= block:
            self._rendered.pop(target, None)  # re-inserted last: the dict's order is least recently computed first
            self._rendered[target] = _Kept(block, done.result(), page)
            self._pooled.pop(target, None)  # a round that was current is pooled once it is past
            if pooled:
                self._pooled[target] = None
                while len(self._pooled) > self.pooled_entries:
                    self._drop(next(iter(self._pooled)))
            while len(self._rendered) > self.max_entries:
                self._drop(next(iter(self._rendered)))

    def _drop(self, target: Target) -> None:
        del self._rendered[target]
        self._pooled.pop(target, None)

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """ASGI middleware: a GET whose target has a response cached at the current block, or a page
        whose render for the current block is under way, is answered here as the route would answer
        it; everything else (and any failure to read the block) goes on to ``app``."""

        async def serve(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["method"] == "GET":
                target = _target(scope)
                if target in self._rendered:
                    try:
                        block = self.current_block()
                    except Exception:  # the route reports the chain's failure properly
                        block = None
                    rendered = None if block is None else self._kept_answer(target, block)
                    if rendered is not None:
                        await send(
                            {
                                "type": "http.response.start",
                                "status": rendered.status,
                                "headers": list(rendered.headers),
                            }
                        )
                        await send({"type": "http.response.body", "body": rendered.body})
                        return
            await app(scope, receive, send)

        return serve
