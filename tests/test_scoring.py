"""Scoring (docs/rules.md section 5): leagues, eligibility, the tie margin, the top-4 split, the CLI.

The ranking is compared with a slow transcription of the rule (``reference_rank``) on random
inputs built to hold many near-ties, exact ties and equal submission times.
"""

import dataclasses
import io
import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from quasar import scoring
from quasar.scoring import InvalidResult, Result, ScoringInputError
from tests.processes import run_python

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "results.json"

# docs/rules.md's league table, row by row: (lowest length, highest length, league, multiplier).
LEAGUE_TABLE = [
    (1, 199_999, "100k", 0.5),
    (200_000, 299_999, "200k", 0.75),
    (300_000, 399_999, "300k", 1.0),
    (400_000, 499_999, "400k", 1.25),
    (500_000, 599_999, "500k", 1.5),
    (600_000, 699_999, "600k", 1.75),
    (700_000, 799_999, "700k", 2.0),
    (800_000, 899_999, "800k", 2.25),
    (900_000, 999_999, "900k", 2.5),
    (1_000_000, math.inf, "1M", 3.0),
]
SHARES = [0.60, 0.25, 0.10, 0.05]


def reference_league(length):
    (row,) = [row for row in LEAGUE_TABLE if row[0] <= length <= row[1]]
    return row[2], row[3]


def reference_score(r):
    return min(r.claimed_tokens_per_sec, r.measured_tokens_per_sec) * reference_league(r.target_sequence_length)[1]


def reference_eligible(r):
    return r.correct and r.logits_ok is not False and r.measured_tokens_per_sec >= 0.9 * r.claimed_tokens_per_sec


def reference_rank(results, epsilon):
    """The rule as docs/rules.md words it, with no cleverness: [(hotkey, submission_id, score)] in order."""
    eligible = [r for r in results if reference_eligible(r)]
    best = []
    for hotkey in {r.hotkey for r in eligible}:
        own = [r for r in eligible if r.hotkey == hotkey]
        top = max(reference_score(r) for r in own)
        best.append(min((r for r in own if reference_score(r) == top), key=lambda r: (r.submitted_at, r.submission_id)))
    order = []
    while best:
        m = max(reference_score(r) for r in best)
        within = [r for r in best if reference_score(r) >= m / (1 + epsilon)]
        earliest = min(within, key=lambda r: (r.submitted_at, r.submission_id))
        order.append((earliest.hotkey, earliest.submission_id, reference_score(earliest)))
        best.remove(earliest)
    return order


def make(hotkey="hk", submission_id=0, submitted_at=0, score=1000.0, **changes):
    """A correct, logit-checked result in the ×1.0 league (300k) that claimed and measured ``score``
    tokens/s, so scores ``score``; ``changes`` to any other field (dataclasses.replace)."""
    placing = Result(hotkey, submission_id, submitted_at, 300_000, score, score, correct=True, logits_ok=True)
    return dataclasses.replace(placing, **changes)


# --- random inputs: weighted scores cluster at a few values and at m/(1+ε)^k (just inside or
# just outside the margin), with equal submission times common ---

LENGTHS = st.sampled_from([1, 150_000, 199_999, 200_000, 524_288, 999_999, 1_000_000, 1_048_576]) | st.integers(
    1, 3_000_000
)
NUDGES = st.sampled_from([0.0, 0.0, 1e-12, -1e-12, 1e-6, -1e-6, 1e-3, -1e-3]) | st.floats(-0.003, 0.003)
CLAIM_FACTORS = st.sampled_from([1.0, 1.0, 0.5, 1 / 0.9, 1.05, 1.2, 2.0]) | st.floats(0.3, 1.5)
EPSILONS = st.sampled_from([0.0, 0.01, 0.01, 0.005, 0.02]) | st.floats(0.0, 0.05)


