"""The Bittensor chain (finney, test, a local subtensor node, or a ws URL) through the ``bittensor`` SDK 11.

Reads go through a blocking ``bittensor.Subtensor``; writes are the SDK's intents ``SetWeights`` and
``ServeAxon`` submitted with ``Subtensor.execute``, whose ``ExtrinsicResult`` is inspected field by
field (``success``, ``error.code``, ``message``) so a failed extrinsic is never taken for a success.

Resilience, all bounded by ``retries`` with exponential back-off (``backoff_s``, ``2 * backoff_s``…):

- connection errors (the SDK's ``RpcConnectionError``/``ConnectionNotReady``, a dropped socket, a
  timeout) are retried on a freshly built client, since the SDK gives a session up for good once
  its own reconnects are exhausted; reads and writes alike;
- an attempt with no answer within ``attempt_timeout_s`` (ATTEMPT_TIMEOUT_S) counts as a connection
  error: what it waits for in the SDK is cancelled and its client closed. The SDK's own timeout
  restarts at every frame the node sends, so a node that keeps sending anything but the answer
  would otherwise hold the caller (the validator's whole loop) for good;
- a write the chain refuses for a rate limit is retried (the transaction pool's "priority too
  low" clears in a block or two); one it refuses for a reason that lasts (no permit, too little
  stake, a version key below the subnet's: ``subtensor_rules.LASTING_REFUSALS``) is raised at once
  as :class:`Refused` with the chain's error name (``subtensor_rules.refusal_error``, which the dev
  chain raises its refusals with too), other refusals as ChainError;
- before submitting weights, the subnet's ``weights_rate_limit``, the hotkey's last update and the
  uids the weights were planned for are read at one block: a submission the chain would refuse is
  not sent (:class:`RateLimited` says how many blocks to wait), nor one for a uid that another
  hotkey holds now (:class:`UidsChanged`). A submission too early is first checked for what the
  chain checks before the rate limit (the stake), so it gets the lasting refusal the chain would
  give (:class:`Refused`), not RateLimited;
  weights the SDK would not send for ``min_allowed_weights`` (:func:`sdk_count_refusal`) get that
  refusal too.

The block time is the chain's own (its Aura slot duration: 12 s on finney, 0.25 s on fast-block
nodes), read once. The API's location is read from and written to the subnet identity's
``additional`` field (quasar/chain/base.py).

Stake is the neuron's stake weight in the subnet's own units (alpha): its alpha stake plus its
root TAO stake times the chain's TAO weight, as the chain computes it for validator permits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import bittensor
from bittensor import BittensorError, ConnectionNotReady, ErrorCode, ExtrinsicResult, RpcConnectionError
from bittensor import ChainError as SdkChainError
from bittensor.intents import ServeAxon, SetSubnetIdentity, SetWeights

from quasar import version_key as package_version_key
from quasar.chain.base import (
    ApiLocation,
    Chain,
    ChainError,
    ChainUnreachable,
    Endpoint,
    Metagraph,
    NeuronInfo,
    RateLimited,
    SubnetHyperparameters,
    UidsChanged,
    WeightsSubmission,
    decode_api_location,
    encode_api_location,
)
from quasar.chain.subtensor_rules import (
    Refusal,
    blocks_until_allowed,
    checked_weights,
    identity_refusal,
    refusal_error,
    stake_refusal,
    u16_weights,
)
from quasar.log import Repeats

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Our hyperparameter -> the name in the chain's get_subnet_hyperparams_v3 (the SDK's subnet_hyperparameters).
HYPERPARAMETER_SOURCES = {
    "tempo": "tempo",
    "weights_version_key": "weights_version",
    "weights_rate_limit": "weights_rate_limit",
    "min_allowed_weights": "min_allowed_weights",
    "max_weight_limit": "max_weights_limit",
    "commit_reveal_enabled": "commit_reveal_weights_enabled",
    "reveal_period_epochs": "commit_reveal_period",
    "serving_rate_limit": "serving_rate_limit",
    "max_allowed_uids": "max_allowed_uids",
    "immunity_period": "immunity_period",
    "activity_cutoff_factor": "activity_cutoff_factor",
}
# A runtime older than subtensor's dynamic tempo answers the cutoff in blocks alone, without its factor.
ACTIVITY_CUTOFF_BLOCKS = "activity_cutoff"
# Seconds one attempt (a read, or a write up to its finalization, about three blocks on finney)
# may take before it is abandoned and tried again on a fresh connection.
ATTEMPT_TIMEOUT_S = 120.0
# Seconds an abandoned attempt's thread is given to end once its SDK tasks are cancelled.
ABANDON_WAIT_S = 5.0
# The subnet identity's fields, all rewritten by set_subnet_identity (empty ones are cleared).
IDENTITY_FIELDS = (
    "subnet_name",
    "github_repo",
    "subnet_contact",
    "subnet_url",
    "discord",
    "description",
    "logo_url",
    "additional",
)


class _RefusedForRateLimit(Exception):
    """Internal: the chain answered a write with a rate-limit error (retried with back-off)."""


def blocks_until_weights_allowed(block: int, blocks_since_update: int | None, rate_limit: int) -> int:
    """Blocks to wait before the chain accepts new weights from a uid (0: now): the chain's rate limit
    (:func:`~quasar.chain.subtensor_rules.blocks_until_allowed`) with the uid's last update at
    ``block - blocks_since_update``, where ``blocks_since_update`` is the SDK's
    ``epochs.blocks_since_last_update`` read at ``block`` (None: no last-update entry).
    """
    if blocks_since_update is None:
        return 0
    return blocks_until_allowed(block, block - blocks_since_update, rate_limit)


def sdk_count_refusal(weights: Mapping[int, float], setter_uid: int, min_allowed_weights: int) -> Refusal | None:
    """Why the SDK's ``SetWeights`` raises, before signing, ``weights`` the chain may take: it asks
    for ``min_allowed_weights`` nonzero weights whatever the subnet's size, where the chain's
    check_length asks for at most the subnet's size; a weight on the setter's own uid alone is exempt."""
    sent = u16_weights(weights)
    if list(weights) == [setter_uid] or len(sent) >= min_allowed_weights:
        return None
    return Refusal(
        "WeightVecLengthIsLow",
        f"{len(sent)} weights, and the installed bittensor SDK sends none below the subnet's min_allowed_weights "
        f"{min_allowed_weights}, even where the subnet holds fewer uids and the chain would take them",
    )


def normalize_weights(weights: Mapping[int, float]) -> dict[int, float]:
    """``weights`` scaled to sum 1; ChainError naming the bad entries (uid, finiteness, sign, sum)."""
    values = checked_weights(weights)
    total = sum(values.values())
    return {uid: weight / total for uid, weight in values.items()}


def endpoint_from_axon(axon: str | None) -> Endpoint | None:
    """Our :class:`Endpoint` from the SDK's served-axon text (``ip:port``, ``[ipv6]:port``, or None)."""
    if not axon:
        return None
    host, _, port = axon.rpartition(":")
    if not host or not port.isdigit() or int(port) == 0:
        return None
    return Endpoint(host.strip("[]"), int(port))


