"""The Bittensor chain (finney, test, a local subtensor node, or a ws URL) through the ``bittensor`` SDK 11.

Reads go through a blocking ``bittensor.Subtensor``; writes are the SDK's intents ``SetWeights`` and
``ServeAxon`` submitted with ``Subtensor.execute``, whose ``ExtrinsicResult`` is inspected field by
field (``success``, ``error.code``, ``message``) so a failed extrinsic is never taken for a success.

Resilience, all bounded by ``retries`` with exponential back-off (``backoff_s``, ``2 * backoff_s``…):

- connection errors (the SDK's ``RpcConnectionError``/``ConnectionNotReady``, a dropped socket, a
  timeout) are retried on a freshly built client, since the SDK gives a session up for good once
  its own reconnects are exhausted; reads and writes alike;
- a write the chain refuses for a rate limit is retried (the transaction pool's "priority too
  low" clears in a block or two);
- before submitting weights, the subnet's ``weights_rate_limit`` and the hotkey's last update are
  read at one block: a submission the chain would refuse is not sent; :class:`RateLimited` says
  how many blocks to wait.

Stake is the neuron's stake weight in the subnet's own units (alpha): its alpha stake plus its
root TAO stake times the chain's TAO weight, as the chain computes it for validator permits.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import bittensor
from bittensor import BittensorError, ConnectionNotReady, ErrorCode, ExtrinsicResult, RpcConnectionError
from bittensor import ChainError as SdkChainError
from bittensor.intents import ServeAxon, SetWeights

from quasar import version_key as package_version_key
from quasar.chain.base import Chain, ChainError, Endpoint, Metagraph, NeuronInfo

logger = logging.getLogger(__name__)

T = TypeVar("T")

MAX_UID = 65535  # uids are u16 on chain


class RateLimited(ChainError):
    """The chain refuses this write for now because of a rate limit.

    ``blocks_to_wait`` is how many blocks until the chain accepts it, when known (the weights
    pre-check computes it); None when the chain refused without saying for how long.
    """

    def __init__(self, blocks_to_wait: int | None, message: str):
        super().__init__(message)
        self.blocks_to_wait = blocks_to_wait


class _RefusedForRateLimit(Exception):
    """Internal: the chain answered a write with a rate-limit error (retried with back-off)."""


def blocks_until_weights_allowed(block: int, blocks_since_update: int | None, rate_limit: int) -> int:
    """Blocks to wait before the chain accepts new weights from a uid (0: now).

    The chain's rule: allowed when the uid never set weights (its last update is 0) or when at
    least ``rate_limit`` blocks passed since its last update. ``blocks_since_update`` is the SDK's
    ``epochs.blocks_since_last_update`` read at ``block`` (None: no last-update entry).
    """
    if rate_limit <= 0 or blocks_since_update is None or block - blocks_since_update <= 0:
        return 0
    return max(0, rate_limit - blocks_since_update)


def normalize_weights(weights: Mapping[int, float]) -> dict[int, float]:
    """``weights`` scaled to sum 1; ChainError naming the bad entries (uid, finiteness, sign, sum)."""
    bad_uids = [uid for uid in weights if not isinstance(uid, numbers.Integral) or not 0 <= uid <= MAX_UID]
    if bad_uids:
        raise ChainError(f"weights: uids must be integers in 0..{MAX_UID}; got {bad_uids}")
    values = {int(uid): float(weight) for uid, weight in weights.items()}
    bad = {uid: weight for uid, weight in values.items() if not math.isfinite(weight) or weight < 0}
    if bad:
        raise ChainError(f"weights must be finite and non-negative; got {bad}")
    total = sum(values.values())
    if total <= 0:
        raise ChainError("weights are empty or all zero: nothing to set")
    return {uid: weight / total for uid, weight in sorted(values.items())}


def endpoint_from_axon(axon: str | None) -> Endpoint | None:
    """Our :class:`Endpoint` from the SDK's served-axon text (``ip:port``, ``[ipv6]:port``, or None)."""
    if not axon:
        return None
    host, _, port = axon.rpartition(":")
    if not host or not port.isdigit() or int(port) == 0:
        return None
    return Endpoint(host.strip("[]"), int(port))


def to_metagraph(graph: bittensor.Metagraph) -> Metagraph:
    """Our :class:`Metagraph` from the SDK's typed metagraph."""
    return Metagraph(
        netuid=graph.netuid,
        block=graph.block,
        neurons=tuple(
            NeuronInfo(
                uid=neuron.uid,
                hotkey=neuron.hotkey,
                coldkey=neuron.coldkey,
                stake=neuron.total_stake.amount,
                validator_permit=neuron.validator_permit,
                endpoint=endpoint_from_axon(neuron.axon),
            )
            for neuron in graph.neurons
        ),
    )


