"""Cached reads shared by a server's workers (quasar/api/sharedpages.py): computed once per target and
block across processes, read back exactly as computed, a slot's other target or older block a
miss, errors never shared; and two per-block caches (two workers) on one store render each page once.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import time
from pathlib import Path

from fastapi import Request
from fastapi.responses import Response

from quasar.api.readcache import BlockCache
from quasar.api.rendered import Rendered
from quasar.api.sharedpages import SharedPages


def rendered(body: bytes, status: int = 200) -> Rendered:
    return Rendered(
        status,
        (
            (b"content-type", b"text/html; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"x-note", "é".encode("latin-1")),
        ),
        body,
    )


def test_a_response_is_read_back_as_computed_and_only_for_its_target_and_block(tmp_path):
    store = SharedPages(tmp_path, slots=1)  # one slot: every target shares it
    rng = random.Random(7)
    computed: list[tuple] = []

    def compute(target, block) -> Rendered:
        computed.append((target, block))
        noise = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 3000)))  # newlines and all
        return rendered(noise + b"\n\n" + repr(target).encode())

    first = store.render(("/a", b"x=1"), 5, lambda: compute("a", 5))
    assert store.render(("/a", b"x=1"), 5, lambda: compute("a", 5)) == first  # read back, not computed
    assert computed == [("a", 5)]
    other = store.render(("/a", b"x=2"), 5, lambda: compute("a2", 5))  # another target in the slot: a miss
    later = store.render(("/a", b"x=2"), 6, lambda: compute("a2", 6))  # an older block: a miss
    assert computed == [("a", 5), ("a2", 5), ("a2", 6)] and other != later
    assert store.render(("/a", b"x=2"), 6, lambda: compute("a2", 6)) == later


def test_an_error_response_is_never_shared(tmp_path):
    store = SharedPages(tmp_path)
    calls = []

    def compute() -> Rendered:
        calls.append(1)
        return rendered(b"gone", status=404)

    for _ in range(2):
        assert store.render(("/dashboard/submissions/9", b""), 3, compute).status == 404
    assert len(calls) == 2


def _render_in_process(directory: str, counter: str, results: str) -> None:
    """In another process: render one target through the store with a slow compute."""
    store = SharedPages(Path(directory))

    def compute() -> Rendered:
        with open(counter, "a") as file:
            file.write("x")
        time.sleep(0.3)
        return rendered(b"the page at block 11")

    page = store.render(("/", b""), 11, compute)
    with open(results, "ab") as file:
        file.write(page.body + b"\n")


def test_processes_that_want_the_same_page_at_once_compute_it_once(tmp_path):
    counter, results = tmp_path / "computes", tmp_path / "results"
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_render_in_process, args=(str(tmp_path), str(counter), str(results))) for _ in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert counter.read_text() == "x"  # one compute; the others waited on the slot's lock and read it
    assert results.read_bytes().splitlines() == [b"the page at block 11"] * 3


def test_two_workers_caches_on_one_store_render_each_page_once_per_block(tmp_path):
    block = [1]
    renders: list[tuple[str, int]] = []
    store = SharedPages(tmp_path)
    workers = [BlockCache(lambda: block[0], shared=store, page_render_duty=1.0) for _ in range(2)]
    local = BlockCache(lambda: block[0], page_render_duty=1.0)  # the reference: nothing shared

    def render(path: str):
        def page() -> Response:
            renders.append((path, block[0]))
            time.sleep(0.02)
            return Response(f"{path} at block {block[0]}".encode(), headers={"Cache-Control": "no-store"})

        return page

    def request(path: str) -> Request:
        return Request({"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []})

    paths = [f"/dashboard/miners/{n}" for n in range(5)]

    async def everyone_reads() -> list[list[bytes]]:
        answers = await asyncio.gather(*(cache.page(request(p), render(p)) for cache in workers for p in paths))
        return [answer.body for answer in answers]

    async def scenario() -> None:
        first = await everyone_reads()
        assert first == [f"{p} at block 1".encode() for p in paths] * 2
        assert sorted(renders) == sorted((p, 1) for p in paths)  # once each, not once per worker
        reference = await asyncio.gather(*(local.page(request(p), render(p)) for p in paths))
        assert [r.body for r in reference] == first[: len(paths)]
        assert [r.headers.raw for r in reference] == [
            w.headers.raw for w in await asyncio.gather(*(workers[1].page(request(p), render(p)) for p in paths))
        ]
        renders.clear()
        block[0] = 2
        await everyone_reads()  # the block before's pages, while the new ones render on the page threads
        while any(cache._computing for cache in workers):
            await asyncio.sleep(0.01)
        assert await everyone_reads() == [f"{p} at block 2".encode() for p in paths] * 2
        assert sorted(renders) == sorted((p, 2) for p in paths)

    asyncio.run(scenario())
    for cache in (*workers, local):
        cache.close()
