"""The per-block read cache (quasar/api/readcache.py) and its middleware against the route computed
afresh on every request, on random sequences of requests (query strings as clients send them,
canonical or not, valid or not), block changes and evictions: a JSON read answers exactly what the
route computes at the current block, a page the route's page of the current block or of an
earlier one, and the current block's once its render is done."""

from __future__ import annotations

import asyncio
import random
from urllib.parse import parse_qsl

from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.types import Message

from quasar.api.readcache import BlockCache

ROUND_BLOCKS = 5
QUERIES = [
    b"",
    b"round=1",
    b"round=01",
    b"round=0",
    b"x=1&round=1",
    b"round=1&x=2",
    b"round=2",
    b"round=abc",
    b"round=99",
]


class Board(BaseModel):
    round: int
    block: int


def fresh_answer(path: str, query: bytes, block: int) -> tuple[int, bytes]:
    """The reference: what the route answers at ``block``, computed from the request alone."""
    params = dict(parse_qsl(query.decode()))
    current = block // ROUND_BLOCKS
    raw = params.get("round")
    if raw is not None and not raw.isdigit():
        return 422, b"round must be an integer"
    round_id = current if raw is None else int(raw)
    if round_id > current:
        return 404, b"that round has not begun"
    if path == "/page":
        return 200, f"page of round {round_id} at block {block}".encode()
    return 200, Board(round=round_id, block=block).model_dump_json().encode()


def test_the_cache_answers_what_the_route_computes_afresh_on_random_requests():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    block = [rng.randrange(5, 20)]
    cache = BlockCache(lambda: block[0], max_entries=3, page_render_duty=1.0, pooled_entries=1)

    async def route(scope, receive, send) -> None:
        request = Request(scope)
        params = dict(parse_qsl(scope["query_string"].decode()))
        status, body = fresh_answer(scope["path"], scope["query_string"], block[0])
        if status != 200:  # refused before the cache, as the API's routes validate first
            response = Response(body, status_code=status)
        else:
            round_id = None if "round" not in params else int(params["round"])
            pooled = round_id is not None and round_id < block[0] // ROUND_BLOCKS
            at = block[0]
            if scope["path"] == "/page":
                response = await cache.page(
                    request,
                    lambda: Response(fresh_answer("/page", scope["query_string"], at)[1]),
                    {"round": round_id},
                    pooled,
                )
            else:
                response = await cache.response(
                    request,
                    lambda: Board.model_validate_json(fresh_answer("/json", scope["query_string"], at)[1]),
                    {"round": round_id},
                    pooled,
                )
        await response(scope, receive, send)

    app = cache.middleware(route)

    async def get(path: str, query: bytes) -> tuple[int, bytes]:
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "GET", "path": path, "query_string": query, "headers": []}
        await app(scope, receive, send)
        return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])

    async def drained() -> None:
        while cache._computing:
            await asyncio.sleep(0.001)

    async def scenario() -> None:
        for step in range(400):
            if rng.random() < 0.15:
                block[0] += rng.choice([1, 1, 2, ROUND_BLOCKS])
            path, query = rng.choice(["/json", "/page"]), rng.choice(QUERIES)
            status, body = await get(path, query)
            expected = fresh_answer(path, query, block[0])
            if path == "/json" or status != 200:
                assert (status, body) == expected, (seed, step, path, query, block[0])
                continue
            assert status == expected[0], (seed, step, query)
            # A page may be the route's page of an earlier block while this block's renders (of the
            # round current then, for a page of the current round).
            earlier = int(body.decode().rpartition(" at block ")[2])
            assert earlier <= block[0] and body == fresh_answer(path, query, earlier)[1], (seed, step, query, body)
            await drained()
            assert await get(path, query) == expected, (seed, step, query, block[0])

    asyncio.run(scenario())
    cache.close()