def _is_connection_error(error: BaseException) -> bool:
    """Whether ``error`` means the node could not be reached or the connection broke."""
    if isinstance(error, (RpcConnectionError, ConnectionNotReady, ConnectionError, TimeoutError)):
        return True
    # The SDK wraps a socket failure during submission as ChainError(...) from the original error.
    return isinstance(error, BittensorError) and error.__cause__ is not None and _is_connection_error(error.__cause__)


def _hotkey_address(wallet) -> str:
    try:
        return bittensor.resolve_signer(wallet, role="hotkey").ss58_address
    except (OSError, BittensorError, TypeError) as error:
        raise ChainError(f"cannot read the wallet's hotkey: {error}") from None


def _describe(error: SdkChainError) -> str:
    return f"{error.message} ({error.name})" if error.name else error.message


def _check_extrinsic(what: str, result: ExtrinsicResult) -> ExtrinsicResult:
    """``result`` when it succeeded; otherwise the failure as an exception (rate limits apart)."""
    if result.success is True:
        return result
    error = result.error or SdkChainError(result.message or "extrinsic failed without a message")
    if error.code is ErrorCode.RATE_LIMITED:
        raise _RefusedForRateLimit(_describe(error))
    raise ChainError(f"{what} failed on chain: {_describe(error)}; {error.remediation}")


