"""The scoring rules of QUASAR (docs/rules.md section 5) as pure functions, and a command to apply them.

The validator (weights on chain), the submission API (its leaderboard) and the miner (simulating its
rank) all score through :func:`rank`, so they agree by construction:

- a target sequence length falls in a league, which sets a multiplier (:func:`league_for`);
- a result is eligible when its output is correct, its logits did not fail (``None`` = not
  checked, which is not a failure) and measured ≥ 0.9 × claimed (:func:`is_eligible`);
- ``verified = min(claimed, measured)`` and ``weighted = verified × multiplier``, 0 when ineligible;
- each hotkey keeps its best eligible result; hotkeys are ordered with the tie margin ε and places
  1–4 get 0.60 / 0.25 / 0.10 / 0.05; shares of unfilled places stay unassigned (burned).

Command line, for validators auditing weights and miners simulating their rank::

    quasar scoring --input results.json [--epsilon E] [--table]     (or python -m quasar.scoring)

It prints ``{"ranking": [...], "weights": {hotkey: share}, "unassigned": share}`` as JSON (or
tables with ``--table``). Malformed input exits with code 2 and a message naming the entry and field.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from quasar import config
from quasar.errors import QuasarError
from quasar.log import setup_logging
from quasar.terminal import compact_rate, compact_table, short_hotkey

# Shares of the weight for places 1, 2, 3 and 4.
PLACE_SHARES: tuple[float, ...] = (0.60, 0.25, 0.10, 0.05)
# A result is eligible only if measured >= CLAIM_FACTOR × claimed.
CLAIM_FACTOR = 0.9
# The rule's default tie margin; the setting TIE_EPSILON / --scoring.epsilon overrides it.
DEFAULT_EPSILON = float(config.OPTIONS_BY_KEY["tie_epsilon"].default)
# Far above any GPU (one H100's compute floor for the layer is ~2.8e8 tokens/s); bounding the
# input keeps every weighted score finite, so the JSON output stays valid JSON.
MAX_TOKENS_PER_SEC = 1e15


@dataclass(frozen=True)
class League:
    """A league: target lengths from ``min_length`` up to the next league's, scored × ``multiplier``."""

    name: str
    min_length: int
    multiplier: float


# Ascending by min_length; a length belongs to the last league whose min_length it reaches.
LEAGUES: tuple[League, ...] = (
    League("100k", 1, 0.5),
    League("200k", 200_000, 0.75),
    League("300k", 300_000, 1.0),
    League("400k", 400_000, 1.25),
    League("500k", 500_000, 1.5),
    League("600k", 600_000, 1.75),
    League("700k", 700_000, 2.0),
    League("800k", 800_000, 2.25),
    League("900k", 900_000, 2.5),
    League("1M", 1_000_000, 3.0),
)


def league_for(target_sequence_length: int) -> League:
    """The league of a target sequence length (a positive integer); ValueError otherwise."""
    if isinstance(target_sequence_length, bool) or not isinstance(target_sequence_length, int):
        raise ValueError(f"target sequence length must be an integer, got {target_sequence_length!r}")
    if target_sequence_length < LEAGUES[0].min_length:
        raise ValueError(f"target sequence length must be positive, got {target_sequence_length}")
    return next(league for league in reversed(LEAGUES) if target_sequence_length >= league.min_length)


class ScoringInputError(QuasarError, ValueError):
    """Input to scoring that cannot be used; the message says what and where."""


class InvalidResult(ScoringInputError):
    """One field of one result is invalid. ``index`` is the entry's position in the input, if known."""

    def __init__(self, field: str, problem: str, index: int | None = None):
        self.field = field
        self.problem = problem
        self.index = index
        where = "" if index is None else f"entry {index}: "
        super().__init__(f"{where}field {field!r}: {problem}")

    def at(self, index: int) -> InvalidResult:
        """The same error, located at entry ``index`` of the input."""
        return InvalidResult(self.field, self.problem, index)


