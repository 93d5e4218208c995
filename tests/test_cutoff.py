"""quasar/cutoff.py against real HTTP servers on 127.0.0.1: an exchange asks for an uncompressed
answer on a connection of its own, takes an answer of exactly its size limit, refuses a compressed
one, closes what it kept, and a connection made after the deadline is cut at once."""

from __future__ import annotations

import asyncio
import gc
import gzip
import time
import warnings

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from quasar.cutoff import AnswerRefused, Cutoff, exchange, quoted
from servers import serving

LIMIT = 1000


async def exact(request):
    return Response(b"x" * LIMIT)


async def gzipped(request):
    return Response(gzip.compress(b"{}"), headers={"Content-Encoding": "gzip"})


async def asked(request):
    return JSONResponse({name: request.headers.get(name) for name in ("accept-encoding", "connection")})


async def trickled(request):
    async def bytes_slowly():
        for _ in range(50):
            yield b" "
            await asyncio.sleep(0.2)

    return StreamingResponse(bytes_slowly())


APP = Starlette(
    routes=[Route("/exact", exact), Route("/gzip", gzipped), Route("/asked", asked), Route("/slow", trickled)]
)


@pytest.fixture(scope="module")
def base_url():
    with serving(APP) as port:
        yield f"http://127.0.0.1:{port}"


def test_an_answer_of_exactly_the_size_limit_is_taken(base_url):
    with httpx.Client() as http:
        assert exchange(http, "GET", f"{base_url}/exact", 5.0, LIMIT).content == b"x" * LIMIT
        with pytest.raises(AnswerRefused, match="answered with more than 999 bytes"):
            exchange(http, "GET", f"{base_url}/exact", 5.0, LIMIT - 1)


def test_an_uncompressed_answer_on_a_connection_of_its_own_is_asked_for_and_gzip_refused(base_url):
    with httpx.Client() as http:
        headers = exchange(http, "GET", f"{base_url}/asked", 5.0, LIMIT).json()
        assert headers == {"accept-encoding": "identity", "connection": "close"}
        with pytest.raises(AnswerRefused, match=r"answered compressed \(gzip\); it was asked for identity"):
            exchange(http, "GET", f"{base_url}/gzip", 5.0, LIMIT)


def test_an_exchange_closes_every_socket_it_kept(base_url):
    # One left to the garbage collector is an open file until it runs, and a ResourceWarning.
    with httpx.Client() as http, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            exchange(http, "GET", f"{base_url}/exact", 5.0, LIMIT)
        gc.collect()
    assert [str(warning.message) for warning in caught if warning.category is ResourceWarning] == []


def test_a_connection_made_after_the_deadline_is_cut_at_once(base_url):
    started = time.monotonic()
    with Cutoff(0.05) as cutoff, httpx.Client() as http:
        time.sleep(0.2)  # the deadline passes before the connection is made
        with pytest.raises(httpx.HTTPError):
            with http.stream("GET", f"{base_url}/slow", extensions={"trace": cutoff.trace}) as response:
                response.read()
    assert cutoff.expired and time.monotonic() - started < 3.0


def test_a_quote_is_one_line_of_at_most_its_limit():
    assert quoted("a" * 20, limit=20) == "a" * 20
    assert quoted("a" * 21, limit=20) == "a" * 17 + "..."
    assert quoted("a" + " " * 50 + "\nb", limit=20) == "a b"
