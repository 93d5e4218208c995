"""Where miners and validators find the submission API, and how the subnet owner says where it is.

The owner publishes the API's public URL and hotkey on chain, in the subnet identity
(``python -m quasar.api publish-url URL``: :func:`publish_api`); miners and validators use
``VALIDATOR_API_URL`` when it is set, else what the chain says (:func:`find_api`), and log which;
while they run, :class:`ApiFollower` reads the chain again and follows the API where it moves.

Why the subnet identity: only the coldkey that owns the subnet can write it (so no one else can
point miners elsewhere), it holds any text (an https URL with a host name, not only an IP and a
port), it needs no uid (the owner's hotkey may hold none) and reading it needs no wallet. A
commitment would need the owner's hotkey to hold a uid (and resets its bonds), and a served axon
of the API's hotkey holds only an IP address and a port, and a uid of its own.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import httpx
from bittensor.sp_core import decode_ss58

from quasar.chain.base import ApiLocation, Chain, ChainError
from quasar.config import Settings
from quasar.errors import QuasarError

logger = logging.getLogger(__name__)

# Seconds between two reads of the API's location on chain by a running miner or validator.
FOLLOW_EVERY_S = 300.0


class ApiNotFound(QuasarError, RuntimeError):
    """Where the API is cannot be known; the message says what to set or ask for."""


@dataclass(frozen=True)
class ApiTarget:
    """The API a process talks to: its base URL, the hotkey its requests are signed for (None: read
    from its ``GET /health``) and where the URL came from (for the log)."""

    url: str
    hotkey: str | None
    source: str


def _checked_url(url: str, where: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc or any(ch.isspace() for ch in url):
        raise ApiNotFound(f"the API URL {where}, {url!r}, is not an http:// or https:// URL")
    return url.rstrip("/")


def find_api(settings: Settings, chain: Chain) -> ApiTarget:
    """``VALIDATOR_API_URL`` (with ``API_HOTKEY`` when set) when it is set, else the location the
    subnet owner published on chain (``API_HOTKEY`` still wins over the published hotkey)."""
    if settings.validator_api_url:
        return ApiTarget(settings.validator_api_url, settings.api_hotkey or None, "VALIDATOR_API_URL")
    location = chain.api_location()
    where = f"subnet {chain.netuid}'s identity on {settings.network}"
    if location is None:
        raise ApiNotFound(
            f"VALIDATOR_API_URL is empty and {where} names no submission API: set VALIDATOR_API_URL "
            "(or --api.url), or ask the subnet owner to publish it (python -m quasar.api publish-url URL)"
        )
    url = _checked_url(location.url, f"published in {where}")
    return ApiTarget(url, settings.api_hotkey or location.hotkey or None, where)


def publish_api(chain: Chain, owner_wallet, url: str, api_hotkey: str = "", timeout_s: float = 10.0) -> ApiLocation:
    """Publish ``url`` and the API's hotkey on chain, signed by ``owner_wallet``'s coldkey (the
    subnet's owner). The API must answer ``GET /health`` at ``url`` first, with ``api_hotkey`` when
    one is given (so a mistyped URL or a wrong server is never published); the hotkey published is
    the one it answers with."""
    url = _checked_url(url.strip(), "to publish")
    try:
        response = httpx.get(f"{url}/health", timeout=timeout_s)
        response.raise_for_status()
        served = str(response.json()["api_hotkey"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as error:
        raise ApiNotFound(
            f"the API at {url} does not answer GET /health with its hotkey ({error}): start it, "
            "and publish the URL miners and validators reach it at"
        ) from None
    if api_hotkey and served != api_hotkey:
        raise ApiNotFound(f"the API at {url} signs as {served}, not API_HOTKEY {api_hotkey}: is it the right server?")
    try:
        decode_ss58(served)
    except ValueError:
        raise ApiNotFound(f"the API at {url} names {served!r} as its hotkey, which is not an ss58 address") from None
    location = ApiLocation(url, served)
    chain.publish_api_location(owner_wallet, location)
    logger.info("published the submission API %s (hotkey %s) in subnet %d's identity", url, served, chain.netuid)
    return location


class ApiFollower:
    """Keeps ``client`` (found at ``target``) on the API the subnet owner publishes on chain: each
    call, at most every ``every_s`` seconds, reads the location again and moves the client where
    the owner moved the API (its URL or its hotkey), saying so in one line. Nothing when
    ``VALIDATOR_API_URL`` pins the API; a location that cannot be read now leaves the client where
    it is (said once)."""

    def __init__(
        self,
        settings: Settings,
        chain: Chain,
        client,
        target: ApiTarget,
        every_s: float = FOLLOW_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.settings = settings
        self.chain = chain
        self.client = client
        self.target = target
        self.every_s = every_s
        self.clock = clock
        self._read_at = clock()
        self._problem: str | None = None

    def __call__(self) -> None:
        if self.settings.validator_api_url or self.clock() - self._read_at < self.every_s:
            return
        self._read_at = self.clock()
        try:
            found = find_api(self.settings, self.chain)
        except (ChainError, ApiNotFound) as error:
            if str(error) != self._problem:
                logger.warning("cannot read where the submission API is; staying on %s: %s", self.target.url, error)
            self._problem = str(error)
            return
        self._problem = None
        if (found.url, found.hotkey) == (self.target.url, self.target.hotkey):
            return
        logger.warning(
            "the subnet owner moved the submission API: now %s (hotkey %s), was %s (hotkey %s)",
            found.url,
            found.hotkey or "from its /health",
            self.target.url,
            self.target.hotkey or "from its /health",
        )
        self.client.retarget(found.url, found.hotkey)
        self.target = found