@st.composite
def results_lists(draw, max_size=12, hotkeys=4, distinct_hotkeys=False, epsilon=0.01):
    size = draw(st.integers(0, max_size))
    ids = draw(st.permutations(range(100, 100 + size)))  # unique, unrelated to time order
    results = []
    for index in range(size):
        length = draw(LENGTHS)
        steps_below = draw(st.integers(0, 2))
        target_score = draw(st.sampled_from([1e6, 3e6])) / (1 + epsilon) ** steps_below * (1 + draw(NUDGES))
        measured = target_score / reference_league(length)[1]
        results.append(
            Result(
                hotkey=f"hk{index}" if distinct_hotkeys else f"hk{draw(st.integers(0, hotkeys - 1))}",
                submission_id=ids[index],
                submitted_at=draw(st.integers(1_763_700_000, 1_763_700_004)),
                target_sequence_length=length,
                claimed_tokens_per_sec=measured * draw(CLAIM_FACTORS),
                measured_tokens_per_sec=measured,
                correct=draw(st.booleans()) or draw(st.booleans()),
                logits_ok=draw(st.sampled_from([True, True, None, False])),
            )
        )
    return results


@st.composite
def ranking_inputs(draw, **options):
    """(results, epsilon), the results built around that epsilon's margin."""
    epsilon = draw(EPSILONS)
    return draw(results_lists(epsilon=epsilon, **options)), epsilon


# --- leagues ---


# Both ends of every row of the table (10**9 for the last row's open end).
ROW_ENDS = [end for low, high, _, _ in LEAGUE_TABLE for end in (low, min(high, 10**9))]


@pytest.mark.parametrize("length", [*ROW_ENDS, 1_048_576])
def test_league_boundaries(length):
    league = scoring.league_for(length)
    assert (league.name, league.multiplier) == reference_league(length)


@given(st.integers(1, 2_000_000))
def test_league_matches_the_table(length):
    league = scoring.league_for(length)
    assert (league.name, league.multiplier) == reference_league(length)
    assert league.min_length <= length


@pytest.mark.parametrize("length", [0, -5, True, 250_000.0, "300000", None])
def test_league_rejects_non_positive_or_non_integer_lengths(length):
    with pytest.raises(ValueError, match="target sequence length"):
        scoring.league_for(length)


# --- one result: eligibility, verified and weighted scores ---


def test_eligibility_rules():
    assert scoring.is_eligible(make())
    assert scoring.is_eligible(make(logits_ok=None))  # not checked is not a failure
    assert not scoring.is_eligible(make(logits_ok=False))
    assert not scoring.is_eligible(make(correct=False))
    assert scoring.is_eligible(make(measured_tokens_per_sec=900.0))  # exactly 0.9 × claimed
    assert not scoring.is_eligible(make(measured_tokens_per_sec=899.99))
    assert "below 0.9 × claimed" in scoring.ineligibility_reason(make(measured_tokens_per_sec=899.99))
    assert scoring.ineligibility_reason(make(correct=False)) == "output does not match the reference"


def test_verified_and_weighted_scores():
    under_claimed = make(target_sequence_length=1_048_576, claimed_tokens_per_sec=500.0)
    assert scoring.verified_tokens_per_sec(under_claimed) == 500.0
    assert scoring.weighted_score(under_claimed) == 1500.0
    over_claimed = make(target_sequence_length=150_000, claimed_tokens_per_sec=1050.0)
    assert scoring.weighted_score(over_claimed) == 500.0
    ineligible = make(target_sequence_length=1_048_576, correct=False)
    assert scoring.verified_tokens_per_sec(ineligible) == 1000.0
    assert scoring.weighted_score(ineligible) == 0.0


@given(results_lists(max_size=1).filter(len), st.floats(1.0, 100.0), st.floats(1.0, 100.0))
def test_raising_a_claim_above_measured_never_raises_the_score(results, lower, higher):
    (result,) = results
    lower, higher = sorted((lower, higher))
    at = [
        dataclasses.replace(result, claimed_tokens_per_sec=result.measured_tokens_per_sec * factor)
        for factor in (1.0, lower, higher)
    ]
    honest, low_claim, high_claim = (scoring.weighted_score(r) for r in at)
    assert honest >= low_claim >= high_claim


