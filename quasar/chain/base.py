"""The chain interface and the typed records it returns."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass


class ChainError(RuntimeError):
    """A chain read or extrinsic failed; the message says which and why."""


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


class Chain(abc.ABC):
    """What QUASAR reads from and writes to the chain, for one subnet (``netuid``)."""

    netuid: int
    # Target seconds per block: only for estimating wall time from block counts (Bittensor: 12 s).
    block_time_s: float = 12.0

    @abc.abstractmethod
    def current_block(self) -> int:
        """The chain's current block number (never derived from the wall clock by callers)."""

    @abc.abstractmethod
    def metagraph(self) -> Metagraph:
        """The subnet's neurons now."""

    @abc.abstractmethod
    def owner_uid(self) -> int:
        """The uid of the subnet owner's hotkey: unassigned weight goes there (burn)."""

    @abc.abstractmethod
    def publish_endpoint(self, wallet, host: str, port: int) -> None:
        """Publish ``host:port`` as ``wallet``'s hotkey's endpoint; raise ChainError on failure."""

    @abc.abstractmethod
    def set_weights(self, wallet, weights: Mapping[int, float], version_key: int) -> None:
        """Set ``wallet``'s weights (uid -> weight); raise ChainError if the extrinsic fails."""

    def neuron(self, hotkey: str) -> NeuronInfo | None:
        """The neuron registered with ``hotkey``, or None."""
        return self.metagraph().by_hotkey(hotkey)

    def is_registered(self, hotkey: str) -> bool:
        return self.neuron(hotkey) is not None

    def has_validator_permit(self, hotkey: str) -> bool:
        neuron = self.neuron(hotkey)
        return neuron is not None and neuron.validator_permit
