"""The validator's weights phase: once an epoch, its own results as weights on chain.

:class:`WeightSetter` holds when weights were last set and when to look again; the validator loop
(quasar/validator/loop.py) hands it the metagraph's block and the scored results, and it plans
(quasar/validator/results.py) and submits them as the chain will take them.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import quasar
from quasar import scoring
from quasar.chain import btcli
from quasar.chain.base import Chain, ChainError, RateLimited, Refused, UidsChanged, WeightsSubmission
from quasar.config import Settings
from quasar.log import Repeats
from quasar.terminal import log_table, rendered_text
from quasar.validator.preflight import UPDATE_STEPS, version_key_problem
from quasar.validator.results import WeightPlan, plan_weights, weights_refusal, weights_table
from quasar.validator.state import ValidatorState

logger = logging.getLogger(__name__)

LAST_WEIGHTS_BLOCK = "last_weights_block"
# After a weight setting that failed for a passing reason (the chain could not be reached, a
# refusal that is not among subtensor_rules.LASTING_REFUSALS), blocks before the next try; a rate
# limit waits the blocks the chain says instead, and a lasting refusal the next epoch.
WEIGHTS_RETRY_BLOCKS = 10
# Plans made in one weights phase when uids change hands between planning and submitting.
PLAN_ATTEMPTS = 2
# Hotkeys named in an epoch's line about the measured hotkeys no longer registered (those gone since
# the last weights; the rest counted): naming every one made the line longer by each that ever left.
MAX_NAMED_LEFT_OUT = 10
# The chain's epoch leaves out a validator whose last weights (or commit) are more than the subnet's
# activity_cutoff blocks old; the owner may lower it to one tempo at any block. Of the cutoff, this
# share is kept for what delays a setting past its due block (a long step, the extrinsic's
# inclusion, a retry WEIGHTS_RETRY_BLOCKS later), and the subnet's rules are read again this often.
ACTIVITY_MARGIN = 0.1
RULES_READ_BLOCKS = WEIGHTS_RETRY_BLOCKS
ACTIVITY_CUTOFF = "activity cutoff"  # the Repeats key of a cutoff the chain cannot say


def weights_interval(epoch_blocks: int, activity_cutoff: int) -> int:
    """Blocks between two weight settings: EPOCH_BLOCKS, or less where the subnet's activity
    cutoff, less its margin (ACTIVITY_MARGIN), is shorter; at least 1."""
    return max(1, min(epoch_blocks, activity_cutoff - math.ceil(activity_cutoff * ACTIVITY_MARGIN)))


class WeightSetter:
    """Sets the weights of ``wallet``'s hotkey on ``chain`` once an epoch (:attr:`interval` blocks:
    EPOCH_BLOCKS, shorter where the subnet's activity cutoff needs it), remembering the block of the
    last setting in ``state``."""

    def __init__(
        self,
        settings: Settings,
        chain: Chain,
        wallet,
        state: ValidatorState,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self.chain = chain
        self.wallet = wallet
        self.hotkey = wallet.hotkey.ss58_address
        self.state = state
        self.retry_at: int | None = None
        self._left_out: frozenset[str] = frozenset()  # the hotkeys left out at the last weights
        self.interval = settings.epoch_blocks
        self._rules_read_at: int | None = None
        # The weights table last logged and its block: an unchanged table is not logged again
        # (the local network sets weights every second).
        self._last_table: tuple[str, int] | None = None
        # An unreadable activity cutoff: said once, then every REPEAT_EVERY_S of ``monotonic``.
        self.repeats = Repeats(logger, clock=monotonic)

    def due(self, block: int) -> bool:
        """Whether weights are to be set at ``block``: :attr:`interval` blocks after the last setting,
        and not before a retry or a skipped epoch says to look again."""
        self._follow_activity_cutoff(block)
        stored = self.state.get_meta(LAST_WEIGHTS_BLOCK)
        last = int(stored) if stored is not None else None
        if last is not None and last <= block < last + self.interval:
            return False
        return self.retry_at is None or block >= self.retry_at

    def _follow_activity_cutoff(self, block: int) -> None:
        """Every RULES_READ_BLOCKS, read the subnet's activity cutoff and set :attr:`interval` by it
        (:func:`weights_interval`), saying so when it changes; an unreadable chain keeps the last,
        said once, then every REPEAT_EVERY_S while it lasts, and once when the cutoff reads again."""
        if self._rules_read_at is not None and self._rules_read_at <= block < self._rules_read_at + RULES_READ_BLOCKS:
            return
        self._rules_read_at = block
        try:
            cutoff = self.chain.hyperparameters().activity_cutoff
        except ChainError as error:
            said = f"cannot read the subnet's activity cutoff ({error}); weights stay every {self.interval} blocks"
            self.repeats.say(ACTIVITY_CUTOFF, logging.WARNING, said)
            return
        self.repeats.ended(ACTIVITY_CUTOFF, f"the subnet's activity cutoff reads again: {cutoff} blocks")
        interval = weights_interval(self.settings.epoch_blocks, cutoff)
        if interval == self.interval:
            return
        self.interval = interval
        if interval < self.settings.epoch_blocks:
            logger.info(
                "weights every %d blocks, not EPOCH_BLOCKS %d: the subnet's activity_cutoff is %d blocks, and the "
                "chain's epoch leaves out a validator whose last weights are older (%d blocks kept for delays)",
                interval,
                self.settings.epoch_blocks,
                cutoff,
                cutoff - interval,
            )
        else:
            logger.info(
                "weights every EPOCH_BLOCKS %d again: the subnet's activity_cutoff is %d blocks", interval, cutoff
            )

    def set_weights(self, block: int, results: list[scoring.Result]) -> bool:
        """Set weights from ``results`` as the chain will take them; True when they went out.

        The metagraph is read again right before planning, and the chain checks at the block of
        submission that every uid is still held by the hotkey it was planned for (a uid that changed
        hands meanwhile is planned again, so a hotkey that took a uid before the submission never
        gets its old holder's share). On a commit-reveal subnet the chain applies the weights to
        uids at the reveal, and its epoch masks a weight committed before its uid's registration: a
        hotkey that takes a uid between the commit and the reveal gets nothing of that commit.

        Nothing is submitted with a version key below the subnet's WeightsVersionKey (an ERROR an
        epoch says to update QUASAR), without a validator permit (the subnet owner needs none), nor
        a split the subnet's max_weight_limit or min_allowed_weights would change: one line an
        epoch says why. A refusal from the chain that lasts (:class:`Refused`) waits for the next
        epoch too; a rate-limited submission waits the blocks the chain says; other failures are
        tried again WEIGHTS_RETRY_BLOCKS later."""
        for attempt in range(1, PLAN_ATTEMPTS + 1):
            try:
                planned = self._plan_and_submit(results)
            except UidsChanged as changed:
                if attempt == PLAN_ATTEMPTS:
                    self._retry(block, WEIGHTS_RETRY_BLOCKS, f"cannot set weights at block {block}: {changed}")
                    return False
                logger.info("%s; planning the weights again", changed)
                continue
            except RateLimited as limited:
                wait = limited.blocks_to_wait or min(WEIGHTS_RETRY_BLOCKS, self.settings.epoch_blocks)
                self._retry(block, wait, f"the chain's weights rate limit holds at block {block}: {limited}")
                return False
            except Refused as refused:
                # The chain's governance raised CommitRevealWeightsVersion past the installed SDK's.
                outdated = refused.name == "IncorrectCommitRevealVersion"
                self._skip_epoch(
                    block,
                    f"the chain refused the weights at block {block}, none this epoch: {refused}"
                    + (f"; update QUASAR {UPDATE_STEPS}" if outdated else ""),
                    logging.ERROR if outdated else logging.WARNING,
                )
                return False
            except ChainError as error:
                self._retry(
                    block,
                    min(WEIGHTS_RETRY_BLOCKS, self.settings.epoch_blocks),
                    f"cannot set weights at block {block}: {error}",
                )
                return False
            break
        if planned is None:
            return False
        plan, submission = planned
        self.retry_at = None
        self.state.set_meta(LAST_WEIGHTS_BLOCK, str(submission.block))
        self._log_left_out(plan.unregistered)
        what = "committed (the chain applies them when it reveals them)" if submission.committed else "set"
        said = (
            f"weights {what} at block {submission.block} ({submission.detail}; next after block "
            f"{submission.block + self.interval})"
        )
        table = weights_table(plan)
        text = rendered_text(table)
        if self._last_table is not None and self._last_table[0] == text:
            logger.info("%s: the same ranking as at block %d", said, self._last_table[1])
        else:
            log_table(logger, said + ":", table)
            self._last_table = (text, submission.block)
        return True

    def _log_left_out(self, unregistered: tuple[str, ...]) -> None:
        """Name the measured hotkeys left out of the ranking since the last weights (no longer
        registered), at most MAX_NAMED_LEFT_OUT of them, and count all that are."""
        new = [hotkey for hotkey in unregistered if hotkey not in self._left_out]
        self._left_out = frozenset(unregistered)
        if new:
            more = len(new) - MAX_NAMED_LEFT_OUT
            logger.info(
                "left out of the ranking (no longer registered) since the last weights: %s%s (%d in all)",
                ", ".join(new[:MAX_NAMED_LEFT_OUT]),
                f" and {more} more" if more > 0 else "",
                len(unregistered),
            )

    def _plan_and_submit(self, results: list[scoring.Result]) -> tuple[WeightPlan, WeightsSubmission] | None:
        """Plan the weights on the metagraph as it is now and submit them with the hotkeys they were
        planned for; None (said in one line, looked at again next epoch) when nothing may go out."""
        metagraph = self.chain.metagraph()
        block = metagraph.block
        me = metagraph.by_hotkey(self.hotkey)
        owner_uid = self.chain.owner_uid()
        if me is None:
            how = btcli.registration_hint(
                self.settings, self.settings.wallet_name_for("validator"), self.hotkey, validator=True
            )
            self._skip_epoch(
                block,
                f"hotkey {self.hotkey} is not registered on subnet {self.chain.netuid}: no weights until it is ({how})",
            )
            return None
        # Read every epoch: the subnet owner may raise WeightsVersionKey while the validator runs, and
        # a commit carrying a lower key is accepted, then dropped at its reveal.
        hyperparameters = self.chain.hyperparameters()
        outdated = version_key_problem(hyperparameters, quasar.version_key())
        if outdated:
            self._skip_epoch(block, f"no weights submitted this epoch: {outdated}", logging.ERROR)
            return None
        if not me.validator_permit and me.uid != owner_uid:
            self._skip_epoch(
                block,
                f"uid {me.uid} has no validator permit on subnet {self.chain.netuid} (stake "
                f"{me.stake:,.2f}): no weights submitted this epoch; the chain gives permits to "
                "the subnet's top validators by stake",
            )
            return None
        plan = plan_weights(results, metagraph, owner_uid, self.settings.tie_epsilon)
        if plan.dropped:
            logger.warning(
                "the subnet owner's hotkey holds no uid on subnet %d: the unassigned share %.2f is not "
                "set; the placed shares are set alone, scaled to sum 1",
                self.chain.netuid,
                plan.dropped,
            )
        if not plan.weights:
            self._skip_epoch(
                block, "no miner holds a place and the owner's hotkey holds no uid: no weights to set this epoch"
            )
            return None
        refusal = weights_refusal(plan, hyperparameters, len(metagraph.neurons), me.uid)
        if refusal:
            self._skip_epoch(block, f"weights not submitted this epoch: {refusal}")
            return None
        return plan, self.chain.set_weights(self.wallet, plan.weights, quasar.version_key(), plan.hotkeys)

    def _skip_epoch(self, block: int, why: str, level: int = logging.WARNING) -> None:
        """No weights this epoch: say why once, and look again next epoch."""
        self.retry_at = block + self.interval
        logger.log(level, "%s (next look at block %d)", why, self.retry_at)

    def _retry(self, block: int, blocks: int, why: str) -> None:
        self.retry_at = block + blocks
        logger.warning("%s; retrying at block %d", why, self.retry_at)
