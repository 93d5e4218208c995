"""The work schedule (quasar/scheduling.py) through the real API on 127.0.0.1 (SQLite and PostgreSQL):
supersession, the upper bound, fairness across hotkeys per validator and round, the order, several
workers of one validator, and what the miner's status says of each."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

from api_fixtures import FORK, commit_of, refused
from quasar import scheduling, scoring
from quasar.api.client import ApiClient, Claim
from quasar.localnet.host import make_wallet

MILLION = 1_000_000  # the 1M league: multiplier 3


def ids(batch) -> list[int]:
    return [item.submission_id for item in batch.items]


def test_a_newer_submission_supersedes_the_older_ones_no_validator_reported_on(start_api):
    api = start_api()
    a, v1, v2 = api.client("a"), api.client("v1"), api.client("v2")
    first = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    assert ids(v1.fetch_work()) == [first.submission_id]  # v1 starts on it
    second = a.submit_kernel(Claim(FORK, commit_of(2), 1e5), MILLION)
    # v2 gets only the newest; the first is superseded, even though v1 holds a lease on it.
    assert ids(v2.fetch_work()) == [second.submission_id]
    old = a.submission_status(first.submission_id)
    assert (old.state, old.superseded_by) == ("superseded", second.submission_id)
    assert old.state_reason.startswith(f"superseded by submission {second.submission_id}, a newer one of this hotkey")
    refused(
        lambda: v1.report(first.submission_id, "passed", True, True, 1e5),
        409,
        f"superseded by submission {second.submission_id}",
    )
    # One a validator reported on stays, so that the others can complete its consensus.
    v2.report(second.submission_id, "passed", True, True, 1e5)
    third = a.submit_kernel(Claim(FORK, commit_of(3), 2e5), MILLION)
    # v1 completes the consensus on the second first, though the third claims more.
    assert ids(v1.fetch_work()) == [second.submission_id, third.submission_id]
    assert a.submission_status(second.submission_id).state != "superseded"
    # A commit that was superseded is still its miner's: another hotkey submitting it is a copy.
    refused(
        lambda: api.client("b").submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION), 409, "a copy is not accepted"
    )


def register_miners(api, tmp_path, count: int) -> list[ApiClient]:
    clients = []
    for n in range(count):
        wallet = make_wallet(tmp_path / "miners", f"m{n}")
        api.chain.register_wallet(wallet)
        clients.append(ApiClient(api.url, wallet, api_hotkey=api.hotkey))
    return clients


def test_a_submission_that_cannot_place_waits_until_nothing_that_could_place_does(start_api, tmp_path):
    api = start_api()
    v1, v2 = api.client("v1"), api.client("v2")
    miners = register_miners(api, tmp_path, 6)
    try:
        placed = [
            miner.submit_kernel(Claim(FORK, commit_of(n + 1), 1e5 * (n + 1)), MILLION)
            for n, miner in enumerate(miners[:4])
        ]  # scores 3e5, 6e5, 9e5, 1.2e6: fourth place 3e5
        v1.fetch_work()
        for submission in placed:
            v1.report(submission.submission_id, "passed", True, True, submission_claim(api, submission))
        api.chain.advance(1)  # the leaderboard of the next block has the reports
        slow = miners[4].submit_kernel(Claim(FORK, commit_of(10), 9e4), MILLION)  # at most 2.7e5: cannot place
        fast = miners[5].submit_kernel(Claim(FORK, commit_of(11), 1.1e5), MILLION)  # at most 3.3e5: could
        status = miners[4].submission_status(slow.submission_id)
        assert status.state == "deferred" and status.state_reason == (
            "deferred: its upper bound (90,000 tok/s claimed x 3, 270,000) is below the fourth place's score "
            "(300,000) even within the tie margin of 1%; validators evaluate it only when nothing that could place "
            "is waiting"
        )
        assert miners[5].submission_status(fast.submission_id).state == "queued"
        assert ids(v1.fetch_work(limit=1)) == [fast.submission_id]  # not the deferred one beside it
        # Nothing that could place is waiting for v1 any more: now the deferred one.
        assert ids(v1.fetch_work(limit=1)) == [slow.submission_id]
        # v2 has not evaluated the placed four: first those (v1 reported on them: their consensus waits
        # for v2), by upper bound; then fast, and the deferred one last.
        assert ids(v2.fetch_work(limit=5)) == [*(p.submission_id for p in reversed(placed)), fast.submission_id]
        assert ids(v2.fetch_work(limit=10)) == [slow.submission_id]
    finally:
        for miner in miners:
            miner.close()


def test_a_batch_fills_the_free_devices_with_deferred_work_once_nothing_that_could_place_waits(start_api, tmp_path):
    """A validator fetching for 3 free devices while one submission that could place and two that
    cannot wait gets all three, the one that could place first. Otherwise two of its GPUs idle,
    with work waiting, until its next fetch: on a subnet whose leaders submit all the time, a
    share of every validator's GPU time lost to the schedule."""
    api = start_api()
    v1 = api.client("v1")
    miners = register_miners(api, tmp_path, 7)
    try:
        placed = [
            miner.submit_kernel(Claim(FORK, commit_of(n + 1), 1e5 * (n + 1)), MILLION)
            for n, miner in enumerate(miners[:4])
        ]  # fourth place 3e5
        v1.fetch_work()
        for submission in placed:
            v1.report(submission.submission_id, "passed", True, True, submission_claim(api, submission))
        api.chain.advance(1)
        slow = [miners[4 + n].submit_kernel(Claim(FORK, commit_of(10 + n), 5e4 + n), MILLION) for n in range(2)]
        fast = miners[6].submit_kernel(Claim(FORK, commit_of(12), 1.1e5), MILLION)  # could place
        # The deferred two after it, the higher bound first.
        assert ids(v1.fetch_work(limit=3)) == [fast.submission_id, slow[1].submission_id, slow[0].submission_id]
    finally:
        for miner in miners:
            miner.close()