@given(results_lists(hotkeys=3), st.data())
def test_raising_a_claim_never_raises_the_hotkeys_ranked_score(results, data):
    if not results:
        return
    index = data.draw(st.integers(0, len(results) - 1))
    target = results[index]
    claim_at_or_above_measured = max(target.claimed_tokens_per_sec, target.measured_tokens_per_sec)
    before, after = list(results), list(results)
    before[index] = dataclasses.replace(target, claimed_tokens_per_sec=claim_at_or_above_measured)
    after[index] = dataclasses.replace(
        target, claimed_tokens_per_sec=claim_at_or_above_measured * data.draw(st.floats(1.0, 50.0))
    )

    def score_of_hotkey(ranking):
        return next((p.weighted_score for p in ranking.placements if p.hotkey == target.hotkey), 0.0)

    assert score_of_hotkey(scoring.rank(after)) <= score_of_hotkey(scoring.rank(before))


# --- validation of one result ---


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("hotkey", "", "expected a non-empty string, got ''"),
        ("hotkey", 5, "expected a non-empty string, got 5"),
        ("submission_id", -1, "expected an integer of at least 0, got -1"),
        ("submission_id", "7", "expected an integer of at least 0, got '7'"),
        ("submission_id", True, "expected an integer of at least 0, got true"),
        ("submitted_at", -1.0, "expected a non-negative number, got -1.0"),
        ("submitted_at", float("inf"), "expected a finite number, got inf"),
        ("target_sequence_length", 0, "expected a positive integer, got 0"),
        ("target_sequence_length", 1e6, "expected a positive integer, got 1000000.0"),
        ("claimed_tokens_per_sec", 0, "expected a positive number, got 0"),
        ("claimed_tokens_per_sec", float("inf"), "expected at most 1e+15, got inf"),
        ("claimed_tokens_per_sec", 1e16, "expected at most 1e+15, got 1e+16"),
        ("measured_tokens_per_sec", "fast", "expected a non-negative number, got 'fast'"),
        ("measured_tokens_per_sec", float("nan"), "expected a non-negative number, got nan"),
        ("measured_tokens_per_sec", False, "expected a non-negative number, got false"),
        ("measured_tokens_per_sec", 10**400, "expected at most 1e+15, got 1000000000000000000000000000000000000..."),
        ("correct", None, "expected true or false, got null"),
        ("correct", 1, "expected true or false, got 1"),
        ("logits_ok", "yes", "expected true, false or null, got 'yes'"),
    ],
)
def test_invalid_field_is_named(field, value, message):
    good = dataclasses.asdict(make())
    with pytest.raises(InvalidResult) as raised:
        Result(**{**good, field: value})
    assert raised.value.field == field
    assert str(raised.value) == f"field {field!r}: {message}"


def test_a_claim_and_a_figure_of_exactly_the_bound_are_taken():
    # docs/rules.md section 3: a claim is above 0 and at most 10^15; 10^15 itself is a claim.
    at_bound = make(score=1e15, measured_tokens_per_sec=1e15)
    assert (at_bound.claimed_tokens_per_sec, scoring.weighted_score(at_bound)) == (1e15, 1e15)


def test_numbers_are_normalised_so_equal_results_compare_equal():
    written_as_ints = make(submitted_at=5, score=1000, measured_tokens_per_sec=900)
    assert written_as_ints == make(submitted_at=5.0, score=1000.0, measured_tokens_per_sec=900.0)
    assert isinstance(make(score=1000).claimed_tokens_per_sec, float)


def test_a_judged_submission_takes_its_record_and_what_was_found_and_not_measured_scores_zero():
    record = dataclasses.replace(make("hk", 7, 5.0, 1000.0), measured_tokens_per_sec=0.0, correct=False)
    judged = Result.judged(record, 900.0, correct=True, logits_ok=None)
    assert judged == make("hk", 7, 5.0, 1000.0, measured_tokens_per_sec=900.0, logits_ok=None)
    unmeasured = Result.judged(record, None, correct=True, logits_ok=True)
    assert unmeasured.measured_tokens_per_sec == 0.0 and scoring.weighted_score(unmeasured) == 0.0
    with pytest.raises(InvalidResult, match="'correct'"):
        Result.judged(record, 900.0, correct=None, logits_ok=None)


# --- ranking: examples worked by hand ---


def scores_at(*entries, epsilon=0.01):
    """Rank one result per hotkey from (score, submitted_at, submission_id) in the ×1.0 league."""
    results = [make(f"hk{i}", sid, t, score) for i, (score, t, sid) in enumerate(entries)]
    return [p.submission_id for p in scoring.rank(results, epsilon).placements]


