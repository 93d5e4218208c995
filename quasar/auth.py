"""Hotkey-signed HTTP requests (``btauth/1``) for QUASAR's services and clients.

Signing and verification are the SDK's (``bittensor.http_auth``): each request is bound to its
method, path (with query), a hash of the exact body bytes, the receiving service's hotkey and a
fresh nanosecond nonce. This module adds what both of our servers need on top: mapping failures
to HTTP status codes, an authorization step against the chain (registered, validator permit), and
a client helper that signs the exact bytes it sends.
"""

from __future__ import annotations

import heapq
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from bittensor import http_auth

from quasar.chain import Chain
from quasar.errors import QuasarError

# A request's nonce is the signer's clock (ns): more than MAX_REQUEST_AGE_S seconds behind the
# receiver's clock (late in transit, or signed by a clock behind) or ALLOWED_CLOCK_SKEW_S ahead, it
# is refused; the nonce store must retain at least their sum.
MAX_REQUEST_AGE_S = http_auth.DEFAULT_MAX_AGE
ALLOWED_CLOCK_SKEW_S = http_auth.DEFAULT_ALLOWED_SKEW
# Signer and receiver each measure their clocks against the API's; each keeping within half of each
# end (1 s of the 2 s ahead, 5 s of the 10 s behind), neither's offset gets the other's requests refused.
CLOCK_MARGIN_S = ALLOWED_CLOCK_SKEW_S / 2
CLOCK_AGE_MARGIN_S = MAX_REQUEST_AGE_S / 2
# How the operator of a host whose clock is off syncs it ("sync this host's clock " + CLOCK_CURE).
CLOCK_CURE = "with NTP (timedatectl set-ntp true; a container has its machine's clock)"


class AuthFailure(QuasarError):
    """A request failed authentication (401) or authorization (403); ``reason`` is safe to return."""

    def __init__(self, status_code: int, reason: str):
        super().__init__(reason)
        self.status_code = status_code
        self.reason = reason


class ClockRefusal(AuthFailure):
    """A request refused (401) for the time it was signed at alone: its signature verifies, by
    ``hotkey``, signed at ``nonce_ns`` (its nonce), ``offset_s`` seconds ahead of this host's clock
    (negative: behind)."""

    def __init__(self, reason: str, hotkey: str, nonce_ns: int, offset_s: float):
        super().__init__(401, reason)
        self.hotkey = hotkey
        self.nonce_ns = nonce_ns
        self.offset_s = offset_s


Authorizer = Callable[[str], None]


def require_registered(chain: Chain) -> Authorizer:
    """Authorizer: the caller's hotkey must be registered on the subnet."""

    def authorize(hotkey: str) -> None:
        if not chain.is_registered(hotkey):
            raise AuthFailure(403, f"hotkey {hotkey} is not registered on subnet {chain.netuid}")

    return authorize


def require_validator_permit(chain: Chain) -> Authorizer:
    """Authorizer: the caller's hotkey must hold a validator permit on the subnet."""

    def authorize(hotkey: str) -> None:
        if not chain.has_validator_permit(hotkey):
            raise AuthFailure(403, f"hotkey {hotkey} has no validator permit on subnet {chain.netuid}")

    return authorize


def request_target(path: str, query: str) -> str:
    """The signed request target: the path plus ``?query`` exactly as sent."""
    return f"{path}?{query}" if query else path


def authenticate(
    headers: Mapping[str, str],
    body: bytes,
    *,
    method: str,
    target: str,
    self_hotkey: str,
    nonce_store: http_auth.NonceStore,
    authorize: Authorizer | None = None,
) -> str:
    """Verify a signed request and return the caller's hotkey, or raise :class:`AuthFailure`
    (:class:`ClockRefusal` when its signature verifies and only the time it was signed at is refused).

    ``body`` must be the raw received bytes; ``target`` the path with query as received. Replays
    are refused through ``nonce_store`` (share one store across processes for multi-worker servers).
    """
    now_ns = freshness_clock_ns()

    def verify(store: http_auth.NonceStore, at_ns: int) -> http_auth.Caller:
        return http_auth.verify(
            headers,
            body,
            method=method,
            path=target,
            self_hotkey_ss58=self_hotkey,
            max_age=MAX_REQUEST_AGE_S,
            allowed_skew=ALLOWED_CLOCK_SKEW_S,
            nonce_store=store,
            now_ns=at_ns,
        )

    try:
        caller = verify(nonce_store, now_ns)
    except http_auth.StaleRequest:
        # The nonce the SDK judged: of a header sent twice, the last (its lower-cased dict), never one
        # it did not read, which may not be a number.
        nonce = int({key.lower(): value for key, value in headers.items()}[http_auth.HEADER_NONCE.lower()])
        if not 0 <= nonce < 2**63:  # the signer's time.time_ns(): hundreds of digits overflow a float here
            no_time = f"authentication failed: {http_auth.HEADER_NONCE} is no time (unix nanoseconds, 64 bits)"
            raise AuthFailure(401, no_time) from None
        offset_s = (nonce - now_ns) / 1e9
        refusal = _clock_refusal(offset_s, now_ns)
        # The SDK judges the time before the signature: checked here, at the request's own time
        # and recording nothing, so that only a request its hotkey signed is said to be one.
        try:
            signer = verify(_UNRECORDED, nonce)
        except http_auth.AuthError:
            raise AuthFailure(401, refusal) from None
        raise ClockRefusal(refusal, signer.hotkey_ss58, nonce, offset_s) from None
    except http_auth.AuthError as error:
        raise AuthFailure(401, f"authentication failed: {error}") from None
    if authorize is not None:
        authorize(caller.hotkey_ss58)
    return caller.hotkey_ss58