def submission_claim(api, submission) -> float:
    return api.client("a").submission_status(submission.submission_id).claimed_tokens_per_sec


def test_no_hotkey_gets_a_second_evaluation_while_another_waits_for_its_first_in_the_round(start_api):
    api = start_api(round_blocks=50)
    a, b, c, v1, v2 = (api.client(name) for name in ("a", "b", "c", "v1", "v2"))
    # a has two submissions waiting for v1 (the older one reported by v2, so not superseded).
    older = a.submit_kernel(Claim(FORK, commit_of(1), 9e5), MILLION)
    v2.fetch_work()
    v2.report(older.submission_id, "passed", True, True, 9e5)
    newer = a.submit_kernel(Claim(FORK, commit_of(2), 8e5), MILLION)
    low_b = b.submit_kernel(Claim(FORK, commit_of(3), 1e5), MILLION)
    low_c = c.submit_kernel(Claim(FORK, commit_of(4), 2e5), MILLION)
    # a's best bound first; a's second only after b and c had their first; among b and c the higher bound.
    assert [ids(v1.fetch_work(limit=1)) for _ in range(4)] == [
        [older.submission_id],
        [low_c.submission_id],
        [low_b.submission_id],
        [newer.submission_id],
    ]
    # In one batch the same order.
    again = a.submit_kernel(Claim(FORK, commit_of(5), 9.5e5), MILLION)
    fresh_b = b.submit_kernel(Claim(FORK, commit_of(6), 1e5), MILLION)
    # a has had two evaluations from v1 this round, b one: b's comes first despite its lower bound.
    assert ids(v1.fetch_work(limit=5)) == [fresh_b.submission_id, again.submission_id]
    # The next round starts everyone at zero again: the highest bound first.
    api.chain.advance(50)
    later_a = a.submit_kernel(Claim(FORK, commit_of(7), 9e5), MILLION)
    later_b = b.submit_kernel(Claim(FORK, commit_of(8), 1e5), MILLION)
    assert ids(v1.fetch_work(limit=1)) == [later_a.submission_id]
    assert ids(v1.fetch_work(limit=1)) == [later_b.submission_id]