def _shown(value: Any) -> str:
    """A value as the JSON input spells it (null/true/false), so messages quote what the user wrote."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    shown = repr(value)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _number(value: Any, field: str, *, positive: bool, high: float | None = None) -> float:
    wanted = "a positive number" if positive else "a non-negative number"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidResult(field, f"expected {wanted}, got {_shown(value)}")
    try:
        number = float(value)
    except OverflowError:  # an integer beyond float range
        number = math.inf
    if math.isnan(number) or not (number > 0 if positive else number >= 0):
        raise InvalidResult(field, f"expected {wanted}, got {_shown(value)}")
    if math.isinf(number) or (high is not None and number > high):
        bound = "a finite number" if high is None else f"at most {high:g}"
        raise InvalidResult(field, f"expected {bound}, got {_shown(value)}")
    return number


def _integer(value: Any, field: str, *, low: int) -> int:
    wanted = "a positive integer" if low == 1 else f"an integer of at least {low}"
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidResult(field, f"expected {wanted}, got {_shown(value)}")
    return value


def _flag(value: Any, field: str, *, allow_null: bool) -> bool | None:
    if isinstance(value, bool) or (allow_null and value is None):
        return value
    wanted = "true, false or null" if allow_null else "true or false"
    raise InvalidResult(field, f"expected {wanted}, got {_shown(value)}")


class Submitted(Protocol):
    """What a result takes of a submission record (the API's row, the validator's own record)."""

    @property
    def hotkey(self) -> str: ...
    @property
    def submission_id(self) -> int: ...
    @property
    def submitted_at(self) -> float: ...
    @property
    def target_sequence_length(self) -> int: ...
    @property
    def claimed_tokens_per_sec(self) -> float: ...


@dataclass(frozen=True)
class Result:
    """One evaluated submission. Construction validates every field (raising :class:`InvalidResult`)."""

    hotkey: str
    submission_id: int
    submitted_at: float  # unix seconds of the commit (the tie-break time)
    target_sequence_length: int
    claimed_tokens_per_sec: float
    measured_tokens_per_sec: float
    correct: bool
    logits_ok: bool | None  # None: not checked, which does not make the result ineligible

    def __post_init__(self) -> None:
        if not isinstance(self.hotkey, str) or not self.hotkey.strip():
            raise InvalidResult("hotkey", f"expected a non-empty string, got {_shown(self.hotkey)}")
        _integer(self.submission_id, "submission_id", low=0)
        _integer(self.target_sequence_length, "target_sequence_length", low=1)
        # Normalise ints to floats so equal results compare and hash equal however they were written.
        normalised = {
            "submitted_at": _number(self.submitted_at, "submitted_at", positive=False),
            "claimed_tokens_per_sec": _number(
                self.claimed_tokens_per_sec, "claimed_tokens_per_sec", positive=True, high=MAX_TOKENS_PER_SEC
            ),
            "measured_tokens_per_sec": _number(
                self.measured_tokens_per_sec, "measured_tokens_per_sec", positive=False, high=MAX_TOKENS_PER_SEC
            ),
        }
        for name, value in normalised.items():
            object.__setattr__(self, name, value)
        _flag(self.correct, "correct", allow_null=False)
        _flag(self.logits_ok, "logits_ok", allow_null=True)

    @classmethod
    def judged(
        cls, submission: Submitted, measured_tokens_per_sec: float | None, correct: bool, logits_ok: bool | None
    ) -> Result:
        """``submission`` with what was found of it: the tokens/sec measured (None: not measured,
        which counts as 0), whether its output is correct and its logit check."""
        return cls(
            hotkey=submission.hotkey,
            submission_id=submission.submission_id,
            submitted_at=submission.submitted_at,
            target_sequence_length=submission.target_sequence_length,
            claimed_tokens_per_sec=submission.claimed_tokens_per_sec,
            measured_tokens_per_sec=measured_tokens_per_sec or 0.0,
            correct=correct,
            logits_ok=logits_ok,
        )


RESULT_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Result))


def ineligibility_reason(result: Result) -> str | None:
    """Why ``result`` scores 0, or None when it is eligible."""
    if not result.correct:
        return "output does not match the reference"
    if result.logits_ok is False:
        return "logit verification failed"
    if result.measured_tokens_per_sec < CLAIM_FACTOR * result.claimed_tokens_per_sec:
        return (
            f"measured {result.measured_tokens_per_sec:,.0f} tok/s is below {CLAIM_FACTOR} × "
            f"claimed {result.claimed_tokens_per_sec:,.0f}"
        )
    return None


def is_eligible(result: Result) -> bool:
    """Correct, logits not failed, and measured ≥ 0.9 × claimed."""
    return ineligibility_reason(result) is None


def verified_tokens_per_sec(result: Result) -> float:
    """``min(claimed, measured)``: inflating a claim gains nothing, under-claiming costs."""
    return min(result.claimed_tokens_per_sec, result.measured_tokens_per_sec)


def weighted_score(result: Result) -> float:
    """``verified × league multiplier`` for an eligible result, 0.0 for an ineligible one."""
    if not is_eligible(result):
        return 0.0
    return verified_tokens_per_sec(result) * league_for(result.target_sequence_length).multiplier


def _time_order(result: Result) -> tuple[float, int]:
    return (result.submitted_at, result.submission_id)


def best_per_hotkey(results: Iterable[Result]) -> dict[str, Result]:
    """Each hotkey's best eligible result: highest weighted score, then earlier, then lower id."""
    best: dict[str, tuple[tuple[float, float, int], Result]] = {}
    for result in results:
        if not is_eligible(result):
            continue
        key = (-weighted_score(result), *_time_order(result))
        if result.hotkey not in best or key < best[result.hotkey][0]:
            best[result.hotkey] = (key, result)
    return {hotkey: result for hotkey, (_, result) in best.items()}


