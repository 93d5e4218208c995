"""Subtensor's rules the suite depends on, as pure functions, with finney's defaults for a new subnet.

The dev chain enforces them (quasar/chain/devchain.py); the Bittensor chain checks its weights and
the rate limit with them before it submits, so a submission the chain would refuse is not sent.
Each rule names the function of subtensor's pallet (pallets/subtensor of opentensor/subtensor) it
follows.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import numbers
from collections.abc import Mapping
from typing import NamedTuple

from quasar.chain.base import U16_MAX, ChainError, RateLimited, Refused, SubnetHyperparameters

# A new subnet on finney: tempo INITIAL_SUBNET_TEMPO (360), DefaultWeightsSetRateLimit (100),
# init_new_network's min_allowed_weights (1), max_allowed_uids (256) and immunity_period (5000),
# DefaultMaxWeightsLimit (u16::MAX), DefaultCommitRevealWeightsEnabled (true),
# DefaultRevealPeriodEpochs (1), InitialServingRateLimit (50), InitialWeightsVersionKey (0),
# INITIAL_ACTIVITY_CUTOFF_FACTOR_MILLI (13,889: an activity cutoff of 5000 blocks at tempo 360).
FINNEY = SubnetHyperparameters(
    tempo=360,
    weights_version_key=0,
    weights_rate_limit=100,
    min_allowed_weights=1,
    max_weight_limit=U16_MAX,
    commit_reveal_enabled=True,
    reveal_period_epochs=1,
    serving_rate_limit=50,
    max_allowed_uids=256,
    immunity_period=5000,
    activity_cutoff_factor=13_889,
)
# The owner's bounds on the activity cutoff factor (set_activity_cutoff_factor): one to fifty tempos.
MIN_ACTIVITY_CUTOFF_FACTOR, MAX_ACTIVITY_CUTOFF_FACTOR = 1_000, 50_000
# DefaultMinNonImmuneUids: a full subnet replaces a neuron past its immunity period only while more
# than this many such neurons (the owner's apart) remain; else an immune one.
MIN_NON_IMMUNE_UIDS = 10
# init_new_network's MaxAllowedValidators: at each epoch the largest stakes up to this many get a
# validator permit.
MAX_ALLOWED_VALIDATORS = 64
# Subtensor stores these hyperparameters as u16 (Tempo, MinAllowedWeights, MaxWeightsLimit,
# MaxAllowedUids, ImmunityPeriod) and the other integers as u64.
U16_HYPERPARAMETERS = frozenset(
    {"tempo", "min_allowed_weights", "max_weight_limit", "max_allowed_uids", "immunity_period"}
)
U64_MAX = 2**64 - 1
# set_reveal_period: RevealPeriodEpochs is at most MAX_COMMIT_REVEAL_PEROIDS (RevealPeriodTooLarge).
MAX_REVEAL_PERIOD_EPOCHS = 100
# sudo_set_max_allowed_uids: at most DefaultMaxAllowedUids, the runtime's InitialMaxAllowedUids.
MAX_ALLOWED_UIDS_LIMIT = 256
# is_valid_subnet_identity: the subnet identity's additional text holds at most this many bytes.
MAX_IDENTITY_ADDITIONAL_BYTES = 1024
HYPERPARAMETER_NAMES = tuple(field.name for field in dataclasses.fields(SubnetHyperparameters))

# Subtensor's refusals of weights (and commits) that hold until something outside the validator
# changes: its registration, stake or permit, the subnet's rules, or QUASAR's release. Trying again
# blocks later gets the same answer, so they count for the epoch (:class:`~quasar.chain.base.Refused`).
# Names as the SDK reports them (bittensor.error_map); StakeAmountTooLow is how it names the
# transaction pool's Custom(1), which for a weights call is NotEnoughStakeToSetWeights.
# TooManyUnrevealedCommits clears only when an older commit is revealed, at an epoch's start;
# IncorrectCommitRevealVersion (the chain's governance raised CommitRevealWeightsVersion above the
# SDK's, which no pre-check reads) only when QUASAR's bittensor is updated.
LASTING_REFUSALS = frozenset(
    {
        "HotKeyNotRegisteredInSubNet",
        "IncorrectWeightVersionKey",
        "IncorrectCommitRevealVersion",
        "NeuronNoValidatorPermit",
        "NotEnoughStakeToSetWeights",
        "StakeAmountTooLow",
        "UidVecContainInvalidOne",
        "DuplicateUids",
        "WeightVecNotEqualSize",
        "UidsLengthExceedUidsInSubNet",
        "WeightVecLengthIsLow",
        "MaxWeightExceeded",
        "TooManyUnrevealedCommits",
        "SubnetNotExists",
    }
)


def refusal_error(name: str | None, message: str) -> ChainError:
    """Subtensor's refusal ``name`` as both chains raise it: :class:`Refused` when it lasts
    (LASTING_REFUSALS: the validator waits for the next epoch), else ChainError (tried again soon)."""
    if name in LASTING_REFUSALS:
        return Refused(name, message)
    return ChainError(message)


def checked_weights(weights: Mapping[int, float]) -> dict[int, float]:
    """``weights`` as uid -> float, sorted by uid; ChainError naming the bad entries: uids are u16
    on chain, weights finite and non-negative, and not all zero (the SDK's ``normalize`` divides by
    their sum)."""
    bad_uids = [uid for uid in weights if not isinstance(uid, numbers.Integral) or not 0 <= uid <= U16_MAX]
    if bad_uids:
        raise ChainError(f"weights: uids must be integers in 0..{U16_MAX}; got {bad_uids}")
    values = {int(uid): float(weight) for uid, weight in sorted(weights.items())}
    bad = {uid: weight for uid, weight in values.items() if not math.isfinite(weight) or weight < 0}
    if bad:
        raise ChainError(f"weights must be finite and non-negative; got {bad}")
    if sum(values.values()) <= 0:
        raise ChainError("weights are empty or all zero: nothing to set")
    return values


def u16_weights(weights: Mapping[int, float]) -> dict[int, int]:
    """Weights as the chain receives them: max-upscaled to u16, zeros dropped (the SDK's ``normalize``)."""
    top = max(weights.values(), default=0.0)
    if top <= 0:
        return {}
    scaled = {uid: round(weight / top * U16_MAX) for uid, weight in weights.items()}
    return {uid: value for uid, value in sorted(scaled.items()) if value}


class Refusal(NamedTuple):
    """Why subtensor refuses weights: its error's ``name`` and what it means here."""

    name: str
    detail: str

    def __str__(self) -> str:
        return f"{self.name}: {self.detail}"


def stake_refusal(hotkey: str, stake: float, threshold: float, owner: bool) -> Refusal | None:
    """Why subtensor's ``check_weights_min_stake`` refuses weights or a commit from ``hotkey``
    holding ``stake``: below the chain's StakeThreshold, the subnet owner's hotkey exempt. The
    transaction pool checks it first, before every check of the call."""
    if owner or stake >= threshold:
        return None
    return Refusal(
        "NotEnoughStakeToSetWeights",
        f"hotkey {hotkey} holds a stake of {stake:g}, below the chain's StakeThreshold {threshold:g}",
    )


def version_key_refusal(version_key: int, hyperparameters: SubnetHyperparameters) -> Refusal | None:
    """Why subtensor's ``check_version_key`` refuses weights carrying ``version_key`` (a key below
    the subnet's WeightsVersionKey; 0 there accepts any), or None when it accepts them."""
    required = hyperparameters.weights_version_key
    if required and version_key < required:
        return Refusal(
            "IncorrectWeightVersionKey",
            f"version_key {version_key} is below the subnet's WeightsVersionKey {required}",
        )
    return None


def weights_refusal(
    weights: Mapping[int, float],
    setter_uid: int,
    setter_permit: bool,
    owner_uid: int | None,
    uids: set[int],
    hyperparameters: SubnetHyperparameters,
) -> Refusal | None:
    """Why subtensor's ``internal_set_weights`` refuses ``weights`` from ``setter_uid`` once the
    rate limit, the setter's registration and its version key passed (those are checked before), or
    None when it accepts them: the error's name and what it means."""
    values = u16_weights(weights)
    if not values:
        return Refusal("WeightVecLengthIsLow", "weights are empty or all zero")
    self_weight = list(values) == [setter_uid]  # is_self_weight: one entry, on the setter's own uid
    # check_validator_permit: a self-weight and the subnet owner need no permit.
    if not (self_weight or setter_uid == owner_uid or setter_permit):
        return Refusal("NeuronNoValidatorPermit", f"uid {setter_uid} has no validator permit")
    unknown = sorted(set(values) - uids)
    if unknown:
        return Refusal("UidVecContainInvalidOne", f"uids {unknown} are not registered")
    # check_length: at least min(subnet size, MinAllowedWeights) weights, a self-weight apart.
    needed = min(len(uids), hyperparameters.min_allowed_weights)
    if not self_weight and len(values) < needed:
        return Refusal("WeightVecLengthIsLow", f"{len(values)} weights, the subnet needs at least {needed}")
    # max_weight_limited: no share above MaxWeightsLimit / 65535, a self-weight apart.
    share = max(values.values()) / sum(values.values())
    if not self_weight and hyperparameters.max_weight_limit < U16_MAX and share > hyperparameters.max_weight_share:
        return Refusal(
            "MaxWeightExceeded",
            f"a share of {share:.4f} is above the subnet's max_weight_limit "
            f"{hyperparameters.max_weight_limit} ({hyperparameters.max_weight_share:.4f})",
        )
    return None


class PruneCandidate(NamedTuple):
    """A neuron a registration on a full subnet may replace (the subnet owner's is none)."""

    uid: int
    emission: float
    registered_block: int


def neuron_to_prune(
    candidates: list[PruneCandidate], block: int, immunity_period: int, min_non_immune_uids: int
) -> int | None:
    """The uid subtensor's ``get_neuron_to_prune`` replaces: among the neurons past their immunity
    period when more than ``min_non_immune_uids`` of them are, else among the immune ones, the one
    of least emission, then earliest registered, then lowest uid; None (NoNeuronIdAvailable) when
    that group is empty."""
    immune = [c for c in candidates if block - c.registered_block < immunity_period]
    free = [c for c in candidates if block - c.registered_block >= immunity_period]
    group = free if len(free) > min_non_immune_uids else immune
    if not group:
        return None
    return min(group, key=lambda c: (c.emission, c.registered_block, c.uid)).uid


def blocks_until_allowed(block: int, last: int, rate_limit: int) -> int:
    """Blocks to wait before a rate-limited write is allowed (0: now): subtensor's check_rate_limit
    and axon_passes_rate_limit allow it when the last one is at block 0 (never) or at least
    ``rate_limit`` blocks ago."""
    if rate_limit <= 0 or last <= 0:
        return 0
    return max(0, rate_limit - (block - last))


def check_weights_rate_limit(
    name: str, uid: int, last_update: int, block: int, hyperparameters: SubnetHyperparameters
) -> None:
    """Subtensor's check_rate_limit for weights and commits alike: RateLimited named ``name`` until
    ``weights_rate_limit`` blocks have passed since the uid's LastUpdate."""
    wait = blocks_until_allowed(block, last_update, hyperparameters.weights_rate_limit)
    if wait:
        raise RateLimited(
            wait,
            f"cannot set weights: {name}: uid {uid} registered or last set weights at block {last_update}; "
            f"the rate limit is {hyperparameters.weights_rate_limit} blocks: wait {wait} more",
        )


def validator_permits(
    stakes: Mapping[int, float], max_allowed_validators: int, stake_threshold: float, owner_uid: int | None
) -> set[int]:
    """The uids an epoch gives a validator permit (run_epoch): the ``max_allowed_validators`` largest
    stakes that are not zero (is_topk_nonzero), a stake below ``stake_threshold`` counting as zero
    but the owner's; of equal stakes the higher uid first (the chain's stable ascending sort drops
    the lower one); and the subnet owner's uid whatever its stake."""
    counted = {uid: stake for uid, stake in stakes.items() if uid == owner_uid or stake >= stake_threshold}
    ranked = sorted(((stake, uid) for uid, stake in counted.items() if stake > 0), reverse=True)
    permitted = {uid for _, uid in ranked[:max_allowed_validators]}
    if owner_uid is not None and owner_uid in stakes:
        permitted.add(owner_uid)
    return permitted


def next_epoch_block(block: int, tempo: int, last: int = 0) -> int:
    """The first block of the epoch after ``block``'s: epochs start every ``tempo`` blocks from
    ``last``, an epoch's start at or before ``block`` (subtensor's LastEpochBlock, which its tempo
    setters move to the block of the change: apply_tempo_with_cycle_reset)."""
    tempo = max(1, tempo)
    return last + ((block - last) // tempo + 1) * tempo


def reveal_block_for(commit_block: int, hyperparameters: SubnetHyperparameters, last: int = 0) -> int:
    """The block a commit made at ``commit_block`` is revealed: the first block of the epoch
    ``reveal_period_epochs`` after the commit's (reveal_crv3_commits_for_subnet reveals the
    commits of epoch e at the start of epoch e + RevealPeriodEpochs); epochs as in
    :func:`next_epoch_block`."""
    tempo = max(1, hyperparameters.tempo)
    return next_epoch_block(commit_block, tempo, last) + (hyperparameters.reveal_period_epochs - 1) * tempo


def retimed_reveal(
    reveal_block: int, last: int, old: SubnetHyperparameters, new: SubnetHyperparameters, block: int
) -> int | None:
    """Where a pending commit due at ``reveal_block`` under ``old`` is revealed once the subnet
    changes to ``new`` at ``block`` (``last``: the start of the current epoch), or None when it
    expires unrevealed. Subtensor keeps commits by the epoch they were made in and, at each epoch's
    start, reveals those of the epoch RevealPeriodEpochs (read then) before and removes older ones;
    a tempo change restarts the epoch cycle at ``block``."""
    epochs_left = (reveal_block - last) // max(1, old.tempo) + new.reveal_period_epochs - old.reveal_period_epochs
    if epochs_left < 1:
        return None
    return (block if new.tempo != old.tempo else last) + epochs_left * max(1, new.tempo)


def refused_axon_address(host: str, allow_loopback: bool = False) -> str | None:
    """Why subtensor's ``is_valid_ip_address`` refuses ``host`` for an axon, or None when it takes it:
    the all-ones address (an IPv4 address of u32::MAX, an IPv6 one of u128::MAX) and the loopback
    address (127.0.0.1, ::1) unless ``allow_loopback`` (the dev chain's allowance for a network on one
    machine); it names no other range."""
    address = ipaddress.ip_address(host)
    if int(address) == (1 << address.max_prefixlen) - 1:
        return f"InvalidIpAddress: {host} is the all-ones address, which the chain refuses"
    loopback = address == ipaddress.ip_address("127.0.0.1") or address == ipaddress.ip_address("::1")
    if loopback and not allow_loopback:
        return (
            f"InvalidIpAddress: {host} is the loopback address, which the chain refuses (a dev chain file "
            "stores it only with allow-loopback, as the local network sets)"
        )
    return None


def identity_refusal(additional: str) -> str | None:
    """Why subtensor's ``is_valid_subnet_identity`` refuses a subnet identity whose ``additional``
    text is this (InvalidIdentity: more than 1024 bytes of UTF-8), or None when it takes it."""
    size = len(additional.encode())
    if size <= MAX_IDENTITY_ADDITIONAL_BYTES:
        return None
    return (
        f"InvalidIdentity: the identity's additional text would be {size} bytes, above the chain's "
        f"{MAX_IDENTITY_ADDITIONAL_BYTES}: publish a shorter URL, or shorten the owner's own text there"
    )


def hyperparameters_refusal(values: Mapping[str, object]) -> str | None:
    """Why ``values`` (some of :class:`SubnetHyperparameters`'s fields) cannot be the subnet's
    hyperparameters, or None: the names must be known, ``commit_reveal_enabled`` a bool, the rest
    non-negative integers of the chain's type (u16 or u64), ``tempo`` at least 1,
    ``reveal_period_epochs`` 1 to 100, ``max_allowed_uids`` at most 256, ``activity_cutoff_factor``
    within subtensor's bounds (ActivityCutoffFactorMilliOutOfBounds)."""
    unknown = sorted(set(values) - set(HYPERPARAMETER_NAMES))
    if unknown:
        return f"unknown hyperparameters {unknown}; known: {', '.join(HYPERPARAMETER_NAMES)}"
    integers: dict[str, int] = {}
    for name, value in values.items():
        if name == "commit_reveal_enabled":
            if not isinstance(value, bool):
                return f"{name} must be true or false, got {value!r}"
        elif isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{name} must be a non-negative integer, got {value!r}"
        else:
            integers[name] = value
    for name, value in integers.items():
        kind, most = ("u16", U16_MAX) if name in U16_HYPERPARAMETERS else ("u64", U64_MAX)
        if value > most:
            return f"{name} is a {kind} on chain: at most {most}"
    if integers.get("tempo", 1) < 1 or integers.get("reveal_period_epochs", 1) < 1:
        return "tempo and reveal_period_epochs must be at least 1"
    if integers.get("reveal_period_epochs", 1) > MAX_REVEAL_PERIOD_EPOCHS:
        return (
            f"RevealPeriodTooLarge: reveal_period_epochs {integers['reveal_period_epochs']} is above "
            f"{MAX_REVEAL_PERIOD_EPOCHS}, subtensor's most"
        )
    if integers.get("max_allowed_uids", 0) > MAX_ALLOWED_UIDS_LIMIT:
        return (
            f"MaxAllowedUidsGreaterThanDefaultMaxAllowedUids: max_allowed_uids {integers['max_allowed_uids']} "
            f"is above {MAX_ALLOWED_UIDS_LIMIT}, the most the chain lets a subnet hold"
        )
    factor = integers.get("activity_cutoff_factor", MIN_ACTIVITY_CUTOFF_FACTOR)
    if not MIN_ACTIVITY_CUTOFF_FACTOR <= factor <= MAX_ACTIVITY_CUTOFF_FACTOR:
        return (
            f"activity_cutoff_factor {factor} is out of bounds (ActivityCutoffFactorMilliOutOfBounds): "
            f"{MIN_ACTIVITY_CUTOFF_FACTOR}..{MAX_ACTIVITY_CUTOFF_FACTOR} thousandths of a tempo"
        )
    return None