def test_a_submission_another_validator_reported_on_goes_first_so_its_consensus_completes(start_api):
    """Without the rule, v2 would always take a's newest (its claim grows), v1 the one after, and no
    submission of a would ever have two reports: the quorum (two validators here) never met."""
    api = start_api(quorum_min_validators=2, quorum_stake_share=0.6)
    a, b, v1, v2 = api.client("a"), api.client("b"), api.client("v1"), api.client("v2")
    first = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    assert ids(v1.fetch_work(limit=1)) == [first.submission_id]
    v1.report(first.submission_id, "passed", True, True, 1e5)
    newer = a.submit_kernel(Claim(FORK, commit_of(2), 3e5), MILLION)  # claims three times more
    other = b.submit_kernel(Claim(FORK, commit_of(3), 5e5), MILLION)
    # The one v1 reported on first, though b's and a's newer claim more; then b's (a had its turn).
    assert ids(v2.fetch_work(limit=3)) == [first.submission_id, other.submission_id, newer.submission_id]
    v2.report(first.submission_id, "passed", True, True, 1e5)
    api.chain.advance(1)
    assert a.submission_status(first.submission_id).state == "passed"


def test_a_hotkey_caught_copying_waits_behind_the_others_for_the_rest_of_the_round(start_api):
    api = start_api(round_blocks=50)
    a, c, v1 = api.client("a"), api.client("c"), api.client("v1")
    original = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    copy = c.submit_kernel(Claim(FORK, commit_of(2), 1.03e5), MILLION)
    v1.fetch_work(limit=2)
    v1.report(original.submission_id, "passed", True, True, 1e5, content_hash="ab" * 32)
    v1.report(copy.submission_id, "passed", True, True, 1.03e5, content_hash="ab" * 32)  # the same kernel files
    api.chain.advance(1)
    assert c.submission_status(copy.submission_id).state == "copy"
    # c claims far more than a now: c still waits, a goes first.
    again = c.submit_kernel(Claim(FORK, commit_of(3), 9e5), MILLION)
    honest = a.submit_kernel(Claim(FORK, commit_of(4), 2e5), MILLION)
    status = c.submission_status(again.submission_id)
    assert status.state == "deferred" and "is a copy of another hotkey's" in status.state_reason
    assert ids(v1.fetch_work(limit=1)) == [honest.submission_id]
    assert ids(v1.fetch_work(limit=1)) == [again.submission_id]  # nothing else waits: now c's
    api.chain.advance(50)  # the next round: c is judged on its own again
    fresh = c.submit_kernel(Claim(FORK, commit_of(5), 9e5), MILLION)
    assert c.submission_status(fresh.submission_id).state == "queued"


def test_a_submission_lapses_two_rounds_on_and_the_order_breaks_ties_by_age(start_api):
    api = start_api(round_blocks=50)
    a, b, v1 = api.client("a"), api.client("b"), api.client("v1")
    first = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    second = b.submit_kernel(Claim(FORK, commit_of(2), 1e5), MILLION)  # the same bound: the older goes first
    api.chain.advance(50)  # the next round: still handed out
    assert ids(v1.fetch_work(limit=1)) == [first.submission_id]
    api.chain.advance(50)  # two rounds on: no more
    assert ids(v1.fetch_work()) == []
    lapsed = b.submission_status(second.submission_id)
    assert lapsed.state == "lapsed" and "round 0 and the next are over" in lapsed.state_reason


def test_several_workers_of_one_validator_fetch_disjoint_leases(start_api, wallets):
    api = start_api()
    submitted = {
        api.client(name).submit_kernel(Claim(FORK, commit_of(n + 1), 1e5), MILLION).submission_id
        for n, name in enumerate(("a", "b", "c"))
    }
    workers = [ApiClient(api.url, wallets["v1"], api_hotkey=api.hotkey) for _ in range(3)]  # one hotkey
    try:
        with ThreadPoolExecutor(3) as pool:
            batches = list(pool.map(lambda worker: ids(worker.fetch_work(limit=1)), workers))
    finally:
        for worker in workers:
            worker.close()
    assert sorted(batch[0] for batch in batches) == sorted(submitted)