def tie_threshold(score: float, epsilon: float) -> float:
    """The least score tied with ``score`` under the tie margin ``epsilon``: ``score / (1 + ε)``."""
    return score / (1 + epsilon)


def _order_with_tie_margin(scored: Sequence[tuple[float, Result]], epsilon: float) -> list[tuple[float, Result]]:
    """docs/rules.md's order: repeatedly take the highest remaining score m; among the remaining entries
    with score ≥ m/(1+ε), place the earliest (time, then id) next.

    O(n log n): m never rises, so the set of entries within the margin only grows; they wait in
    a heap by time and the highest unplaced score is tracked with a pointer into the sorted list.
    """
    by_score = sorted(scored, key=lambda entry: (-entry[0], *_time_order(entry[1])))
    placed = [False] * len(by_score)
    within_margin: list[tuple[float, int, int]] = []  # (submitted_at, submission_id, index)
    highest = admitted = 0
    order: list[tuple[float, Result]] = []
    while len(order) < len(by_score):
        while placed[highest]:
            highest += 1
        threshold = tie_threshold(by_score[highest][0], epsilon)
        while admitted < len(by_score) and by_score[admitted][0] >= threshold:
            heapq.heappush(within_margin, (*_time_order(by_score[admitted][1]), admitted))
            admitted += 1
        *_, index = heapq.heappop(within_margin)
        placed[index] = True
        order.append(by_score[index])
    return order


def _exact_sum(shares: Iterable[float]) -> float:
    # Summed in decimal so the burn of places 3-4 reads 0.15, not 0.15000000000000002.
    return float(sum((Decimal(repr(share)) for share in shares), Decimal(0)))


@dataclass(frozen=True)
class Placement:
    """A hotkey's place: its best result, that result's weighted score and its share (0 past place 4)."""

    place: int
    result: Result
    weighted_score: float
    share: float

    @property
    def hotkey(self) -> str:
        return self.result.hotkey

    @property
    def submission_id(self) -> int:
        return self.result.submission_id


@dataclass(frozen=True)
class Ranking:
    """Every eligible hotkey's best result in order (places 1..n), the top-4 weights, the burn."""

    placements: tuple[Placement, ...]
    weights: dict[str, float]  # only the hotkeys placed 1-4
    unassigned: float  # shares of unfilled places, given to nobody (burned)
    epsilon: float

    def to_json(self) -> dict[str, Any]:
        """The CLI's output: ``{"ranking": [...], "weights": {...}, "unassigned": share}``."""
        return {
            "ranking": [
                {
                    "hotkey": p.hotkey,
                    "submission_id": p.submission_id,
                    "weighted_score": p.weighted_score,
                    "place": p.place,
                }
                for p in self.placements
            ],
            "weights": dict(self.weights),
            "unassigned": self.unassigned,
        }


def _check_epsilon(epsilon: float) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not math.isfinite(epsilon) or epsilon < 0:
        raise ValueError(f"epsilon must be a finite number >= 0, got {epsilon!r}")
    return float(epsilon)


def rank(results: Iterable[Result], epsilon: float = DEFAULT_EPSILON) -> Ranking:
    """Rank ``results`` by docs/rules.md section 5 with tie margin ``epsilon`` (0 = exact ties only).

    Raises ValueError for a negative or non-finite epsilon, or a submission id that appears in
    more than one result (the tie-break needs ids to be unique).
    """
    epsilon = _check_epsilon(epsilon)
    results = list(results)
    seen_ids: set[int] = set()
    for result in results:
        if result.submission_id in seen_ids:
            raise ValueError(f"submission_id {result.submission_id} appears in more than one result")
        seen_ids.add(result.submission_id)
    best = best_per_hotkey(results).values()
    ordered = _order_with_tie_margin([(weighted_score(result), result) for result in best], epsilon)
    placements = tuple(
        Placement(place, result, score, PLACE_SHARES[place - 1] if place <= len(PLACE_SHARES) else 0.0)
        for place, (score, result) in enumerate(ordered, start=1)
    )
    weights = {p.hotkey: p.share for p in placements[: len(PLACE_SHARES)]}
    return Ranking(placements, weights, _exact_sum(PLACE_SHARES[len(weights) :]), epsilon)


