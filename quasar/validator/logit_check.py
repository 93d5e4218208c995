"""The validator's logit check of a miner (docs/rules.md section 4 step 6): the :class:`LogitChecker`
protocol and its production implementation, a fresh random challenge per try against this
validator's own reference model.

A miner answering 503 says "retry later": its queue was full for a moment (several validators
checking it at once) or it could not check the caller's permit; a check is recorded for good, so
that answer is tried again after :data:`RETRY_DELAYS_S`, each time with a fresh challenge (one sent
again would be one the miner had time to prepare). Every other failure is final at once.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from quasar import auth
from quasar.api.client import ApiClient, ApiClientError
from quasar.config import Settings
from quasar.config.values import PUBLIC_NETWORKS
from quasar.inference.client import LogitCheck, verify_miner_logits
from quasar.logits import (
    ChallengeLimits,
    LogitThresholds,
    ModelLoadError,
    ReferenceModel,
    check_reference_shape,
    draw_challenge,
    load_reference_model,
)

logger = logging.getLogger(__name__)

# The waits before the second and third tries of a check answered 503. A full queue (9 places) of
# challenges of a few seconds each drains within them, and a node hiccup clears in seconds (the
# server asks its node again on the next request); 15 s in all is half a check's timeout, a cost a
# miner answering 503 forever adds to a validator's check of each of its submissions, no more.
RETRY_DELAYS_S = (5.0, 10.0)


def why_logit_checks_wait(api: ApiClient) -> str | None:
    """Why this host cannot make logit checks now, or None: the API out of its reach (its own
    network may be down, and a miner it cannot reach fails its check for good), or its clock too
    far off the API's (None also when the API cannot say its time). Miners' servers refuse a
    challenge signed more than ALLOWED_CLOCK_SKEW_S ahead of their clocks or MAX_REQUEST_AGE_S
    behind, and that refusal fails the miner for good: with every miner's clock right, such a
    validator would fail them all. Half of each end is left to the miners' clocks, each up to
    CLOCK_MARGIN_S behind the API's or CLOCK_AGE_MARGIN_S ahead (docs/validator.md)."""
    try:
        offset = api.clock_offset()
    except ApiClientError as error:
        if error.status:
            return None  # the API answered: this host's network works
        return (
            f"{error}; this host's own network may be down, and a miner it cannot reach would fail its check for good"
        )
    if offset is None or not auth.clock_refused(offset, halved=True):
        return None
    return (
        auth.clock_offset_text(offset, "the API's") + "; miners refuse challenges signed over "
        f"{auth.ALLOWED_CLOCK_SKEW_S:g} s ahead or {auth.MAX_REQUEST_AGE_S:g} s behind their clocks, which may be "
        f"{auth.CLOCK_MARGIN_S:g} s behind the API's or {auth.CLOCK_AGE_MARGIN_S:g} s ahead: sync this host's clock "
        f"{auth.CLOCK_CURE}"
    )


class LogitChecker(Protocol):
    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        """Challenge the miner ``miner_hotkey`` serving at ``endpoint_url``; never raises for the miner's faults."""


def private_endpoint(endpoint_url: str) -> str | None:
    """Why ``endpoint_url``'s host is no public address (any that is not globally routable:
    loopback, private, link-local, shared or reserved; the validator's own host or network, or a
    cloud's metadata service), or None when it is one."""
    host = urlsplit(endpoint_url).hostname or ""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"its host {host!r} is not an IP address"
    if address.is_global:
        return None
    return (
        f"{address} is not a public address (loopback, private, link-local, shared or reserved), "
        "not one validators connect to"
    )


class MinerLogitChecker:
    """Challenges miners' inference servers, signed by ``wallet``, judged against ``reference``."""

    def __init__(
        self,
        wallet,
        reference: ReferenceModel,
        limits: ChallengeLimits,
        thresholds: LogitThresholds,
        timeout_s: float,
        private_endpoints_allowed: bool = False,
        sleep: Callable[[float], None] = time.sleep,
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
        self.private_endpoints_allowed = private_endpoints_allowed
        self.sleep = sleep

    @classmethod
    def from_settings(cls, settings: Settings, wallet, device: str) -> MinerLogitChecker:
        """Load REFERENCE_MODEL on ``device`` in REFERENCE_DTYPE (raises ModelLoadError saying how to fix it)."""
        reference = load_reference_model(settings.reference_model, device, settings.reference_dtype)
        if settings.network in PUBLIC_NETWORKS:  # a local network takes any model, its stand-in included
            check_reference_shape(reference, settings.network)
        limits = ChallengeLimits(max_prompt_len=settings.logits_max_prompt_len, max_gen_len=settings.logits_max_gen_len)
        thresholds = LogitThresholds(min_cosine=settings.logits_min_cosine, max_abs_diff=settings.logits_max_abs_diff)
        return cls(wallet, reference, limits, thresholds, settings.logits_timeout, settings.private_endpoints_allowed)

    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        """Fail a miner whose endpoint is no public address without connecting (unless allowed):
        its answers would tell the miner what listens on the validator's own network.

        An answer of 503 is tried again after each of :data:`RETRY_DELAYS_S`; the tries share
        ``timeout_s`` of exchanges, so a check takes at most ``timeout_s`` plus those waits."""
        refusal = None if self.private_endpoints_allowed else private_endpoint(endpoint_url)
        if refusal is not None:
            return LogitCheck(False, f"miner endpoint {endpoint_url} refused: {refusal}")
        started, left, tries = time.monotonic(), self.timeout_s, 0
        for delay in (*RETRY_DELAYS_S, None):
            tries += 1
            challenge = draw_challenge(self.reference.ordinary_tokens, self.limits)
            sent = time.monotonic()
            result = verify_miner_logits(
                endpoint_url, miner_hotkey, self.wallet, self.reference, challenge, left, self.thresholds
            )
            left -= time.monotonic() - sent
            if result.status != 503 or delay is None or left <= 0:
                break
            logger.info("miner %s answered 503 (%s); trying again in %g s", miner_hotkey, result.reason, delay)
            self.sleep(delay)
        if tries == 1:
            return result
        waited = time.monotonic() - started
        return dataclasses.replace(result, reason=f"{result.reason} ({tries} tries over {waited:.0f} s)")