class BittensorChain(Chain):
    """One subnet (``netuid``) of a Bittensor network.

    ``network`` is a Bittensor network name (finney, test, local, archive); a non-empty
    ``endpoint`` (a ws:// or wss:// URL) overrides it. ``retries`` is how many times a failed
    attempt is repeated (so at most ``retries + 1`` attempts), after ``backoff_s``, then twice as
    long each time, waited with ``sleep``. ``client_factory(target)`` builds the SDK client for a
    network name or URL (default ``bittensor.Subtensor``; tests pass a fake). Nothing connects
    until the first call.
    """

    def __init__(
        self,
        network: str,
        netuid: int,
        endpoint: str = "",
        *,
        retries: int = 3,
        backoff_s: float = 2.0,
        sleep: Callable[[float], None] = time.sleep,
        client_factory: Callable[[str], Any] | None = None,
    ):
        if retries < 0 or not (math.isfinite(backoff_s) and backoff_s >= 0):
            raise ChainError(f"retries must be >= 0 and backoff_s a finite number >= 0; got {retries}, {backoff_s}")
        self.netuid = netuid
        self.target = endpoint or network
        self.retries = retries
        self.backoff_s = backoff_s
        self._sleep = sleep
        self._client_factory = client_factory or bittensor.Subtensor
        self._lock = threading.Lock()
        self._client = self._new_client()

    def __repr__(self) -> str:
        return f"BittensorChain(target={self.target!r}, netuid={self.netuid})"

    # --- the SDK client and the retry loop ---

    def _new_client(self) -> Any:
        try:
            return self._client_factory(self.target)
        except ValueError as error:  # an unknown network name
            raise ChainError(str(error)) from None

    def _current_client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._new_client()
            return self._client

    def _discard(self, client: Any) -> None:
        """Drop a client whose connection failed; the next attempt builds a fresh one."""
        with self._lock:
            if self._client is client:
                self._client = None
        try:
            client.close()
        except Exception as error:  # closing a broken connection may fail too; nothing to do
            logger.debug("closing a failed chain client: %s", error)

    def _attempts(self, what: str, operation: Callable[[Any], T]) -> T:
        """``operation(client)``, repeated after connection errors and rate-limit refusals."""
        attempts = self.retries + 1
        failure: BaseException | None = None
        for attempt in range(attempts):
            if failure is not None:
                delay = self.backoff_s * 2 ** (attempt - 1)
                logger.warning("%s on %s: %s; retrying in %.1f s (attempt %d of %d)",
                               what, self.target, failure, delay, attempt + 1, attempts)
                self._sleep(delay)
            client = self._current_client()
            try:
                return operation(client)
            except _RefusedForRateLimit as refusal:
                failure = refusal
            except SdkChainError as error:
                if error.code is ErrorCode.RATE_LIMITED:  # the SDK's own preflight saw the limit
                    failure = _RefusedForRateLimit(_describe(error))
                elif _is_connection_error(error):
                    self._discard(client)
                    failure = error
                else:
                    raise ChainError(f"{what} on {self.target}: {_describe(error)}") from None
            except Exception as error:
                if not _is_connection_error(error):
                    if isinstance(error, BittensorError):
                        raise ChainError(f"{what} on {self.target}: {error}") from None
                    raise
                self._discard(client)
                failure = error
        if isinstance(failure, _RefusedForRateLimit):
            raise RateLimited(None, f"{what}: the chain still refuses it for a rate limit after "
                                    f"{attempts} attempts: {failure}")
        raise ChainError(f"{what}: cannot reach {self.target} after {attempts} attempts: "
                         f"{type(failure).__name__}: {failure}")

    # --- Chain ---

    def current_block(self) -> int:
        return int(self._attempts("read the current block", lambda client: client.block))

    def _sdk_metagraph(self, client: Any) -> bittensor.Metagraph:
        graph = client.subnets.metagraph(self.netuid, commitments=False)
        if graph is None:
            raise ChainError(f"subnet {self.netuid} does not exist on {self.target}")
        return graph

    def metagraph(self) -> Metagraph:
        return to_metagraph(self._attempts("read the metagraph", self._sdk_metagraph))

    def owner_uid(self) -> int:
        graph = self._attempts("read the metagraph", self._sdk_metagraph)
        owner = graph.by_hotkey(graph.owner_hotkey)
        if owner is None:
            raise ChainError(f"the owner hotkey {graph.owner_hotkey} of subnet {self.netuid} on {self.target} "
                             "holds no uid, so no weight can go to the owner")
        return owner.uid

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        """Publish ``host:port`` (an IP address: the chain stores no names) with ``ServeAxon``.

        Does nothing when the hotkey already has exactly this endpoint on chain, so restarts do
        not spend the serving rate limit.
        """
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ChainError(f"endpoint host {host!r} is not an IP address; the chain stores an IPv4 "
                             "or IPv6 address, not a host name") from None
        if address.is_unspecified:
            raise ChainError(f"endpoint host {host!r} is unspecified; publish the address others reach you at")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ChainError(f"endpoint port {port!r} must be an integer in 1..65535")
        if not address.is_global:
            logger.warning("publishing the non-public address %s: only peers on that network can reach it", address)
        hotkey = _hotkey_address(wallet)
        wanted = Endpoint(str(address), port)

        def publish(client: Any) -> None:
            neuron = to_metagraph(self._sdk_metagraph(client)).by_hotkey(hotkey)
            if neuron is None:
                raise ChainError(f"cannot publish an endpoint: hotkey {hotkey} is not registered on "
                                 f"subnet {self.netuid} of {self.target}")
            if neuron.endpoint == wanted:
                logger.info("endpoint %s of uid %d is already on chain", wanted.base_url, neuron.uid)
                return
            intent = ServeAxon(netuid=self.netuid, ip=str(address), port=port, version=package_version_key())
            result = _check_extrinsic("publishing the endpoint", client.execute(intent, wallet))
            logger.info("published endpoint %s for uid %d on subnet %d (%s)",
                        wanted.base_url, neuron.uid, self.netuid, result.extrinsic_id or result.message)

        self._attempts("publish the endpoint", publish)

    def set_weights(self, wallet, weights: Mapping[int, float], version_key: int) -> None:
        """Submit ``weights`` (normalized to sum 1) with ``SetWeights``.

        Raises :class:`RateLimited` without submitting when the subnet's weights rate limit has
        not passed since this hotkey's last update, and ChainError when the extrinsic fails.
        """
        normalized = normalize_weights(weights)
        hotkey = _hotkey_address(wallet)

        def submit(client: Any) -> None:
            view = client.at()
            uid = view.neurons.uid(hotkey, self.netuid)
            if uid is None:
                raise ChainError(f"cannot set weights: hotkey {hotkey} is not registered on "
                                 f"subnet {self.netuid} of {self.target}")
            rate_limit = int(view.hyperparameters.weights_rate_limit(self.netuid))
            since = view.epochs.blocks_since_last_update(self.netuid, uid)
            wait = blocks_until_weights_allowed(view.block, since, rate_limit)
            if wait:
                raise RateLimited(wait, f"weights of uid {uid} on subnet {self.netuid} were set {since} blocks "
                                        f"ago; the rate limit is {rate_limit} blocks: wait {wait} more")
            intent = SetWeights(netuid=self.netuid, weights=normalized, version_key=int(version_key))
            result = _check_extrinsic("setting weights", client.execute(intent, wallet))
            logger.info("set weights for %d uids on subnet %d as uid %d (version_key %d, %s)",
                        len(normalized), self.netuid, uid, version_key, result.extrinsic_id or result.message)

        self._attempts("set weights", submit)
