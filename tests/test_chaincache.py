"""The API's and the inference server's chain cache (quasar/api/chaincache.py) over a dev chain whose
node fails, as a subtensor node that is down or hung does: slowly, after the SDK's retries."""

from __future__ import annotations

import threading
import time

import pytest

from quasar.api.chaincache import CachedMetagraphChain
from quasar.chain import ChainError
from quasar.chain.devchain import DevChain

# How long a failing read takes (on finney: 14 s and more, the SDK's retries); long enough that all
# the test's requests arrive while the first is under way, on two busy cores too.
READ_S = 1.0


class FailingNode(DevChain):
    """A dev chain whose node fails its block or metagraph reads, slowly, while ``down`` says so."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.down: set[str] = set()
        self.asked = {"current_block": 0, "metagraph": 0}

    def _read(self, what: str) -> None:
        self.asked[what] += 1
        if what in self.down:
            time.sleep(READ_S)
            raise ChainError(f"{what}: the node does not answer")

    def current_block(self) -> int:
        self._read("current_block")
        return super().current_block()

    def metagraph(self):
        self._read("metagraph")
        return super().metagraph()


def concurrently(call, requests: int) -> list[float]:
    """``requests`` threads calling ``call`` at once; how long each waited for its ChainError."""
    waited: list[float] = []
    together = threading.Barrier(requests)

    def request() -> None:
        together.wait()
        start = time.monotonic()
        with pytest.raises(ChainError, match="does not answer"):
            call()
        waited.append(time.monotonic() - start)

    threads = [threading.Thread(target=request) for _ in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(waited) == requests
    return waited


@pytest.mark.parametrize("read", ["current_block", "metagraph"])
def test_requests_during_a_chain_outage_do_not_queue_one_failing_read_each(tmp_path, read):
    # Each request waiting on the cache's lock asked the node again once the read before it failed:
    # the node was asked once a request and the last of N waited N failing reads (minutes on
    # finney), the API's and the inference server's threads held all that time.
    node = FailingNode(tmp_path / "chain.sqlite3", block_time_s=12.0)
    cached = CachedMetagraphChain(node, block_poll_s=0.001)  # every call finds the block stale
    if read == "metagraph":
        cached.current_block()
    node.down.add(read)
    asked = node.asked[read]
    waited = concurrently(getattr(cached, read), 8)
    assert node.asked[read] == asked + 1
    assert max(waited) < 2 * READ_S + 0.5
    # A request after the failure asks the node again: it answers now.
    node.down.clear()
    time.sleep(0.01)
    metagraph = cached.metagraph()
    assert node.asked[read] == asked + 2
    assert metagraph.block == node.current_block()
