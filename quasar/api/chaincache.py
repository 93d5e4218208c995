"""A chain read at most once per block, for the API: it checks registration and permits on every
signed request, and a metagraph read from a subtensor node per request would be slow and load the node.

Caching rule: the current block is read again at most every ``block_poll_s`` seconds (default 1 s,
a twelfth of a Bittensor block), and the metagraph (registrations, permits) whenever that block is
newer than the snapshot's. So a hotkey deregistered (or a permit revoked) in block N is refused
from the first request after the API has seen block N: at most ``block_poll_s`` plus one metagraph
read after block N, never a block or more later.

A failed read (the node down or hung: ChainError, after the SDK's retries) is kept for
``block_poll_s`` as a block number is: the requests that waited for it, and those arriving in that
time, fail with it at once instead of each asking the node again in turn, which held the last of N
waiting requests for N failing reads (minutes each on finney) and asked the node once a request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

from quasar.chain import Chain, ChainError, Metagraph
from quasar.chain.base import ApiLocation, SubnetHyperparameters, WeightsSubmission

DEFAULT_BLOCK_POLL_S = 1.0


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
        self._block_lock = threading.Lock()
        self._metagraph_lock = threading.Lock()
        self._block: tuple[float, int] | None = None
        self._snapshot: tuple[int, Metagraph] | None = None
        # The last failed read of each kind: when it failed and why (kept for block_poll_s).
        self._block_failure: tuple[float, str] | None = None
        self._metagraph_failure: tuple[float, str] | None = None

    def _failed_lately(self, failure: tuple[float, str] | None) -> None:
        """Raise ``failure`` again if it happened less than ``block_poll_s`` ago."""
        if failure is not None and self.clock() - failure[0] < self.block_poll_s:
            raise ChainError(failure[1])

    def current_block(self) -> int:
        with self._block_lock:  # one read at a time; the others wait for it rather than all asking the node
            now = self.clock()
            if self._block is None or now - self._block[0] >= self.block_poll_s:
                self._failed_lately(self._block_failure)
                try:
                    self._block = (now, self.inner.current_block())
                except ChainError as error:
                    self._block_failure = (self.clock(), str(error))
                    raise
                self._block_failure = None
            return self._block[1]

    def metagraph(self) -> Metagraph:
        block = self.current_block()
        with self._metagraph_lock:
            if self._snapshot is None or self._snapshot[0] < block:
                self._failed_lately(self._metagraph_failure)
                try:
                    self._snapshot = (block, self.inner.metagraph())
                except ChainError as error:
                    self._metagraph_failure = (self.clock(), str(error))
                    raise
                self._metagraph_failure = None
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
