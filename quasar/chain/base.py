"""The chain interface and the typed records it returns."""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping
from dataclasses import dataclass

from quasar.errors import QuasarError

# What ``quasar.chain`` exports: the interface and its records.
__all__ = [
    "ApiLocation",
    "Chain",
    "ChainError",
    "ChainUnreachable",
    "said_with_cure",
    "Endpoint",
    "Metagraph",
    "NeuronInfo",
    "RateLimited",
    "Refused",
    "SubnetHyperparameters",
    "UidsChanged",
    "WeightsSubmission",
]

# Weights and the max-weight limit are u16 on chain: 65535 is a share of 1.
U16_MAX = 65535
# A hotkey may make at most this many commits in one epoch (subtensor: TooManyUnrevealedCommits).
MAX_UNREVEALED_COMMITS = 10


class ChainError(QuasarError, RuntimeError):
    """A chain read or extrinsic failed; the message says which and why."""


class ChainUnreachable(ChainError):
    """The chain's node gave no answer after every try. ``cure`` is for the operator of the process
    that stops on it, said at its start; not in the message, which the API's 503 passes to its
    callers, whose own network is not the one at fault."""

    cure = (
        "check this host's network, or name a node that answers in SUBTENSOR_CHAIN_ENDPOINT "
        "(--subtensor.chain_endpoint)"
    )

    @property
    def with_cure(self) -> str:
        """The message and the cure: what a process that stops on this error says."""
        return f"{self}; {self.cure}"


def said_with_cure(error: Exception) -> str:
    """``error`` as a process that stops on it says it: a chain out of reach with its cure."""
    return error.with_cure if isinstance(error, ChainUnreachable) else str(error)


class RateLimited(ChainError):
    """The chain refuses this write for now because of a rate limit (weights or serving).

    ``blocks_to_wait`` is how many blocks until the chain accepts it, when known (computed from
    the subnet's rate limit and the neuron's last write); None when the chain refused without
    saying for how long.
    """

    def __init__(self, blocks_to_wait: int | None, message: str):
        super().__init__(message)
        self.blocks_to_wait = blocks_to_wait


class Refused(ChainError):
    """The chain refuses this write for a reason that holds until something outside this process
    changes (the hotkey's stake or permit, the subnet's rules, this QUASAR's release): trying again
    within the epoch gets the same answer. ``name`` is subtensor's error name."""

    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name


class UidsChanged(ChainError):
    """Weights were planned for uids that other hotkeys hold now (a uid deregistered and taken by a
    new hotkey between planning and submitting); nothing was submitted. ``changed`` maps each such
    uid to (the hotkey planned, the hotkey holding it now or None)."""

    def __init__(self, changed: Mapping[int, tuple[str, str | None]]):
        self.changed = dict(changed)
        shown = "; ".join(
            f"uid {uid}: planned for {planned}, held by {now or 'nobody'} now"
            for uid, (planned, now) in sorted(self.changed.items())
        )
        super().__init__(f"the subnet changed since the weights were planned ({shown}); nothing was submitted")


@dataclass(frozen=True)
class Endpoint:
    """An HTTP endpoint a neuron published on chain (the miner's inference server)."""

    host: str
    port: int

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


@dataclass(frozen=True)
class NeuronInfo:
    """One registered neuron of the subnet."""

    uid: int
    hotkey: str
    coldkey: str
    stake: float
    validator_permit: bool
    endpoint: Endpoint | None


@dataclass(frozen=True)
class Metagraph:
    """A snapshot of the subnet's neurons at ``block``."""

    netuid: int
    block: int
    neurons: tuple[NeuronInfo, ...]

    def by_hotkey(self, hotkey: str) -> NeuronInfo | None:
        return next((n for n in self.neurons if n.hotkey == hotkey), None)

    def by_uid(self, uid: int) -> NeuronInfo | None:
        return next((n for n in self.neurons if n.uid == uid), None)