def test_tie_margin_examples():
    # Within 1%: the earlier submission keeps the lead against a copy measured a bit faster.
    assert scores_at((100.0, 5, 1), (100.9, 9, 2)) == [1, 2]
    assert scores_at((100.0, 5, 1), (101.1, 9, 2)) == [2, 1]
    # ε = 0: only exact ties, which go to the earlier time and then the lower id.
    assert scores_at((100.0, 5, 1), (100.9, 9, 2), epsilon=0) == [2, 1]
    assert scores_at((100.0, 9, 1), (100.0, 5, 2), epsilon=0) == [2, 1]
    assert scores_at((100.0, 5, 7), (100.0, 5, 3), epsilon=0) == [3, 7]
    # The margin is inclusive: 100 == 125 / (1 + 0.25).
    assert scores_at((125.0, 9, 1), (100.0, 5, 2), epsilon=0.25) == [2, 1]
    assert scores_at((125.0, 9, 1), (99.99, 5, 2), epsilon=0.25) == [1, 2]


def test_tie_margin_is_not_transitive_and_follows_the_exact_rule():
    # m = 100: 99.5 is within 1% and earliest, so it goes first; then m = 100 again and 99.0
    # (below 100/1.01) is not within the margin, so 100 goes second.
    assert scores_at((100.0, 3, 1), (99.5, 2, 2), (99.0, 1, 3)) == [2, 1, 3]


def test_best_entry_per_hotkey():
    results = [
        make("a", 1, 10, 100.0),
        make("a", 2, 20, 120.0),  # a's best: highest score
        make("a", 3, 5, 500.0, logits_ok=False),  # higher but ineligible
        make("b", 4, 30, 90.0),
        make("b", 5, 10, 90.0),  # b's best: equal score, earlier
        make("c", 6, 10, 80.0),
        make("c", 7, 10, 80.0),  # same score and time: lower id (6) wins
    ]
    best = scoring.best_per_hotkey(results)
    assert {hotkey: r.submission_id for hotkey, r in best.items()} == {"a": 2, "b": 5, "c": 6}
    ranking = scoring.rank(results)
    assert [(p.place, p.hotkey, p.submission_id) for p in ranking.placements] == [(1, "a", 2), (2, "b", 5), (3, "c", 6)]


def test_the_tie_margin_is_between_hotkeys_so_a_hotkeys_newer_entry_stands_at_its_own_time():
    """docs/rules.md section 5: a hotkey's entry is its highest score, not its earliest within ε;
    another hotkey's submission made between its two and within ε then places first."""
    results = [make("a", 1, 1, 100.0), make("a", 2, 5, 100.5), make("b", 3, 3, 100.2)]
    assert scoring.best_per_hotkey(results)["a"].submission_id == 2
    placed = [(p.hotkey, p.submission_id) for p in scoring.rank(results, epsilon=0.01).placements]
    assert placed == [("b", 3), ("a", 2)]
    assert [p.hotkey for p in scoring.rank(results[:1] + results[2:], epsilon=0.01).placements] == ["a", "b"]


@pytest.mark.parametrize("count", range(7))
def test_shares_and_burn(count):
    results = [make(f"hk{i}", i, i, 1000.0 - 100 * i) for i in range(count)]
    ranking = scoring.rank(results)
    assert [p.share for p in ranking.placements] == (SHARES + [0.0] * 6)[:count]
    assert ranking.weights == {f"hk{i}": SHARES[i] for i in range(min(count, 4))}
    assert ranking.unassigned == [1.0, 0.4, 0.15, 0.05, 0.0, 0.0, 0.0][count]


def test_only_ineligible_results_burn_everything():
    ranking = scoring.rank([make(correct=False), make("b", 1, logits_ok=False)])
    assert ranking.placements == () and ranking.weights == {} and ranking.unassigned == 1.0


@pytest.mark.parametrize("epsilon", [-0.01, math.nan, math.inf, True, "0.01"])
def test_rank_rejects_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="epsilon must be a finite number >= 0"):
        scoring.rank([make()], epsilon)


def test_rank_rejects_duplicate_submission_ids():
    with pytest.raises(ValueError, match="submission_id 3 appears in more than one result"):
        scoring.rank([make("a", 3), make("b", 3)])