def test_the_rules_on_their_own():
    queued = [
        scheduling.Queued(1, "a", 1.0, MILLION, 10.0, reported=False),
        scheduling.Queued(2, "a", 2.0, 1000, 10.0, reported=True),
        scheduling.Queued(3, "a", 3.0, MILLION, 5.0, reported=False),
        scheduling.Queued(4, "b", 1.0, MILLION, 1.0, reported=False),
    ]
    assert scheduling.superseded(queued) == {1: 3}  # 2 has a report; b's only one stays
    assert scheduling.upper_bound(10.0, 1000) == 5.0 and queued[0].upper_bound == 30.0
    assert scheduling.fourth_place([5.0, 1.0, 9.0]) is None and scheduling.fourth_place([5, 1, 9, 7, 2]) == 2
    waiting = [queued[1], queued[2], queued[3]]
    fourth_at_4 = scheduling.Standing(fourth=4.0)
    # Fourth place at 4.0: b (bound 3) cannot place and waits for a's; of a's two, 2 first: another
    # validator reported on it (its consensus waits), though 3's bound is higher.
    assert [q.submission_id for q in scheduling.order_work(waiting, {}, fourth_at_4, 5)] == [2, 3, 4]
    assert [q.submission_id for q in scheduling.order_work(waiting, {}, fourth_at_4, 2)] == [2, 3]
    assert [q.submission_id for q in scheduling.order_work(waiting, {"a": 1}, scheduling.Standing(), 5)] == [4, 2, 3]
    assert [q.submission_id for q in scheduling.order_work([queued[3]], {}, fourth_at_4, 5)] == [4]
    assert scheduling.order_work(waiting, {}, scheduling.Standing(), 0) == []
    # Among the reported, the highest bound first; the unreported after them.
    helped = scheduling.Queued(9, "a", 9.0, MILLION, 1.0, reported=True)
    assert [q.submission_id for q in scheduling.order_work([*waiting, helped], {}, scheduling.Standing(), 5)] == [
        2,
        4,
        9,
        3,
    ]
    # a was found copying this round: whatever it claims, b goes first, and a only once b is done.
    caught = scheduling.Standing(copiers=frozenset({"a"}))
    assert [q.submission_id for q in scheduling.order_work(waiting, {}, caught, 5)] == [4, 2, 3]
    assert [q.submission_id for q in scheduling.order_work(waiting[:2], {}, caught, 5)] == [2, 3]
    assert scheduling.deferred_reason(queued[2], caught).startswith("deferred: a submission of this hotkey")


@pytest.mark.parametrize("limit", [1, 3, 10])
@pytest.mark.parametrize("fourth", [None, 9.0])  # 9.0: the bounds 3 and 6 cannot place
def test_order_matches_one_pick_at_a_time(limit, fourth):
    """A batch of ``limit`` is the same as ``limit`` fetches of one (the counts carried along)."""
    items = [
        scheduling.Queued(n, f"h{n % 3}", float(n), MILLION, float((n * 7) % 5 + 1), reported=False) for n in range(12)
    ]
    standing = scheduling.Standing(fourth=fourth)
    batch = scheduling.order_work(items, {"h0": 1}, standing, limit)
    taken, remaining, one_by_one = {"h0": 1}, list(items), []
    for _ in range(min(limit, len(items))):
        [pick] = scheduling.order_work(remaining, taken, standing, 1)
        one_by_one.append(pick)
        remaining.remove(pick)
        taken[pick.hotkey] = taken.get(pick.hotkey, 0) + 1
    assert batch == one_by_one


def placing_result(submission_id: int, score: float, submitted_at: float) -> scoring.Result:
    """A correct result scoring ``score`` in the 1M league (multiplier 3)."""
    tokens_per_sec = score / 3
    return scoring.Result(
        f"h{submission_id}", submission_id, submitted_at, MILLION, tokens_per_sec, tokens_per_sec, True, True
    )


def places_at_its_bound(item: scheduling.Queued, placed: list[scoring.Result], epsilon: float) -> bool:
    """The slow reference for rule 2: rank ``item`` as if it measured all it claims and came before
    everyone (its best case), and see whether it gets a place."""
    best = placing_result(item.submission_id, item.upper_bound, 0.0)
    ranking = scoring.rank([*placed, best], epsilon=epsilon)
    places = scoring.PLACE_SHARES
    return any(p.submission_id == item.submission_id and p.place <= len(places) for p in ranking.placements)


