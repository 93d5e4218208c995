"""The validator's logit check of a miner (docs/rules.md section 4 step 6): the :class:`LogitChecker`
protocol and its production implementation, a fresh random challenge per check against this
validator's own reference model."""

from __future__ import annotations

import logging
from typing import Protocol

from quasar.config import Settings
from quasar.inference.client import LogitCheck, verify_miner_logits
from quasar.logits import (
    ChallengeLimits,
    LogitThresholds,
    ModelLoadError,
    ReferenceModel,
    draw_challenge,
    load_reference_model,
)

logger = logging.getLogger(__name__)


class LogitChecker(Protocol):
    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        """Challenge the miner ``miner_hotkey`` serving at ``endpoint_url``; never raises for the miner's faults."""


class MinerLogitChecker:
    """Challenges miners' inference servers, signed by ``wallet``, judged against ``reference``."""

    def __init__(
        self, wallet, reference: ReferenceModel, limits: ChallengeLimits, thresholds: LogitThresholds, timeout_s: float
    ):
        if reference.max_positions is not None and limits.max_prompt_len + limits.max_gen_len > reference.max_positions:
            raise ModelLoadError(
                f"LOGITS_MAX_PROMPT_LEN + LOGITS_MAX_GEN_LEN = {limits.max_prompt_len + limits.max_gen_len} exceeds "
                f"the reference model's context of {reference.max_positions} positions"
            )
        self.wallet = wallet
        self.reference = reference
        self.limits = limits
        self.thresholds = thresholds
        self.timeout_s = timeout_s

    @classmethod
    def from_settings(cls, settings: Settings, wallet, device: str) -> MinerLogitChecker:
        """Load REFERENCE_MODEL on ``device`` in REFERENCE_DTYPE (raises ModelLoadError saying how to fix it)."""
        reference = load_reference_model(settings.reference_model, device, settings.reference_dtype)
        limits = ChallengeLimits(max_prompt_len=settings.logits_max_prompt_len, max_gen_len=settings.logits_max_gen_len)
        thresholds = LogitThresholds(min_cosine=settings.logits_min_cosine, max_abs_diff=settings.logits_max_abs_diff)
        return cls(wallet, reference, limits, thresholds, settings.logits_timeout)

    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        challenge = draw_challenge(self.reference.ordinary_tokens, self.limits)
        return verify_miner_logits(
            endpoint_url, miner_hotkey, self.wallet, self.reference, challenge, self.timeout_s, self.thresholds
        )
