"""A chain whose metagraph is read at most once per ``max_age_s``: the API checks registration and
permits on every signed request, and a full metagraph read from a subtensor node per request would
be slow and load the node. Blocks are always read live (commit-reveal and rounds count them)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from quasar.chain import Chain, Metagraph


class CachedMetagraphChain(Chain):
    """``inner`` with its metagraph snapshot reused for ``max_age_s`` seconds (registration and
    permit changes show up that much later)."""

    def __init__(self, inner: Chain, max_age_s: float, clock: Callable[[], float] = time.monotonic):
        self.inner = inner
        self.netuid = inner.netuid
        self.block_time_s = inner.block_time_s
        self.max_age_s = max_age_s
        self.clock = clock
        self._lock = threading.Lock()
        self._snapshot: tuple[float, Metagraph] | None = None

    def metagraph(self) -> Metagraph:
        with self._lock:  # one refresh at a time; the others wait for it rather than all reading the chain
            now = self.clock()
            if self._snapshot is None or now - self._snapshot[0] >= self.max_age_s:
                self._snapshot = (now, self.inner.metagraph())
            return self._snapshot[1]

    def current_block(self) -> int:
        return self.inner.current_block()

    def owner_uid(self) -> int:
        return self.inner.owner_uid()

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        self.inner.publish_endpoint(wallet, host, port)

    def set_weights(self, wallet, weights: Mapping[int, float], version_key: int) -> None:
        self.inner.set_weights(wallet, weights, version_key)
