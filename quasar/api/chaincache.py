"""A chain read at most once per block, for the API: it checks registration and permits on every
signed request, and a metagraph read from a subtensor node per request would be slow and load the node.

Caching rule: the current block is read again at most every ``block_poll_s`` seconds (default 1 s,
a twelfth of a Bittensor block), and the metagraph (registrations, permits) whenever that block is
newer than the snapshot's. So a hotkey deregistered (or a permit revoked) in block N is refused
from the first request after the API has seen block N: at most ``block_poll_s`` plus one metagraph
read after block N, never a block or more later.

One read of each kind runs at a time; the requests that waited for a read that failed (the node
down or hung: ChainError, after the SDK's retries) fail with it at once. Each asked the node again
in turn, which held the last of N waiting requests for N failing reads (minutes each on finney).
A request arriving after the failure asks the node again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from quasar.chain import Chain, ChainError, Metagraph
from quasar.chain.base import ApiLocation, SubnetHyperparameters, WeightsSubmission

DEFAULT_BLOCK_POLL_S = 1.0

T = TypeVar("T")


class _Reads:
    """One kind of read of the node, one at a time (under ``lock``), and how the last one ended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.finished = 0  # reads finished, failed or not
        self._failure: tuple[int, str] | None = None  # the last read's failure: its number, and why

    def read(self, arrived: int, read: Callable[[], T]) -> T:
        """``read()``, called holding ``lock``, by a caller that came when ``finished`` was
        ``arrived``: a read that failed while it waited for the lock is its answer too."""
        if self._failure is not None and self._failure[0] > arrived:
            raise ChainError(self._failure[1])
        try:
            value = read()
        except ChainError as error:
            self.finished += 1
            self._failure = (self.finished, str(error))
            raise
        self.finished += 1
        self._failure = None
        return value


class CachedMetagraphChain(Chain):
    """``inner`` with its current block cached for ``block_poll_s`` seconds and its metagraph for
    one block (see the module's docstring for why that never accepts a deregistered hotkey for a block)."""

    def __init__(
        self, inner: Chain, block_poll_s: float = DEFAULT_BLOCK_POLL_S, clock: Callable[[], float] = time.monotonic
    ):
        if not 0 < block_poll_s < inner.block_time_s:
            raise ValueError(f"block_poll_s must be positive and shorter than a block ({inner.block_time_s} s)")
        self.inner = inner
        self.netuid = inner.netuid
        self.block_time_s = inner.block_time_s
        self.block_poll_s = block_poll_s
        self.clock = clock
        self._block_reads = _Reads()
        self._metagraph_reads = _Reads()
        self._block: tuple[float, int] | None = None
        self._snapshot: tuple[int, Metagraph] | None = None

    def current_block(self) -> int:
        arrived = self._block_reads.finished
        with self._block_reads.lock:  # one read at a time; the others wait for it rather than all asking the node
            now = self.clock()
            if self._block is None or now - self._block[0] >= self.block_poll_s:
                self._block = (now, self._block_reads.read(arrived, self.inner.current_block))
            return self._block[1]

    def metagraph(self) -> Metagraph:
        block = self.current_block()
        arrived = self._metagraph_reads.finished
        with self._metagraph_reads.lock:
            if self._snapshot is None or self._snapshot[0] < block:
                self._snapshot = (block, self._metagraph_reads.read(arrived, self.inner.metagraph))
            return self._snapshot[1]

    def owner_uid(self) -> int | None:
        return self.inner.owner_uid()

    def hyperparameters(self) -> SubnetHyperparameters:
        return self.inner.hyperparameters()

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        self.inner.publish_endpoint(wallet, host, port)

    def set_weights(
        self, wallet, weights: Mapping[int, float], version_key: int, hotkeys: Mapping[int, str] | None = None
    ) -> WeightsSubmission:
        return self.inner.set_weights(wallet, weights, version_key, hotkeys)

    def api_location(self) -> ApiLocation | None:
        return self.inner.api_location()

    def publish_api_location(self, wallet, location: ApiLocation) -> None:
        self.inner.publish_api_location(wallet, location)
