"""The work schedule's pure functions (quasar/scheduling.py) against slow, obviously-correct
references on random queues: supersession (rule 1) and the order of a batch (rules 2 to 4), whose
fast path keeps a heap of hotkeys and carries the counts along."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quasar import scheduling

# docs/rules.md's leagues: the multiplier of a few target lengths.
MULTIPLIERS = {1000: 0.5, 250_000: 0.75, 700_000: 2.0, 1_000_000: 3.0, 4_000_000: 3.0}
HOTKEYS = ("a", "b", "c", "d")


@st.composite
def queues(draw, max_size: int = 14) -> list[scheduling.Queued]:
    """Ready submissions of a few hotkeys with distinct ids, ready times and claims often equal."""
    ids = draw(st.lists(st.integers(1, 200), unique=True, max_size=max_size))
    return [
        scheduling.Queued(
            submission_id,
            draw(st.sampled_from(HOTKEYS)),
            float(draw(st.integers(0, 5))),
            draw(st.sampled_from(sorted(MULTIPLIERS))),
            float(draw(st.integers(1, 6))),
            draw(st.booleans()),
        )
        for submission_id in ids
    ]


standings = st.builds(
    scheduling.Standing,
    fourth=st.none() | st.floats(1.0, 40.0),
    copiers=st.frozensets(st.sampled_from(HOTKEYS), max_size=2),
    epsilon=st.sampled_from([0.0, 0.01, 0.05]),
)
taken_counts = st.dictionaries(st.sampled_from(HOTKEYS), st.integers(0, 3))


def reference_superseded(ready: list[scheduling.Queued]) -> dict[int, int]:
    """Rule 1 as written: one that no validator reported on is superseded when a newer one of its
    hotkey (ready time, then id) exists, and then by the newest of its hotkey."""
    superseded = {}
    for item in ready:
        same = [other for other in ready if other.hotkey == item.hotkey]
        newest = max(same, key=lambda other: (other.ready_at, other.submission_id))
        if not item.reported and newest is not item:
            superseded[item.submission_id] = newest.submission_id
    return superseded


def reference_order(
    candidates: list[scheduling.Queued], taken: dict[str, int], standing: scheduling.Standing, limit: int
) -> list[scheduling.Queued]:
    """Rules 2 to 4 one pick at a time: of what is left, anything that could place before anything
    deferred; among those, the hotkey this validator took fewest of this round, then reported on
    by others, then the highest bound, then the oldest."""
    left, counts = list(candidates), dict(taken)
    chosen: list[scheduling.Queued] = []
    while left and len(chosen) < limit:

        def key(item: scheduling.Queued) -> tuple:
            bound = item.claimed_tokens_per_sec * MULTIPLIERS[item.target_sequence_length]
            placeable = item.hotkey not in standing.copiers and (
                standing.fourth is None or bound >= standing.fourth / (1 + standing.epsilon)
            )
            return (
                not placeable,
                counts.get(item.hotkey, 0),
                not item.reported,
                -bound,
                item.ready_at,
                item.submission_id,
            )

        pick = min(left, key=key)
        chosen.append(pick)
        left.remove(pick)
        counts[pick.hotkey] = counts.get(pick.hotkey, 0) + 1
    return chosen


@settings(max_examples=300, deadline=None)
@given(queues())
def test_supersession_matches_the_rule_written_out(ready):
    assert scheduling.superseded(ready) == reference_superseded(ready)


@settings(max_examples=400, deadline=None)
@given(queues(), taken_counts, standings, st.integers(0, 16))
def test_the_heap_ordered_batch_matches_one_pick_at_a_time_by_the_rules(candidates, taken, standing, limit):
    fast = scheduling.order_work(candidates, taken, standing, limit)
    slow = reference_order(candidates, taken, standing, limit)
    assert [item.submission_id for item in fast] == [item.submission_id for item in slow]