def results_from_json(data: Any) -> list[Result]:
    """Results from parsed JSON: a list of objects with the keys of :class:`Result`.

    Unknown keys are ignored. Raises :class:`ScoringInputError` naming the entry (numbered from 0)
    and the field for anything missing, mistyped, out of range or duplicated.
    """
    if not isinstance(data, list):
        raise ScoringInputError(f"expected a JSON list of result objects, got a JSON {type(data).__name__}")
    results: list[Result] = []
    first_entry_of_id: dict[int, int] = {}
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise ScoringInputError(f"entry {index}: expected an object with keys {', '.join(RESULT_FIELDS)}")
        for name in RESULT_FIELDS:
            if name not in entry:
                raise InvalidResult(name, "missing", index)
        try:
            result = Result(**{name: entry[name] for name in RESULT_FIELDS})
        except InvalidResult as error:
            raise error.at(index) from None
        if result.submission_id in first_entry_of_id:
            raise InvalidResult(
                "submission_id",
                f"{result.submission_id} is also the id of entry {first_entry_of_id[result.submission_id]}",
                index,
            )
        first_entry_of_id[result.submission_id] = index
        results.append(result)
    return results


def load_results(path: str) -> list[Result]:
    """Read results from a JSON file (``-`` = standard input); ScoringInputError says what is wrong."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise ScoringInputError(f"cannot read {path}: {reason}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ScoringInputError(
            f"{path} is not valid JSON: {error.msg} at line {error.lineno} column {error.colno}"
        ) from None
    try:
        return results_from_json(data)
    except ScoringInputError as error:
        raise ScoringInputError(f"{path}: {error}") from None


def print_tables(results: Sequence[Result], ranking: Ranking, console: Console) -> None:
    """Ranking and left-out results as tables for people (the JSON output is for programs)."""
    table = compact_table(f"QUASAR ranking (tie margin ε = {ranking.epsilon:g})")
    for column in ("#", "hotkey", "sub", "league", "verified", "×", "score", "share"):
        table.add_column(column, justify="left" if column in ("hotkey", "league") else "right", no_wrap=True)
    for p in ranking.placements:
        league = league_for(p.result.target_sequence_length)
        table.add_row(
            str(p.place),
            short_hotkey(p.hotkey),
            str(p.submission_id),
            league.name,
            compact_rate(verified_tokens_per_sec(p.result)),
            f"{league.multiplier:g}",
            compact_rate(p.weighted_score),
            f"{p.share:.2f}",
        )
    console.print(table)
    console.print(f"unassigned (burned): {ranking.unassigned:.2f}")

    placed_ids = {p.submission_id for p in ranking.placements}
    best = best_per_hotkey(results)
    left_out = compact_table("not placed")
    left_out.add_column("hotkey", no_wrap=True)
    left_out.add_column("sub", justify="right", no_wrap=True)
    left_out.add_column("why")
    for result in results:
        if result.submission_id in placed_ids:
            continue
        reason = ineligibility_reason(result)
        if reason is None:
            kept = best[result.hotkey]
            beaten = (
                "scores higher" if weighted_score(kept) > weighted_score(result) else "scores the same and came first"
            )
            reason = f"the hotkey's submission {kept.submission_id} {beaten}"
        left_out.add_row(short_hotkey(result.hotkey), str(result.submission_id), reason)
    if left_out.row_count:
        console.print(left_out)


def main(argv: Sequence[str] | None = None, prog: str = "quasar scoring") -> int:
    """``quasar scoring``: rank a JSON file of results; exit 2 on malformed input."""
    option = config.OPTIONS_BY_KEY["tie_epsilon"]
    assert option.flag is not None, "TIE_EPSILON has a flag in the settings table"
    parser = argparse.ArgumentParser(
        prog=prog, description="Rank QUASAR results (docs/rules.md section 5) and print the weight split as JSON."
    )
    parser.add_argument(
        "--input",
        required=True,
        metavar="FILE",
        help="JSON list of results ('-' reads standard input); messages number entries from 0",
    )
    parser.add_argument(
        "--epsilon",
        option.flag,
        dest=option.key,
        default=None,
        metavar="E",
        help=f"{option.help} (env {option.env}, default {option.default})",
    )
    parser.add_argument("--table", action="store_true", help="print tables for people instead of JSON")
    args, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, settings.secrets(), quiet=True)
    try:
        results = load_results(args.input)
        ranking = rank(results, settings.tie_epsilon)
    except ValueError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    if args.table:
        print_tables(results, ranking, Console())
    else:
        print(json.dumps(ranking.to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(prog="python -m quasar.scoring"))
