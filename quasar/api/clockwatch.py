"""The API's own clock, judged by its callers': when several hotkeys are refused for the time they
signed at, by about the same offset and on the same side, the clock off is most likely this host's.

Each refused caller is told that its request was signed so many seconds off this API's clock, and
a miner or validator whose clock NTP keeps cannot tell from that whose clock is wrong. An honest
fleet's clocks agree within a second; one hotkey off is that hotkey's clock. So the API says at
WARNING, once, then at most every REPEAT_EVERY_S for each side (ahead, behind), when WITNESSES or
more hotkeys were refused within ``window_s``, their latest offsets on one side lying within a
span of ALLOWED_CLOCK_SKEW_S (docs/api.md). Only a refusal for the time alone counts: its
signature verified (:class:`auth.ClockRefusal`) and its hotkey may use the route (registered; a
validator permit on validators' routes), so a forger counts nothing; a hotkey counts once, by its
refusal of the newest nonce, however often it asks. A request is not proof of when it was sent:
anyone who saw one can send it again, refused then as stale by as much as it waited. Counted by
the newest nonce, such a replay of a hotkey's older request cannot replace its latest refusal and
hide the offset it agrees on; requests seen and replayed can still be counted, so the warning
says "likely". Of several worker processes, the first alone watches (quasar.api.__main__.worker_app).
"""

from __future__ import annotations

import bisect
import logging
import statistics
import threading
import time
from collections.abc import Callable

from quasar import auth
from quasar.chain import ChainError
from quasar.log import REPEAT_EVERY_S

logger = logging.getLogger(__name__)

# How many distinct hotkeys refused alike make it this host's clock, not theirs.
WITNESSES = 3


class ClockWatch:
    """Refusals for the clock, by hotkey, and the warning they make when they agree (see the module)."""

    def __init__(
        self,
        window_s: float = REPEAT_EVERY_S,
        every_s: float = REPEAT_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.window_s = window_s
        self.every_s = every_s
        self.clock = clock
        self._latest: dict[str, tuple[int, float, float]] = {}  # hotkey -> (nonce, offset s, when refused)
        self._said: dict[str, float] = {}  # "ahead of" / "behind" -> when said
        self._lock = threading.Lock()  # the API's handlers run in threads

    def refused(self, refusal: auth.ClockRefusal, authorize: auth.Authorizer) -> None:
        """Count ``refusal`` when ``authorize`` lets its hotkey use the route it asked for (it may
        read the chain: call it off the event loop), and say what the refusals counted show."""
        try:
            authorize(refusal.hotkey)
        except (auth.AuthFailure, ChainError):
            return
        ahead = refusal.offset_s > 0
        with self._lock:
            now = self.clock()
            self._latest = {key: seen for key, seen in self._latest.items() if now - seen[2] <= self.window_s}
            counted = self._latest.get(refusal.hotkey)
            if counted is not None and refusal.nonce_ns <= counted[0]:
                return  # signed before the refusal counted for its hotkey: a replay of an older request
            self._latest[refusal.hotkey] = (refusal.nonce_ns, refusal.offset_s, now)
            side = sorted(offset for _, offset, _ in self._latest.values() if (offset > 0) == ahead)
            agreeing = _largest_agreeing(side)
            way = "ahead of" if ahead else "behind"
            said = self._said.get(way)
            if len(agreeing) < WITNESSES or (said is not None and now - said < self.every_s):
                return
            self._said[way] = now
        logger.warning(
            "requests of %d hotkeys were refused as signed about %.1f s %s this API's clock: this host's clock is "
            "likely off (timedatectl set-ntp true)",
            len(agreeing),
            abs(statistics.median(agreeing)),
            way,
        )


def _largest_agreeing(offsets: list[float]) -> list[float]:
    """The most of the sorted ``offsets`` lying within ALLOWED_CLOCK_SKEW_S of each other: a
    cluster, which offsets elsewhere can neither hide nor move (a median of them all could be)."""
    best: list[float] = []
    for start, low in enumerate(offsets):
        end = bisect.bisect_right(offsets, low + auth.ALLOWED_CLOCK_SKEW_S)
        if end - start > len(best):
            best = offsets[start:end]
    return best