def test_work_that_could_place_through_the_tie_margin_is_not_deferred():
    # An earlier submission within ε of the fourth place takes it (the tie rule): deferring it as
    # "cannot place" would let it lapse under load while the miner is told its bound is too low.
    placed = [placing_result(n, score, float(n)) for n, score in enumerate([400.0, 300.0, 200.0, 100.0], 1)]
    standing = scheduling.Standing(scheduling.fourth_place(r.claimed_tokens_per_sec * 3 for r in placed), epsilon=0.01)
    close = scheduling.Queued(9, "h9", 0.0, MILLION, 99.5 / 3, reported=False)
    assert places_at_its_bound(close, placed, 0.01)
    assert scheduling.could_place(close, standing)
    far = scheduling.Queued(10, "h10", 0.0, MILLION, 98.0 / 3, reported=False)
    assert not places_at_its_bound(far, placed, 0.01) and not scheduling.could_place(far, standing)
    assert "within the tie margin of 1%" in scheduling.deferred_reason(far, standing)


def test_deferred_work_could_never_place_on_random_standings():
    # Rule 2 against its reference: whatever it defers, the ranking would not place even at its bound.
    rng = random.Random()
    for _ in range(400):
        epsilon = rng.choice([0.0, 0.005, 0.01, 0.05])
        scores = [rng.uniform(1.0, 100.0) for _ in range(rng.randint(0, 8))]
        placed = [placing_result(n, score, rng.uniform(1.0, 10.0)) for n, score in enumerate(scores, 1)]
        fourth = scheduling.fourth_place(p.weighted_score for p in scoring.rank(placed, epsilon=epsilon).placements)
        standing = scheduling.Standing(fourth, epsilon=epsilon)
        item = scheduling.Queued(99, "h99", 0.0, MILLION, rng.uniform(0.5, 110.0) / 3, reported=False)
        if places_at_its_bound(item, placed, epsilon):
            assert scheduling.could_place(item, standing), (scores, epsilon, item.upper_bound)


def test_reports_of_a_validator_that_counts_for_nothing_neither_jump_the_queue_nor_stop_supersession(start_api):
    """A miner's own validator hotkey, holding a permit but no stake while others hold some (or one
    deregistered since it reported), counts for nothing in the consensus. Its reports must not put
    its miner's submissions first in every honest validator's queue, nor keep an older one from
    being superseded: there is no consensus they could help complete."""
    api = start_api()
    api.chain.register_wallet(api.wallets["v3"], stake=0.0, validator_permit=True)
    a, b, v1, sybil = api.client("a"), api.client("b"), api.client("v1"), api.client("v3")
    low = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    high = b.submit_kernel(Claim(FORK, commit_of(2), 5e5), MILLION)
    sybil.fetch_work()
    sybil.report(low.submission_id, "passed", True, True, 1e5)
    # b's claim is higher and no report that counts was made on either: b's goes first.
    assert ids(v1.fetch_work(limit=1)) == [high.submission_id]
    newer = a.submit_kernel(Claim(FORK, commit_of(3), 2e5), MILLION)
    assert a.submission_status(low.submission_id).state == "superseded"
    assert ids(v1.fetch_work(limit=2)) == [newer.submission_id]


def test_a_deregistered_miners_submissions_are_handed_to_no_validator(start_api):
    """A miner pruned from the subnet can be given no weight, and its inference server is gone with
    it: evaluating its queued submissions spent validators' GPUs for nothing. Registered again, its
    submission is handed out again."""
    api = start_api()
    a, b, v1 = api.client("a"), api.client("b"), api.client("v1")
    pruned = a.submit_kernel(Claim(FORK, commit_of(1), 1e5), MILLION)
    kept = b.submit_kernel(Claim(FORK, commit_of(2), 1e5), MILLION)
    api.chain.deregister(api.wallets["a"].hotkey.ss58_address)
    assert ids(v1.fetch_work()) == [kept.submission_id]
    api.chain.register_wallet(api.wallets["a"])
    assert ids(v1.fetch_work()) == [pruned.submission_id]