@dataclass(frozen=True)
class SubnetHyperparameters:
    """The subnet's rules a validator and a miner depend on, as the chain holds them (subtensor's
    storage names in brackets)."""

    tempo: int  # blocks per epoch [Tempo]
    weights_version_key: int  # weights carry at least this version key; 0: any [WeightsVersionKey]
    weights_rate_limit: int  # blocks between two weight settings (or commits) of a uid [WeightsSetRateLimit]
    min_allowed_weights: int  # fewest uids one setting may name, capped by the subnet's size [MinAllowedWeights]
    max_weight_limit: int  # largest share of one uid, in u16 (65535: no cap) [MaxWeightsLimit]
    commit_reveal_enabled: bool  # weights are committed, applied when revealed [CommitRevealWeightsEnabled]
    reveal_period_epochs: int  # epochs from a commit to its reveal [RevealPeriodEpochs]
    serving_rate_limit: int  # blocks between two endpoint publications of a hotkey [ServingRateLimit]
    max_allowed_uids: int  # neurons the subnet holds before a registration replaces one [MaxAllowedUids]
    immunity_period: int  # blocks a new registration cannot be replaced [ImmunityPeriod]
    # The activity cutoff in thousandths of a tempo; a file made before the field has the chain's
    # default, INITIAL_ACTIVITY_CUTOFF_FACTOR_MILLI (5000 blocks at tempo 360) [ActivityCutoffFactorMilli]
    activity_cutoff_factor: int = 13_889

    @property
    def max_weight_share(self) -> float:
        """The largest share of the total one uid may receive (max_weight_limit / 65535)."""
        return self.max_weight_limit / U16_MAX

    @property
    def activity_cutoff(self) -> int:
        """Blocks after a uid's last weights (or commit) at which the chain's epoch stops counting
        them and its stake as a validator's: subtensor's get_activity_cutoff_blocks, at least 1."""
        return max(1, self.activity_cutoff_factor * self.tempo // 1000)


@dataclass(frozen=True)
class WeightsSubmission:
    """What :meth:`Chain.set_weights` did: set the weights (``committed`` False), or committed them
    for the chain to apply when it reveals them (``committed`` True, commit-reveal subnets);
    ``detail`` names the extrinsic or the reveal."""

    block: int
    committed: bool
    detail: str


@dataclass(frozen=True)
class ApiLocation:
    """Where the subnet's submission API is, as its owner published it on chain: its base URL and
    the ss58 address of the hotkey it signs as (empty when not published)."""

    url: str
    hotkey: str = ""


# The API's location lives in the subnet identity's free-text ``additional`` field as
# ``quasar-api=URL`` and ``quasar-api-hotkey=SS58``, among whatever else the owner wrote there.
API_URL_KEY = "quasar-api"
API_HOTKEY_KEY = "quasar-api-hotkey"
_TAGGED = re.compile(rf"(?:^|\s)({API_URL_KEY}|{API_HOTKEY_KEY})=(\S*)")


def decode_api_location(additional: str | None) -> ApiLocation | None:
    """The API location written in a subnet identity's ``additional`` text, or None without one."""
    found = {match.group(1): match.group(2) for match in _TAGGED.finditer(additional or "")}
    url = found.get(API_URL_KEY, "")
    return ApiLocation(url, found.get(API_HOTKEY_KEY, "")) if url else None


def encode_api_location(additional: str | None, location: ApiLocation) -> str:
    """``additional`` with the API location written in it, replacing an earlier one and keeping the
    rest of the owner's text."""
    kept = _TAGGED.sub("", additional or "").strip()
    tags = f"{API_URL_KEY}={location.url}" + (f" {API_HOTKEY_KEY}={location.hotkey}" if location.hotkey else "")
    return f"{kept} {tags}".strip()


class Chain(abc.ABC):
    """What QUASAR reads from and writes to the chain, for one subnet (``netuid``)."""

    netuid: int
    # Seconds per block, as the chain states it (12 on finney, 0.25 on fast-block nodes): only for
    # turning block counts into wall time. Each implementation reads it from its chain.
    block_time_s: float

    @abc.abstractmethod
    def current_block(self) -> int:
        """The chain's current block number (never derived from the wall clock by callers)."""

    @abc.abstractmethod
    def metagraph(self) -> Metagraph:
        """The subnet's neurons now."""

    @abc.abstractmethod
    def owner_uid(self) -> int | None:
        """The uid of the subnet owner's hotkey (unassigned weight goes there: burn), or None when
        the owner's hotkey holds no uid on the subnet."""

    @abc.abstractmethod
    def hyperparameters(self) -> SubnetHyperparameters:
        """The subnet's hyperparameters now."""

    @abc.abstractmethod
    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        """Publish ``host:port`` as ``wallet``'s hotkey's endpoint; nothing when it is already the one
        on chain. :class:`RateLimited` within the serving rate limit, ChainError on other failures."""

    @abc.abstractmethod
    def set_weights(
        self, wallet, weights: Mapping[int, float], version_key: int, hotkeys: Mapping[int, str] | None = None
    ) -> WeightsSubmission:
        """Set ``wallet``'s weights (uid -> weight), or commit them on a commit-reveal subnet.

        ``hotkeys`` (uid -> the hotkey the weights were planned for) is checked against the chain at
        the block the weights are submitted: :class:`UidsChanged` when a uid changed hands.
        :class:`RateLimited` within the weights rate limit; ChainError when the extrinsic fails.
        """

    @abc.abstractmethod
    def api_location(self) -> ApiLocation | None:
        """The submission API's location its owner published on chain (subnet identity), or None."""

    @abc.abstractmethod
    def publish_api_location(self, wallet, location: ApiLocation) -> None:
        """Publish ``location`` in the subnet identity; ``wallet``'s coldkey must own the subnet."""

    def neuron(self, hotkey: str) -> NeuronInfo | None:
        """The neuron registered with ``hotkey``, or None."""
        return self.metagraph().by_hotkey(hotkey)

    def is_registered(self, hotkey: str) -> bool:
        return self.neuron(hotkey) is not None

    def has_validator_permit(self, hotkey: str) -> bool:
        neuron = self.neuron(hotkey)
        return neuron is not None and neuron.validator_permit
