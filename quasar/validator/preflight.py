"""What a validator checks before it starts: the evaluation sandbox, its wallet, its registration and
the subnet's rules for weights (its devices: devices.py).

Each check raises :class:`ValidatorSetupError` with a message that names what is wrong and how to fix it.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from quasar import scoring
from quasar.chain import btcli
from quasar.chain.base import MAX_UNREVEALED_COMMITS, Chain, SubnetHyperparameters
from quasar.chain.subtensor_rules import version_key_refusal
from quasar.config import Settings
from quasar.validator.devices import ValidatorSetupError
from quasar.validator.results import MAX_WEIGHTED_UIDS

logger = logging.getLogger(__name__)


def check_sandbox() -> None:
    """The evaluation sandbox must be buildable on this host: a validator runs miners' code only
    inside it, and without it every evaluation would fail on its side, one after another."""
    from quasar.evaluate.sandbox import sandbox_unavailable

    why = sandbox_unavailable()
    if why:
        raise ValidatorSetupError(
            f"the evaluation sandbox cannot be built on this host: {why}; a validator runs miners' code "
            'only inside it (docs/validator.md, "Rented GPU containers")'
        )


def check_registration(chain: Chain, hotkey: str, settings: Settings) -> None:
    """The hotkey must be registered on the subnet; a missing validator permit is only warned
    about (permits follow stake and can come later)."""
    wallet = settings.wallet_name_for("validator")
    neuron = chain.neuron(hotkey)
    if neuron is None:
        how = btcli.registration_hint(settings, wallet, hotkey, validator=True)
        raise ValidatorSetupError(
            f"hotkey {hotkey} is not registered on subnet {chain.netuid} of {settings.network}: "
            f"register it first ({how})"
        )
    if not neuron.validator_permit:
        logger.warning(
            "hotkey %s (uid %d) has no validator permit on subnet %d: the API refuses its requests and "
            "the chain drops its weights until it has one; each epoch the chain gives permits to the "
            "subnet's top validators by stake (%s)",
            hotkey,
            neuron.uid,
            chain.netuid,
            btcli.permit_hint(settings, wallet, hotkey, neuron.coldkey),
        )


# How a validator whose release the chain no longer takes gets the current one.
UPDATE_STEPS = "(git pull, then ./scripts/setup_venv.sh) and start the validator again"


def version_key_problem(hyperparameters: SubnetHyperparameters, version_key: int) -> str | None:
    """What to do when the chain refuses weights carrying ``version_key`` (a key below the subnet's
    WeightsVersionKey), or None when it takes them: at start and in every weights phase, since the
    subnet owner may raise the key while the validator runs."""
    refusal = version_key_refusal(version_key, hyperparameters)
    if refusal is None:
        return None
    return (
        f"this QUASAR's weights version key is {version_key}, below the subnet's WeightsVersionKey "
        f"{hyperparameters.weights_version_key}: the chain refuses its weights ({refusal.name}). Update QUASAR "
        f"to the subnet's current release {UPDATE_STEPS}"
    )


@dataclass(frozen=True)
class SubnetRulesCheck:
    """The subnet's rules for weights against what this validator does: ``problems`` cannot work (the
    validator refuses to start), ``notes`` change how it sets weights (it logs them)."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]


def assess_subnet_rules(
    hyperparameters: SubnetHyperparameters, version_key: int, epoch_blocks: int, block_time_s: float, subnet_size: int
) -> SubnetRulesCheck:
    """Check the subnet's hyperparameters against this validator's version key and weights (pure)."""
    h = hyperparameters
    problems, notes = [], []
    outdated = version_key_problem(h, version_key)
    if outdated:
        problems.append(outdated)
    first = scoring.PLACE_SHARES[0]
    if h.max_weight_share < first:
        problems.append(
            f"the subnet's max_weight_limit {h.max_weight_limit} caps a uid at {h.max_weight_share:.4f} of the "
            f"weights, below first place's {first:.2f}: QUASAR's split can never be set (the SDK would move the "
            "excess to other uids); the subnet owner must raise max_weight_limit"
        )
    elif h.max_weight_limit < 65535:
        notes.append(
            f"max_weight_limit {h.max_weight_limit} caps a uid at {h.max_weight_share:.4f} of the weights: an epoch "
            "whose split gives one uid more (the owner's burn when few miners place) is not submitted"
        )
    needed = min(subnet_size, h.min_allowed_weights)
    if needed > MAX_WEIGHTED_UIDS:
        problems.append(
            f"the subnet needs weights on at least {needed} uids (min_allowed_weights {h.min_allowed_weights}) but "
            f"QUASAR names at most {MAX_WEIGHTED_UIDS} (four places and the owner): the chain would refuse every "
            "setting (WeightVecLengthIsLow); the subnet owner must lower min_allowed_weights"
        )
    elif needed > 1:
        notes.append(
            f"min_allowed_weights {h.min_allowed_weights}: an epoch whose split names fewer than {needed} "
            "uids is not submitted"
        )
    if h.weights_rate_limit > epoch_blocks:
        notes.append(
            f"EPOCH_BLOCKS {epoch_blocks} is shorter than the subnet's weights rate limit "
            f"({h.weights_rate_limit} blocks): weights go out every {h.weights_rate_limit} blocks at most"
        )
    if h.commit_reveal_enabled:
        # The chain keeps a hotkey's commits by the epoch they were made in and takes at most
        # MAX_UNREVEALED_COMMITS of one epoch (TooManyUnrevealedCommits).
        interval = max(epoch_blocks, h.weights_rate_limit, 1)
        per_epoch = math.ceil(h.tempo / interval)
        if per_epoch > MAX_UNREVEALED_COMMITS:
            least = math.ceil(h.tempo / MAX_UNREVEALED_COMMITS)
            notes.append(
                f"committing every {interval} blocks makes up to {per_epoch} commits an epoch (tempo "
                f"{h.tempo}), more than the chain takes from a hotkey in one ({MAX_UNREVEALED_COMMITS}): "
                f"the rest of the epoch's are refused; EPOCH_BLOCKS of at least {least} avoids it"
            )
        seconds = h.reveal_period_epochs * h.tempo * block_time_s
        later = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
        notes.append(
            f"commit-reveal is on: weights are committed, and the chain applies them when it reveals them, "
            f"{h.reveal_period_epochs} epoch(s) of {h.tempo} blocks later (about {later} at "
            f"{block_time_s:g} s a block)"
        )
    return SubnetRulesCheck(tuple(problems), tuple(notes))


def check_subnet_rules(chain: Chain, settings: Settings, version_key: int) -> SubnetHyperparameters:
    """Read the subnet's hyperparameters and block time from the chain, refuse to start on what cannot
    work (:class:`ValidatorSetupError` naming each problem and its fix) and log the rest."""
    hyperparameters = chain.hyperparameters()
    check = assess_subnet_rules(
        hyperparameters, version_key, settings.epoch_blocks, chain.block_time_s, len(chain.metagraph().neurons)
    )
    if check.problems:
        raise ValidatorSetupError(f"subnet {chain.netuid} of {settings.network}: " + "; ".join(check.problems))
    for note in check.notes:
        logger.info("subnet %d: %s", chain.netuid, note)
    return hyperparameters
