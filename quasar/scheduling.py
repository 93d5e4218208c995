"""Which submissions a validator evaluates next (the API's work endpoint), as pure functions.

An evaluation costs a validator about 25 s of a GPU; a subnet's miners may submit far more than
its validators can evaluate, so the work goes where it can change the ranking:

1. **Supersession**: a hotkey's newer ready submission supersedes its older ones that no validator
   whose report counts (quasar/consensus.py) has reported on yet (they are never handed out again;
   the miner sees which one replaced them). One that such a validator reported on stays, so that
   the others can complete its consensus; a report that counts for nothing completes none.
2. **Upper bound**: a submission can never score more than ``claimed × league multiplier``
   (scoring takes ``min(claimed, measured)``). One whose bound is below the current fourth place's
   score even within the tie margin ε (an earlier submission scoring at least ``fourth / (1 + ε)``
   can take the place, quasar/scoring.py) cannot place: it is *deferred*, handed out only when
   nothing that could place is waiting (in a batch: after every one that could place, so that no
   device idles while work waits).
   So is every submission, for the rest of the round, of a hotkey whose submission this round the
   validators found to be a copy (quasar/originality.py): a copy is never ranked, and a copier
   claiming more than the leader would otherwise be evaluated first, every time.
3. **Fairness**: no hotkey gets a second evaluation from a validator in a round while another
   hotkey waits for its first (then a third while another waits for its second, and so on), so a
   few hotkeys submitting at their limit cannot starve the others.
4. **Order**: among those, first a submission other validators whose reports count have reported
   on (its consensus waits for this validator's report: without it nothing of that hotkey ranks),
   then the highest upper bound, then the oldest (ready time, then id).
5. **Rounds**: a submission is handed out in its round and the next (``SCHEDULED_ROUNDS``); older
   ones can no longer change the ranking of the round being played.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from quasar import scoring

SCHEDULED_ROUNDS = 2


def first_scheduled_round(round_id: int) -> int:
    """Rule 5: the oldest round whose submissions are still handed out while round ``round_id`` runs."""
    return max(0, round_id - SCHEDULED_ROUNDS + 1)


def upper_bound(claimed_tokens_per_sec: float, target_sequence_length: int) -> float:
    """The most a submission can score: its claim times its league's multiplier."""
    return claimed_tokens_per_sec * scoring.league_for(target_sequence_length).multiplier


@dataclass(frozen=True)
class Queued:
    """A ready submission, as the schedule sees it. ``reported``: some validator whose report counts
    reported on it."""

    submission_id: int
    hotkey: str
    ready_at: float
    target_sequence_length: int
    claimed_tokens_per_sec: float
    reported: bool

    @property
    def upper_bound(self) -> float:
        return upper_bound(self.claimed_tokens_per_sec, self.target_sequence_length)

    @property
    def age_key(self) -> tuple[float, int]:
        return (self.ready_at, self.submission_id)

    @property
    def order_key(self) -> tuple[bool, float, float, int]:
        """Rule 4: reported on by others first, then the highest upper bound, then the oldest."""
        return (not self.reported, -self.upper_bound, *self.age_key)


def superseded(ready: Iterable[Queued]) -> dict[int, int]:
    """Rule 1: each ready submission that no validator reported on and that a newer ready one of its
    hotkey (by ready time, then id) supersedes, mapped to the hotkey's newest."""
    newest: dict[str, Queued] = {}
    by_hotkey: dict[str, list[Queued]] = {}
    for item in ready:
        by_hotkey.setdefault(item.hotkey, []).append(item)
        if item.hotkey not in newest or item.age_key > newest[item.hotkey].age_key:
            newest[item.hotkey] = item
    return {
        item.submission_id: newest[hotkey].submission_id
        for hotkey, items in by_hotkey.items()
        for item in items
        if item is not newest[hotkey] and not item.reported
    }


