"""The validators' consensus (quasar/consensus.py): stake-weighted, with a quorum, against lying
validators and a plain reference implementation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quasar.consensus import (
    AWAITING_QUORUM,
    DISPUTED,
    FAILED,
    PASSED,
    Electorate,
    Quorum,
    Report,
    agreement,
    decide,
    majority_figure,
)

QUORUM = Quorum(stake_share=0.6, min_validators=2)
# Three validators of different stakes, none holding half: the one holding most may lie.
STAKES = {"big": 4000.0, "mid": 3500.0, "small": 2500.0}
HASH_A, HASH_B = "a" * 64, "b" * 64


def passed(validator: str, figure: float, content_hash: str | None = HASH_A) -> Report:
    return Report(validator, True, True, figure, content_hash)


def failed(validator: str, figure: float | None = None, content_hash: str | None = HASH_A) -> Report:
    return Report(validator, False, None, figure, content_hash)


def test_the_electorate_weighs_by_stake_and_ignores_the_unstaked():
    electorate = Electorate.from_stakes({"v1": 30.0, "v2": 10.0, "sybil": 0.0})
    assert (electorate.total, electorate.weight("v1"), electorate.weight("sybil")) == (40.0, 30.0, 0.0)
    assert len(electorate) == 2
    # Nobody holds stake (a fresh local network): each permit counts one.
    assert Electorate.from_stakes({"v1": 0.0, "v2": 0.0}).weights == {"v1": 1.0, "v2": 1.0}


def test_a_quorum_needs_the_stake_share_and_the_count():
    electorate = Electorate.from_stakes(STAKES)
    one = decide([passed("big", 100.0)], electorate, QUORUM)
    assert one.state == AWAITING_QUORUM and one.measured_tokens_per_sec is None
    assert one.reason == (
        "awaiting a quorum: 1 of 3 validators reported, holding 40% of the stake; a quorum is "
        "2 validators holding 60% of the stake"
    )
    small_pair = decide([passed("mid", 100.0), passed("small", 100.0)], electorate, QUORUM)
    assert small_pair.state == PASSED and small_pair.reported_share == pytest.approx(0.6)
    below = decide([passed("big", 100.0), passed("small", 100.0)], electorate, Quorum(0.7, 2))
    assert below.state == AWAITING_QUORUM  # 65% reported, 70% needed
    # One validator holding almost everything is still one validator: two must report.
    lopsided = Electorate.from_stakes({"whale": 9900.0, "minnow": 100.0})
    assert decide([passed("whale", 1.0)], lopsided, QUORUM).state == AWAITING_QUORUM


def test_the_only_validator_of_a_network_is_a_quorum_of_one():
    alone = Electorate.from_stakes({"v": 1000.0})
    agreed = decide([passed("v", 123.0)], alone, QUORUM)
    assert (agreed.state, agreed.measured_tokens_per_sec, agreed.reported, agreed.validators) == (PASSED, 123.0, 1, 1)
    assert decide([failed("v")], alone, QUORUM).state == FAILED


def test_a_liar_with_the_largest_stake_decides_nothing_whatever_the_order():
    electorate = Electorate.from_stakes(STAKES)
    # big fails everything; mid passes: a quorum (75%) but no majority of the stake yet.
    split = decide([failed("big"), passed("mid", 100.0)], electorate, QUORUM)
    assert split.state == DISPUTED and split.reason.startswith("disputed: passed by 35% of the stake, failed by 40%")
    # small agrees with mid: 60% passed it.
    settled = decide([failed("big"), passed("mid", 100.0), passed("small", 102.0)], electorate, QUORUM)
    assert settled.state == PASSED and settled.measured_tokens_per_sec == 100.0
    # big reports 1e15: the figure stays one that the honest majority measured.
    inflated = decide([passed("big", 1e15), passed("mid", 100.0)], electorate, QUORUM)
    assert inflated.state == PASSED and inflated.measured_tokens_per_sec == 100.0
    everyone = decide([passed("big", 1e15), passed("mid", 100.0), passed("small", 102.0)], electorate, QUORUM)
    assert everyone.measured_tokens_per_sec == 102.0


def test_reports_without_a_permit_or_stake_count_for_nothing():
    electorate = Electorate.from_stakes({"v1": 10.0, "v2": 10.0, "v3": 10.0, "zero": 0.0})
    view = decide([failed("zero"), failed("gone"), passed("v1", 5.0)], electorate, QUORUM)
    assert view.state == AWAITING_QUORUM and view.reported == 1 and view.uncounted == ("gone", "zero")


def test_the_content_hash_is_the_one_a_majority_of_the_stake_reported():
    electorate = Electorate.from_stakes(STAKES)
    assert (
        decide([passed("big", 1.0, HASH_B), passed("mid", 1.0), passed("small", 1.0)], electorate, QUORUM).content_hash
        == HASH_A
    )
    assert decide([passed("big", 1.0, HASH_B), passed("mid", 1.0)], electorate, QUORUM).content_hash is None


def test_a_failed_submission_shows_the_reporters_median_figure_for_information():
    electorate = Electorate.from_stakes(STAKES)
    view = decide([failed("big", 10.0), failed("mid", 30.0), failed("small")], electorate, QUORUM)
    assert (view.state, view.measured_tokens_per_sec) == (FAILED, 10.0)


def test_the_quorum_settings_are_checked():
    with pytest.raises(ValueError, match="between 0.5 and 1"):
        Quorum(0.4, 1)
    with pytest.raises(ValueError, match="at least 1"):
        Quorum(0.6, 0)


def reference_figure(entries: list[tuple[float, float]], total: float) -> float | None:
    """For every figure reported, the weight of those at or above it; the highest held by a majority."""
    held = [figure for figure, _ in entries if sum(w for f, w in entries if f >= figure) > total / 2]
    return max(held) if held else None


@given(st.lists(st.tuples(st.floats(0, 1e9), st.floats(0.1, 100)), max_size=8), st.floats(1, 1000))
def test_the_majority_figure_matches_the_reference(entries, total):
    assert majority_figure(entries, total) == reference_figure(entries, total)


stakes_strategy = st.lists(st.floats(1.0, 1000.0), min_size=2, max_size=6)


@settings(max_examples=300)
@given(stakes_strategy, st.data())
def test_one_liar_holding_less_than_half_never_fails_or_inflates_an_honest_pass(stakes, data):
    validators = {f"v{i}": stake for i, stake in enumerate(stakes)}
    liar = data.draw(st.sampled_from(sorted(validators)))
    total = sum(stakes)
    if validators[liar] >= total / 2:
        return  # a validator holding half of the stake decides by definition
    electorate = Electorate.from_stakes(validators)
    honest = {name: data.draw(st.floats(90.0, 110.0)) for name in validators if name != liar}
    lie = data.draw(st.sampled_from([failed(liar), passed(liar, 1e15), passed(liar, 0.0), None]))
    reporters = data.draw(st.lists(st.sampled_from(sorted(honest)), unique=True))
    reports = [passed(name, honest[name]) for name in reporters] + ([] if lie is None else [lie])
    view = decide(reports, electorate, Quorum(data.draw(st.floats(0.5, 1.0)), data.draw(st.integers(1, 4))))
    assert view.state != FAILED
    if view.state == PASSED and lie is not None and lie.measured_tokens_per_sec == 1e15:
        assert view.measured_tokens_per_sec <= max(honest[name] for name in reporters)
    if len(reporters) == len(honest) and lie is not None:  # everyone reported: the honest majority decides
        assert view.state == PASSED
        assert min(honest.values()) <= view.measured_tokens_per_sec <= max(honest.values())


@settings(max_examples=200)
@given(stakes_strategy, st.data())
def test_one_liar_holding_less_than_half_never_passes_an_honest_fail(stakes, data):
    validators = {f"v{i}": stake for i, stake in enumerate(stakes)}
    liar = data.draw(st.sampled_from(sorted(validators)))
    if validators[liar] >= sum(stakes) / 2:
        return
    electorate = Electorate.from_stakes(validators)
    reporters = data.draw(st.lists(st.sampled_from(sorted(set(validators) - {liar})), unique=True))
    reports = [failed(name) for name in reporters] + [passed(liar, 1e6)]
    assert decide(reports, electorate, Quorum(0.5, 1)).state != PASSED


def test_agreement_shows_the_validator_that_keeps_disagreeing():
    electorate = Electorate.from_stakes(STAKES)
    judged = []
    for figure in (100.0, 200.0, 300.0):
        reports = [failed("big"), passed("mid", figure), passed("small", figure * 1.02)]
        judged.append((decide(reports, electorate, QUORUM), reports))
    pending = [passed("big", 1.0)]
    judged.append((decide(pending, electorate, QUORUM), pending))  # not settled: not judged
    by_validator = {item.validator_hotkey: item for item in agreement(judged)}
    assert (by_validator["big"].judged, by_validator["big"].agreed, by_validator["big"].disagreed) == (3, 0, 3)
    assert by_validator["big"].share == 0.0 and by_validator["big"].median_deviation is None
    assert (by_validator["mid"].agreed, by_validator["mid"].median_deviation) == (3, 0.0)
    assert by_validator["small"].share == 1.0 and by_validator["small"].median_deviation == pytest.approx(0.02)


def test_a_pass_the_consensus_failed_does_not_count_in_the_validators_deviation():
    # A failed submission's figure is for information only: a validator passing what the others
    # failed disagrees (counted), but its figure is not measured against that information.
    electorate = Electorate.from_stakes(STAKES)
    reports = [failed("big", 50.0), failed("mid", 60.0), passed("small", 100.0)]
    view = decide(reports, electorate, QUORUM)
    assert (view.state, view.measured_tokens_per_sec) == (FAILED, 60.0)
    (small,) = [item for item in agreement([(view, reports)]) if item.validator_hotkey == "small"]
    assert (small.judged, small.disagreed, small.median_deviation) == (1, 1, None)


def test_a_passing_minority_does_not_set_the_figure_as_the_median_of_passing_reports_would():
    # Passing: 35% at 1e15 and 25% at 100; the median of the passing reports alone would be 1e15.
    electorate = Electorate.from_stakes({"liar": 35.0, "honest": 25.0, "failer": 40.0})
    reports = [passed("liar", 1e15), passed("honest", 100.0), failed("failer", 80.0)]
    view = decide(reports, electorate, QUORUM)
    assert (view.state, view.measured_tokens_per_sec) == (PASSED, 100.0)


def test_exactly_half_of_the_stake_is_no_majority():
    # "More than half of all the stake": two validators of equal stake disagreeing dispute it.
    electorate = Electorate.from_stakes({"v1": 50.0, "v2": 50.0})
    split = decide([passed("v1", 100.0), failed("v2")], electorate, QUORUM)
    assert (split.state, split.passed_share, split.failed_share) == (DISPUTED, 0.5, 0.5)
    assert decide([failed("v1"), passed("v2", 100.0)], electorate, QUORUM).state == DISPUTED
    # Half the stake measured 200 and half 100: only 100 is measured at least by more than half.
    both = decide([passed("v1", 200.0), passed("v2", 100.0)], electorate, QUORUM)
    assert (both.state, both.measured_tokens_per_sec) == (PASSED, 100.0)
    assert majority_figure([(200.0, 1.0), (100.0, 1.0)], 2.0) == 100.0
    # A content hash reported by exactly half of the stake is no majority's.
    hashes = decide([passed("v1", 1.0, HASH_A), passed("v2", 1.0, HASH_B)], electorate, QUORUM)
    assert hashes.content_hash is None


def test_a_quorum_of_exactly_the_stake_share_is_reached_despite_rounding():
    # 0.3 + 0.3 = 0.6 is 75% of 0.8, though in floating point 0.6 < 0.75 * 0.8 = 0.6000000000000001.
    electorate = Electorate.from_stakes({"v1": 0.3, "v2": 0.3, "v3": 0.2})
    view = decide([passed("v1", 100.0), passed("v2", 100.0)], electorate, Quorum(0.75, 2))
    assert view.state == PASSED


def test_a_passed_submissions_logits_count_as_checked_when_one_passing_validator_checked_them():
    electorate = Electorate.from_stakes(STAKES)
    checked_by_one = [Report("big", True, True, 100.0), Report("mid", True, None, 100.0)]
    assert decide(checked_by_one, electorate, QUORUM).logits_ok is True
    unchecked = [Report("big", True, None, 100.0), Report("mid", True, None, 100.0)]
    assert decide(unchecked, electorate, QUORUM).logits_ok is None


def test_a_failed_submissions_figure_is_the_median_of_the_reporters_that_measured():
    # Only big (40% of the stake) measured: its figure is the reporters' median, for information.
    electorate = Electorate.from_stakes(STAKES)
    view = decide([failed("big", 10.0), failed("mid"), failed("small")], electorate, QUORUM)
    assert (view.state, view.measured_tokens_per_sec) == (FAILED, 10.0)


def test_no_validator_with_a_permit_is_no_quorum():
    view = decide([passed("gone", 100.0)], Electorate.from_stakes({}), QUORUM)
    assert (view.state, view.uncounted) == (AWAITING_QUORUM, ("gone",))


def test_a_validators_deviation_is_the_median_distance_over_what_it_and_the_consensus_passed():
    electorate = Electorate.from_stakes(STAKES)
    judged = []
    # small measures 30% below, exactly, then 10% above the consensus: distances 0.3, 0 and 0.1.
    for consensus_figure, small_figure in ((100.0, 70.0), (200.0, 200.0), (300.0, 330.0)):
        reports = [passed("big", consensus_figure), passed("mid", consensus_figure), passed("small", small_figure)]
        judged.append((decide(reports, electorate, QUORUM), reports))
    # A failing report's figure on a submission the consensus passed is not a figure it passed.
    reports = [passed("big", 100.0), passed("mid", 100.0), failed("small", 1e6)]
    judged.append((decide(reports, electorate, QUORUM), reports))
    (small,) = [item for item in agreement(judged) if item.validator_hotkey == "small"]
    assert (small.judged, small.agreed) == (4, 3)
    assert small.median_deviation == pytest.approx(0.1)