def freshness_clock_ns() -> int:
    """The clock (unix ns) this process judges signed requests' freshness by: the host's wall clock,
    whatever clock a service is given for its own rules (tests, the subnet simulation)."""
    return time.time_ns()


class _Unrecorded:
    """A nonce store that takes every nonce and keeps none: a signature checked, not a request served."""

    def check_and_store(self, hotkey_ss58: str, nonce_ns: int) -> bool:
        return True


_UNRECORDED = _Unrecorded()


def _clock_refusal(offset_s: float, now_ns: int) -> str:
    """Why a request signed ``offset_s`` seconds ahead of this server's clock (negative: behind)
    was refused, for its sender's operator: by how much, which way, the window and the cure (the
    SDK's own words say only that the nonce is stale, which reads like a bad signature)."""
    way = "ahead of" if offset_s > 0 else "behind"
    server_time = time.strftime("%H:%M:%S", time.gmtime(now_ns / 1e9))
    return (
        f"authentication failed: the request was signed {abs(offset_s):.1f} s {way} this server's clock "
        f"({server_time} UTC here; {ALLOWED_CLOCK_SKEW_S:g} s ahead to {MAX_REQUEST_AGE_S:g} s behind accepted): "
        f"sync the sender's clock {CLOCK_CURE}; if it is synced, this server's is off: tell its operator"
    )


def clock_refused(offset_s: float | None, halved: bool = False) -> bool:
    """Whether requests signed by a clock ``offset_s`` seconds ahead of their receiver's (negative:
    behind) are refused; with ``halved``, when they are outside half of each end of the window (the
    other half left to the receiver's own offset from the clock ``offset_s`` was measured against:
    CLOCK_MARGIN_S ahead, CLOCK_AGE_MARGIN_S behind). False when it is unknown."""
    low, high = (-CLOCK_AGE_MARGIN_S, CLOCK_MARGIN_S) if halved else (-MAX_REQUEST_AGE_S, ALLOWED_CLOCK_SKEW_S)
    return offset_s is not None and not low <= offset_s <= high


def clock_offset_text(offset_s: float, whose: str) -> str:
    """``this host's clock is 120.0 s ahead of WHOSE`` (``behind`` for a negative offset), and that
    WHOSE is the one off when this host's is synced: an API whose clock is off refuses every caller."""
    way = "ahead of" if offset_s > 0 else "behind"
    return (
        f"this host's clock is {abs(offset_s):.1f} s {way} {whose} "
        f"(if timedatectl says this host's is synchronized, {whose} is off)"
    )


class RecentNonces:
    """A process's ``btauth/1`` replay store (:class:`http_auth.NonceStore`) that forgets a nonce once
    it is ``retention_s`` older than the newest nonce accepted, and refuses the nonces it has
    forgotten (:class:`AuthFailure`, saying why).

    The SDK's store forgets after ``retention_s`` of the monotonic clock while freshness is judged
    by the wall clock: after a step back of the wall clock a request it has forgotten is fresh
    again, and was served twice. Counted from the nonces, nothing forgotten is ever accepted; no
    nonce reaches it more than ALLOWED_CLOCK_SKEW_S ahead of this host's clock, so it refuses none
    of the requests that clock finds fresh unless the clock stepped back more than ``retention_s``."""

    def __init__(self, retention_s: float):
        self.retention = retention_s  # http_auth.verify checks that it covers the freshness window
        self._seen: set[tuple[str, int]] = set()
        self._by_age: list[tuple[int, str]] = []  # a heap, oldest nonce first
        self._newest = 0
        self._lock = threading.Lock()

    def check_and_store(self, hotkey_ss58: str, nonce_ns: int) -> bool:
        """Record (hotkey, nonce); False when it was recorded already (a replay)."""
        with self._lock:
            self._newest = max(self._newest, nonce_ns)
            oldest_kept = self._newest - int(self.retention * 1e9)
            while self._by_age and self._by_age[0][0] < oldest_kept:
                nonce, hotkey = heapq.heappop(self._by_age)
                self._seen.discard((hotkey, nonce))
            if nonce_ns < oldest_kept:
                raise AuthFailure(
                    401,
                    f"authentication failed: the request was signed {(self._newest - nonce_ns) / 1e9:.1f} s before "
                    f"the newest request this server accepted, and it remembers requests for {self.retention:g} s: "
                    "a clock stepped back (this server's or the sender's); sign it again once the clocks are right",
                )
            if (hotkey_ss58, nonce_ns) in self._seen:
                return False
            self._seen.add((hotkey_ss58, nonce_ns))
            heapq.heappush(self._by_age, (nonce_ns, hotkey_ss58))
            return True


@dataclass(frozen=True)
class SignedRequest:
    """A request ready to send: the exact body bytes and the headers that sign them."""

    method: str
    url: str
    body: bytes
    headers: dict[str, str]


def sign_request(wallet, method: str, url: str, receiver_hotkey: str, payload: Any | None = None) -> SignedRequest:
    """Serialize ``payload`` as JSON once and sign those exact bytes for ``receiver_hotkey``."""
    body = b"" if payload is None else json.dumps(payload, separators=(",", ":")).encode()
    parts = urlsplit(url)
    headers = http_auth.sign(
        wallet,
        method=method,
        path=request_target(parts.path or "/", parts.query),
        body=body,
        receiver_ss58=receiver_hotkey,
    )
    if payload is not None:
        headers["Content-Type"] = "application/json"
    return SignedRequest(method=method.upper(), url=url, body=body, headers=headers)