def fourth_place(scores: Iterable[float]) -> float | None:
    """The fourth highest of the placed entries' weighted ``scores``; None while fewer than four
    placed (then every submission could place)."""
    ordered = sorted(scores, reverse=True)
    return ordered[3] if len(ordered) >= 4 else None


@dataclass(frozen=True)
class Standing:
    """What rule 2 reads of the round now: the fourth place's weighted score (None while fewer than
    four placed), the hotkeys found copying in it, and the ranking's tie margin."""

    fourth: float | None = None
    copiers: frozenset[str] = frozenset()
    epsilon: float = scoring.DEFAULT_EPSILON

    @property
    def least_placing(self) -> float | None:
        """The least score that could still place: within the tie margin of the fourth place's
        (None while every score could)."""
        return None if self.fourth is None else scoring.tie_threshold(self.fourth, self.epsilon)


def could_place(item: Queued, standing: Standing) -> bool:
    """Rule 2: whether ``item`` could place: its hotkey was not found copying this round, and its
    upper bound reaches the fourth place's score within the tie margin."""
    least = standing.least_placing
    return item.hotkey not in standing.copiers and (least is None or item.upper_bound >= least)


def order_work(
    candidates: Sequence[Queued], evaluations_this_round: Mapping[str, int], standing: Standing, limit: int
) -> list[Queued]:
    """Up to ``limit`` of ``candidates`` (ready, not superseded, neither reported on nor held by this
    validator; ``reported``: another validator reported on it) in the order this validator should
    evaluate them (rules 2 to 4): every one that could place, then, once none of those is left
    waiting, the deferred. A batch is the same as ``limit`` fetches of one: a validator with more
    free devices than placeable work gets deferred work for the rest, not idle devices.
    ``evaluations_this_round``: per hotkey, the submissions this validator took this round."""
    placeable: list[Queued] = []
    deferred: list[Queued] = []
    for item in candidates:
        (placeable if could_place(item, standing) else deferred).append(item)
    taken = dict(evaluations_this_round)
    chosen = fair_order(placeable, taken, limit)
    return chosen + fair_order(deferred, taken, limit - len(chosen))


def fair_order(pool: Sequence[Queued], taken: dict[str, int], limit: int) -> list[Queued]:
    """Up to ``limit`` of ``pool`` by rules 3 and 4: the hotkey with the fewest evaluations
    (``taken``, counted up here for each one chosen) first, each hotkey's own in rule 4's order."""
    by_hotkey: dict[str, list[Queued]] = {}
    for item in sorted(pool, key=lambda item: item.order_key):
        by_hotkey.setdefault(item.hotkey, []).append(item)
    heap = [(taken.get(hotkey, 0), items[0].order_key, hotkey) for hotkey, items in by_hotkey.items()]
    heapq.heapify(heap)
    chosen: list[Queued] = []
    while heap and len(chosen) < limit:
        count, _, hotkey = heapq.heappop(heap)
        items = by_hotkey[hotkey]
        chosen.append(items.pop(0))
        taken[hotkey] = count + 1
        if items:
            heapq.heappush(heap, (count + 1, items[0].order_key, hotkey))
    return chosen


def deferred_reason(item: Queued, standing: Standing) -> str:
    """Why ``item`` is deferred (it cannot place under ``standing``), for the miner."""
    if item.hotkey in standing.copiers:
        return (
            "deferred: a submission of this hotkey in this round is a copy of another hotkey's; its "
            "submissions wait, for the rest of the round, until nothing that could place is waiting"
        )
    return (
        f"deferred: its upper bound ({item.claimed_tokens_per_sec:,.0f} tok/s claimed x "
        f"{scoring.league_for(item.target_sequence_length).multiplier:g}, {item.upper_bound:,.0f}) is below "
        f"the fourth place's score ({standing.fourth:,.0f}) even within the tie margin of "
        f"{standing.epsilon * 100:g}%; validators evaluate it only when nothing that could "
        f"place is waiting"
    )