def to_hyperparameters(raw: Mapping[str, Any]) -> SubnetHyperparameters:
    """Our :class:`SubnetHyperparameters` from the SDK's flat ``subnet_hyperparameters`` mapping.
    Without ``activity_cutoff_factor`` (a runtime before dynamic tempo) the factor is the largest
    whose cutoff does not exceed the blocks ``activity_cutoff`` gives, so weights stay within it."""
    factor = HYPERPARAMETER_SOURCES["activity_cutoff_factor"]
    if factor not in raw and ACTIVITY_CUTOFF_BLOCKS in raw and int(raw.get("tempo") or 0) > 0:
        raw = {**raw, factor: int(raw[ACTIVITY_CUTOFF_BLOCKS]) * 1000 // int(raw["tempo"])}
    missing = sorted(name for name in HYPERPARAMETER_SOURCES.values() if name not in raw)
    if missing:
        raise ChainError(f"the chain's subnet hyperparameters lack {', '.join(missing)}")
    values = {ours: raw[theirs] for ours, theirs in HYPERPARAMETER_SOURCES.items()}
    fields: dict[str, Any] = {
        name: bool(value) if name == "commit_reveal_enabled" else int(value) for name, value in values.items()
    }
    return SubnetHyperparameters(**fields)


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
    raise refusal_error(error.name, f"{what} failed on chain: {_describe(error)}; {error.remediation}")


class BittensorChain(Chain):
    """One subnet (``netuid``) of a Bittensor network.

    ``network`` is a Bittensor network name (finney, test, local, archive); a non-empty
    ``endpoint`` (a ws:// or wss:// URL) overrides it. ``retries`` is how many times a failed
    attempt is repeated (so at most ``retries + 1`` attempts), after ``backoff_s``, then twice as
    long each time, waited with ``sleep``; an attempt without an answer within ``attempt_timeout_s``
    is abandoned as a connection error. ``client_factory(target)`` builds the SDK client for a
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
        attempt_timeout_s: float = ATTEMPT_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        client_factory: Callable[[str], Any] | None = None,
    ):
        if retries < 0 or not (math.isfinite(backoff_s) and backoff_s >= 0):
            raise ChainError(f"retries must be >= 0 and backoff_s a finite number >= 0; got {retries}, {backoff_s}")
        if not (math.isfinite(attempt_timeout_s) and attempt_timeout_s > 0):
            raise ChainError(f"attempt_timeout_s must be a finite number > 0; got {attempt_timeout_s}")
        self.netuid = netuid
        self.target = endpoint or network
        self.retries = retries
        self.backoff_s = backoff_s
        self.attempt_timeout_s = attempt_timeout_s
        self._sleep = sleep
        self._client_factory = client_factory or bittensor.Subtensor
        self._lock = threading.Lock()
        self._client = self._new_client()
        self._block_time_s: float | None = None
        # A node out of reach fails every read the same way: its retries said once, then every so often.
        self.repeats = Repeats(logger)

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

    def _bounded(self, client: Any, operation: Callable[[Any], T]) -> T:
        """``operation(client)``, run in a thread of its own and waited for at most
        ``attempt_timeout_s``; past it the client is abandoned (:meth:`_abandon`) and TimeoutError
        raised."""
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                outcome.set_result(operation(client))
            except BaseException as error:  # handed to the caller, as if raised in its thread
                outcome.set_exception(error)

        worker = threading.Thread(target=run, name="quasar-chain-call", daemon=True)
        worker.start()
        if not concurrent.futures.wait([outcome], timeout=self.attempt_timeout_s).done:
            self._abandon(client, worker)
            raise TimeoutError(f"no answer within {self.attempt_timeout_s:g} s")
        return outcome.result()

    def _abandon(self, client: Any, worker: threading.Thread) -> None:
        """Discard ``client``, whose call in ``worker`` got no answer in time, after cancelling what
        runs on the SDK client's event loop: its close fails the requests of an open session but
        skips a connection still opening, whose caller would wait for good. The loop is
        SyncClient's ``_loop_thread._loop`` (bittensor 11.3; none on another client). The socket
        of a connection cancelled while opening closes when the garbage collector takes it."""
        loop = getattr(getattr(client, "_loop_thread", None), "_loop", None)
        if isinstance(loop, asyncio.AbstractEventLoop) and loop.is_running():

            def cancel_all() -> None:
                for task in asyncio.all_tasks(loop):
                    task.cancel()

            loop.call_soon_threadsafe(cancel_all)
            worker.join(ABANDON_WAIT_S)
        self._discard(client)

    def _attempts(self, what: str, operation: Callable[[Any], T]) -> T:
        """``operation(client)``, repeated after connection errors and rate-limit refusals."""
        attempts = self.retries + 1
        failure: BaseException | None = None
        for attempt in range(attempts):
            if failure is not None:
                retrying = (
                    f"retrying, {attempts} attempts at most, {self.backoff_s:g} s apart and twice as long each time"
                )
                self.repeats.say(what, logging.WARNING, f"{what} on {self.target}: {failure}; {retrying}")
                self._sleep(self.backoff_s * 2 ** (attempt - 1))
            client = self._current_client()
            try:
                answer = self._bounded(client, operation)
                self.repeats.ended(what, f"{what} on {self.target} works again")
                return answer
            except _RefusedForRateLimit as refusal:
                failure = refusal
            except SdkChainError as error:
                if error.code is ErrorCode.RATE_LIMITED:  # the SDK's own preflight saw the limit
                    failure = _RefusedForRateLimit(_describe(error))
                elif _is_connection_error(error):
                    self._discard(client)
                    failure = error
                else:
                    raise refusal_error(error.name, f"{what} on {self.target}: {_describe(error)}") from None
            except Exception as error:
                if not _is_connection_error(error):
                    if isinstance(error, BittensorError):
                        raise ChainError(f"{what} on {self.target}: {error}") from None
                    raise
                self._discard(client)
                failure = error
        if isinstance(failure, _RefusedForRateLimit):
            raise RateLimited(
                None, f"{what}: the chain still refuses it for a rate limit after {attempts} attempts: {failure}"
            )
        raise ChainUnreachable(
            f"{what}: cannot reach {self.target} after {attempts} attempts: {type(failure).__name__}: {failure}"
        )

    # --- Chain ---

    # Chain declares block_time_s as an attribute (the dev chain sets it from its file); here it is
    # read-only, read from the chain on first use (nothing connects before).
    @property
    def block_time_s(self) -> float:  # type: ignore[override]
        """Seconds per block as the chain states it, read on first use."""
        if self._block_time_s is None:
            self._block_time_s = float(self._attempts("read the block time", lambda client: client.block_time()))
        return self._block_time_s

    def current_block(self) -> int:
        return int(self._attempts("read the current block", lambda client: client.block))

    def _sdk_metagraph(self, client: Any) -> bittensor.Metagraph:
        graph = client.subnets.metagraph(self.netuid, commitments=False)
        if graph is None:
            raise ChainError(f"subnet {self.netuid} does not exist on {self.target}")
        return graph

    def metagraph(self) -> Metagraph:
        return to_metagraph(self._attempts("read the metagraph", self._sdk_metagraph))

    def owner_uid(self) -> int | None:
        graph = self._attempts("read the metagraph", self._sdk_metagraph)
        owner = graph.by_hotkey(graph.owner_hotkey) if graph.owner_hotkey else None
        return None if owner is None else owner.uid

    def hyperparameters(self) -> SubnetHyperparameters:
        def read(client: Any) -> Mapping[str, Any]:
            raw = client.subnets.subnet_hyperparameters(self.netuid)
            if raw is None:
                raise ChainError(f"subnet {self.netuid} does not exist on {self.target}")
            return raw

        return to_hyperparameters(self._attempts("read the subnet's hyperparameters", read))

    def api_location(self) -> ApiLocation | None:
        identity = self._attempts(
            "read the subnet identity", lambda client: client.subnets.subnet_identity(self.netuid)
        )
        return decode_api_location((identity or {}).get("additional"))

    def publish_api_location(self, wallet, location: ApiLocation) -> None:
        """Write ``location`` into the subnet identity's ``additional`` field with ``SetSubnetIdentity``,
        keeping the identity's other fields; signed by ``wallet``'s coldkey, the subnet's owner. A text
        the chain would refuse for its length (:func:`identity_refusal`) is not sent."""

        def publish(client: Any) -> None:
            identity = client.subnets.subnet_identity(self.netuid) or {}
            fields = {name: str(identity.get(name) or "") for name in IDENTITY_FIELDS}
            fields["additional"] = encode_api_location(fields["additional"], location)
            refusal = identity_refusal(fields["additional"])
            if refusal:  # the chain would take the fee and refuse it
                raise ChainError(f"cannot set the identity of subnet {self.netuid}: {refusal}")
            intent = SetSubnetIdentity(netuid=self.netuid, **fields)
            result = _check_extrinsic("setting the subnet identity", client.execute(intent, wallet))
            logger.info(
                "published the API location %s on subnet %d (%s)",
                location.url,
                self.netuid,
                result.extrinsic_id or result.message,
            )

        self._attempts("publish the API location", publish)

    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        """Publish ``host:port`` (an IP address: the chain stores no names) with ``ServeAxon``.

        Does nothing when the hotkey already has exactly this endpoint on chain, so restarts do
        not spend the serving rate limit.
        """
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ChainError(
                f"endpoint host {host!r} is not an IP address; the chain stores an IPv4 "
                "or IPv6 address, not a host name"
            ) from None
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
                raise ChainError(
                    f"cannot publish an endpoint: hotkey {hotkey} is not registered on "
                    f"subnet {self.netuid} of {self.target}"
                )
            if neuron.endpoint == wanted:
                logger.info("endpoint %s of uid %d is already on chain", wanted.base_url, neuron.uid)
                return
            intent = ServeAxon(netuid=self.netuid, ip=str(address), port=port, version=package_version_key())
            result = _check_extrinsic("publishing the endpoint", client.execute(intent, wallet))
            logger.info(
                "published endpoint %s for uid %d on subnet %d (%s)",
                wanted.base_url,
                neuron.uid,
                self.netuid,
                result.extrinsic_id or result.message,
            )

        self._attempts("publish the endpoint", publish)

    def _refuse_as_the_chain_would(self, view: Any, hotkey: str) -> None:
        """Raise the lasting refusal the chain gives weights from ``hotkey`` before it checks the rate
        limit, if any: a stake below its StakeThreshold (the CheckWeights extension, the subnet
        owner's hotkey exempt; CheckRateLimits comes after it). Read at ``view``'s block."""
        graph = self._sdk_metagraph(view)
        neuron = graph.by_hotkey(hotkey)
        stake = neuron.total_stake.rao if neuron is not None else 0
        threshold = int(view.query(("SubtensorModule", "StakeThreshold")) or 0)
        refusal = stake_refusal(hotkey, stake, threshold, hotkey == graph.owner_hotkey)
        if refusal is not None:
            raise refusal_error(refusal.name, f"cannot set weights on subnet {self.netuid}: {refusal}")

    def set_weights(
        self, wallet, weights: Mapping[int, float], version_key: int, hotkeys: Mapping[int, str] | None = None
    ) -> WeightsSubmission:
        """Submit ``weights`` (normalized to sum 1) with ``SetWeights``, which commits them on a
        commit-reveal subnet (the chain applies them when it reveals them).

        Raises, without submitting, :class:`RateLimited` when the subnet's weights rate limit has not
        passed since this hotkey's last update (:class:`Refused` instead when the chain would refuse
        them for a reason it checks before the rate limit), and :class:`UidsChanged` when a uid of
        ``hotkeys`` is not held by its planned hotkey at the block of the check; ChainError when the
        extrinsic fails.
        """
        normalized = normalize_weights(weights)
        hotkey = _hotkey_address(wallet)

        def submit(client: Any) -> WeightsSubmission:
            view = client.at()
            uid = view.neurons.uid(hotkey, self.netuid)
            if uid is None:
                raise refusal_error(
                    "HotKeyNotRegisteredInSubNet",
                    f"cannot set weights: HotKeyNotRegisteredInSubNet: hotkey {hotkey} is not registered on "
                    f"subnet {self.netuid} of {self.target}",
                )
            changed = {}
            for planned_uid, planned in (hotkeys or {}).items():
                held = view.neurons.uid(planned, self.netuid)
                if held != planned_uid:
                    changed[planned_uid] = (planned, None)
            if changed:
                raise UidsChanged(changed)
            rate_limit = int(view.hyperparameters.weights_rate_limit(self.netuid))
            since = view.epochs.blocks_since_last_update(self.netuid, uid)
            wait = blocks_until_weights_allowed(view.block, since, rate_limit)
            if wait:
                self._refuse_as_the_chain_would(view, hotkey)
                raise RateLimited(
                    wait,
                    f"uid {uid} on subnet {self.netuid} registered or last set weights {since} blocks "
                    f"ago; the rate limit is {rate_limit} blocks: wait {wait} more",
                )
            least = int(view.query(("SubtensorModule", "MinAllowedWeights"), [self.netuid]) or 0)
            refusal = sdk_count_refusal(normalized, uid, least)
            if refusal is not None:
                raise refusal_error(refusal.name, f"cannot set weights on subnet {self.netuid}: {refusal}")
            committed = bool(view.subnets.commit_reveal_enabled(self.netuid))
            intent = SetWeights(
                netuid=self.netuid,
                uids=list(normalized),
                weights=list(normalized.values()),
                version_key=int(version_key),
            )
            result = _check_extrinsic("setting weights", client.execute(intent, wallet))
            reveal = result.data.get("reveal_round") if committed else None
            detail = (result.extrinsic_id or result.message) + (f", revealed at drand round {reveal}" if reveal else "")
            logger.info(
                "%s weights for %d uids on subnet %d as uid %d (version_key %d, %s)",
                "committed" if committed else "set",
                len(normalized),
                self.netuid,
                uid,
                version_key,
                detail,
            )
            return WeightsSubmission(view.block, committed, detail)

        return self._attempts("set weights", submit)