# --- ranking: properties and the reference on random inputs ---


@settings(max_examples=300, deadline=None)
@given(ranking_inputs())
def test_rank_matches_the_reference(inputs):
    results, epsilon = inputs
    ranking = scoring.rank(results, epsilon)
    expected = reference_rank(results, epsilon)
    assert [(p.hotkey, p.submission_id, p.weighted_score) for p in ranking.placements] == expected
    assert [p.place for p in ranking.placements] == list(range(1, len(expected) + 1))
    assert ranking.weights == {hotkey: SHARES[i] for i, (hotkey, _, _) in enumerate(expected[:4])}


@settings(max_examples=200, deadline=None)
@given(ranking_inputs(max_size=20, distinct_hotkeys=True))
def test_ordering_matches_the_reference_one_result_per_hotkey(inputs):
    results, epsilon = inputs
    placed = [(p.hotkey, p.submission_id, p.weighted_score) for p in scoring.rank(results, epsilon).placements]
    assert placed == reference_rank(results, epsilon)


@settings(max_examples=200, deadline=None)
@given(ranking_inputs(), st.randoms(use_true_random=False))
def test_ranking_properties(inputs, random):
    results, epsilon = inputs
    ranking = scoring.rank(results, epsilon)
    assert math.isclose(sum(ranking.weights.values()) + ranking.unassigned, 1.0, abs_tol=1e-12)
    assert len(ranking.weights) <= 4
    hotkeys = [p.hotkey for p in ranking.placements]
    assert len(hotkeys) == len(set(hotkeys))  # one entry per hotkey
    assert set(hotkeys) == {r.hotkey for r in results if reference_eligible(r)}  # every eligible hotkey, no other
    assert all(reference_eligible(p.result) for p in ranking.placements)  # an ineligible entry is never placed
    assert set(ranking.weights) == set(hotkeys[:4])
    shuffled = list(results)
    random.shuffle(shuffled)
    assert scoring.rank(shuffled, epsilon) == ranking  # input order does not matter


def test_zero_epsilon_is_plain_score_order_with_earlier_first_on_exact_ties():
    results = [
        make(f"hk{i}", i, t, s)
        for i, (s, t) in enumerate([(100.0, 4), (100.0, 2), (100.00001, 9), (50.0, 1), (100.0, 2)])
    ]
    placed = [p.submission_id for p in scoring.rank(results, 0).placements]
    assert placed == [2, 1, 4, 0, 3]


# --- JSON input ---


def example_entries():
    return json.loads(EXAMPLE.read_text())


def test_results_from_json_reads_the_example():
    results = scoring.results_from_json(example_entries())
    assert len(results) == 7 and all(isinstance(r, Result) for r in results)


def test_results_from_json_ignores_unknown_keys():
    entry = {**example_entries()[0], "fork_url": "https://github.com/x/y"}
    assert scoring.results_from_json([entry])[0].submission_id == 101


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"a": 1}, "expected a JSON list of result objects, got a JSON dict"),
        ([1], "entry 0: expected an object with keys hotkey, submission_id"),
    ],
)
def test_results_from_json_rejects_wrong_shapes(data, message):
    with pytest.raises(ScoringInputError, match=message):
        scoring.results_from_json(data)


def test_results_from_json_names_entry_and_field():
    entries = example_entries()
    del entries[2]["logits_ok"]
    with pytest.raises(InvalidResult, match=r"^entry 2: field 'logits_ok': missing$") as raised:
        scoring.results_from_json(entries)
    assert raised.value.index == 2
    entries = example_entries()
    entries[5]["submission_id"] = entries[1]["submission_id"]
    with pytest.raises(InvalidResult, match=r"^entry 5: field 'submission_id': 102 is also the id of entry 1$"):
        scoring.results_from_json(entries)


# --- the command line ---

EXPECTED_EXAMPLE = {
    "ranking": [
        {
            "hotkey": "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY",
            "submission_id": 105,
            "weighted_score": 78_150_000.0,
            "place": 1,
        },
        {
            "hotkey": "5CiPPseXPECbkjWCa6MnjNokrgYjMqmKndv2rSnekmSK2DjL",
            "submission_id": 106,
            "weighted_score": 78_600_000.0,
            "place": 2,
        },
        {
            "hotkey": "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty",
            "submission_id": 102,
            "weighted_score": 60_000_000.0,
            "place": 3,
        },
    ],
    "weights": {
        "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY": 0.6,
        "5CiPPseXPECbkjWCa6MnjNokrgYjMqmKndv2rSnekmSK2DjL": 0.25,
        "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty": 0.1,
    },
    "unassigned": 0.05,
}


def run_cli(args, cwd, stdin=None, **environ):
    env = {key: value for key, value in os.environ.items() if key != "TIE_EPSILON"}
    env.update(PYTHONPATH=str(ROOT), **environ)
    return run_python(["-m", "quasar.scoring", *args], cwd, 60, env, stdin)


def test_cli_ranks_the_example(tmp_path):
    done = run_cli(["--input", str(EXAMPLE)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == EXPECTED_EXAMPLE


def test_cli_epsilon_from_environment_and_flag(tmp_path):
    swapped = [EXPECTED_EXAMPLE["ranking"][i]["hotkey"] for i in (1, 0, 2)]
    from_env = run_cli(["--input", str(EXAMPLE)], tmp_path, TIE_EPSILON="0")
    assert [e["hotkey"] for e in json.loads(from_env.stdout)["ranking"]] == swapped
    flag_beats_env = run_cli(
        ["--input", "-", "--epsilon", "0.01"], tmp_path, stdin=EXAMPLE.read_text(), TIE_EPSILON="0"
    )
    assert json.loads(flag_beats_env.stdout) == EXPECTED_EXAMPLE


def test_cli_table_fits_80_columns(tmp_path):
    done = run_cli(["--input", str(EXAMPLE), "--table"], tmp_path, COLUMNS="80")
    assert done.returncode == 0, done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    assert "QUASAR ranking" in done.stdout and "unassigned (burned): 0.05" in done.stdout
    assert "5GrwvaEF…utQY" in done.stdout  # the hotkey shortened to fit
    assert "logit verification failed" in done.stdout
    assert "the hotkey's submission 105 scores higher" in done.stdout


def test_cli_malformed_entry_exits_2_naming_entry_and_field(tmp_path):
    entries = example_entries()
    entries[3]["measured_tokens_per_sec"] = "fast"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(entries))
    done = run_cli(["--input", str(bad)], tmp_path)
    assert done.returncode == 2
    assert "entry 3: field 'measured_tokens_per_sec': expected a non-negative number, got 'fast'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        (None, [], "cannot read"),
        ('[{"hotkey": ', [], "is not valid JSON: Expecting value at line 1 column 13"),
        (b"\xff\xfe[]", [], "cannot read"),
        ("{}", [], "expected a JSON list of result objects"),
        ("[]", ["--epsilon", "-1"], "--scoring.epsilon (from command line): must be at least 0.0"),
        ("[]", ["--epsilon", "inf"], "epsilon must be a finite number >= 0, got inf"),
    ],
)
def test_cli_bad_files_and_settings_exit_2(tmp_path, monkeypatch, capsys, content, args, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIE_EPSILON", raising=False)
    path = tmp_path / "results.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(scoring.main(["--input", str(path), *args]))
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_empty_list_burns_everything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TIE_EPSILON", raising=False)
    (tmp_path / "empty.json").write_text("[]")
    assert scoring.main(["--input", "empty.json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ranking": [], "weights": {}, "unassigned": 1.0}


def test_table_does_not_say_an_equal_scoring_later_submission_was_outscored():
    first, later = (Result("A", sid, at, 1_000_000, 1000.0, 1000.0, True, True) for sid, at in ((1, 100.0), (2, 200.0)))
    outscored = Result("A", 3, 50.0, 1_000_000, 1000.0, 950.0, True, True)
    results = [first, later, outscored]
    console = Console(file=io.StringIO(), width=80)
    scoring.print_tables(results, scoring.rank(results), console)
    shown = console.file.getvalue()
    assert "the hotkey's submission 1 scores the same and came first" in shown
    assert "the hotkey's submission 1 scores higher" in shown  # submission 3's reason
    assert shown.count("scores higher") == 1
