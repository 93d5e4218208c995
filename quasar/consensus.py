"""The validators' consensus on a submission (docs/rules.md section 5), as pure functions.

No single validator decides alone. Every validator with a permit on the subnet votes with its
stake (its weight); if no validator holds any stake (a fresh local network) each counts one.
Reports from hotkeys that hold no permit, or no stake while others do, count for nothing.

- **Quorum**: a submission is judged only once validators holding at least ``stake_share`` of
  the weight, and at least ``min_validators`` of them (or all there are, when fewer), reported.
- **Verdict**: a side (passed or failed) wins once it holds more than half of the whole weight:
  a stake-weighted majority of the reports that the validators yet to report could no longer
  overturn. Until then a quorum with no such majority is ``disputed``. So a validator holding
  less than half of the stake never decides alone, whatever it reports and whenever it reports.
- **Figure**: the measured tokens/sec of a passed submission is the highest figure that passing
  validators holding more than half of the whole weight measured at least (the stake-weighted
  median of the whole weight, from the top, failing and missing reports below every figure; not
  the median of the passing reports alone). A minority can so never raise it above what the
  others measured, however high it reports.
- **Content**: the normalised kernel content hash the validators computed from their clones
  (quasar/originality.py) is the one validators holding more than half of the weight reported.

:func:`agreement` tells, per validator, how often its verdicts matched the settled consensus and
how far its figures were from the consensus figure: a validator that keeps disagreeing shows.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

AWAITING_QUORUM, DISPUTED, PASSED, FAILED = "awaiting_quorum", "disputed", "passed", "failed"


@dataclass(frozen=True)
class Quorum:
    """How many validators must have reported before a submission is judged (the settings
    ``QUORUM_STAKE_SHARE`` and ``QUORUM_MIN_VALIDATORS``)."""

    stake_share: float
    min_validators: int

    def __post_init__(self) -> None:
        if not 0.5 <= self.stake_share <= 1:
            raise ValueError(f"the quorum's stake share must be between 0.5 and 1, got {self.stake_share}")
        if self.min_validators < 1:
            raise ValueError(f"the quorum's minimum count must be at least 1, got {self.min_validators}")


@dataclass(frozen=True)
class Electorate:
    """The validators whose reports count, each with its weight (see the module docstring)."""

    weights: Mapping[str, float]

    @classmethod
    def from_stakes(cls, stakes: Mapping[str, float]) -> Electorate:
        """From the stakes of the validators holding a permit now: weight = stake; those with no
        stake do not count while any validator has some; when none has any, each weighs one."""
        staked = {hotkey: float(stake) for hotkey, stake in stakes.items() if stake > 0}
        return cls(staked if staked else {hotkey: 1.0 for hotkey in stakes})

    @property
    def total(self) -> float:
        return sum(self.weights.values())

    def weight(self, hotkey: str) -> float:
        return self.weights.get(hotkey, 0.0)

    @property
    def voters(self) -> list[str]:
        """The hotkeys whose reports count (a weight above zero)."""
        return sorted(hotkey for hotkey, weight in self.weights.items() if weight > 0)

    def __len__(self) -> int:
        return len(self.weights)


@dataclass(frozen=True)
class Report:
    """One validator's report on one submission, as the consensus reads it."""

    validator_hotkey: str
    passed: bool  # the validator's verdict
    logits_ok: bool | None
    measured_tokens_per_sec: float | None
    content_hash: str | None = None


@dataclass(frozen=True)
class Consensus:
    """The validators' combined view of one submission.

    ``state``: awaiting_quorum, disputed, passed or failed (only the last two are settled);
    ``reported``/``validators``: reporters that count and validators in the electorate;
    ``*_share``: shares of the electorate's weight that reported, passed it and failed it;
    ``measured_tokens_per_sec``: the consensus figure of a passed submission; of a failed one, for
    information only, the stake-weighted median of the reporters' figures; None otherwise;
    ``logits_ok``: True when a passing validator checked logits, else None (passed only);
    ``content_hash``: the kernel content hash a majority of the weight reported, else None;
    ``uncounted``: reporters that count for nothing now (no permit, or no stake);
    ``reason``: the state in words, for the miner.
    """

    state: str
    reported: int
    validators: int
    reported_share: float
    passed_share: float
    failed_share: float
    measured_tokens_per_sec: float | None
    logits_ok: bool | None
    content_hash: str | None
    uncounted: tuple[str, ...]
    reason: str

    @property
    def settled(self) -> bool:
        return self.state in (PASSED, FAILED)


def _percent(share: float) -> str:
    return f"{100 * share:.0f}%"


def majority_figure(figures: Iterable[tuple[float, float]], total: float) -> float | None:
    """The highest figure that entries holding more than half of ``total`` weight reached at least
    (``figures``: (figure, weight) pairs); None when all of them together do not hold that much."""
    held = 0.0
    for figure, weight in sorted(figures, key=lambda entry: -entry[0]):
        held += weight
        if held > total / 2:
            return figure
    return None


def _majority_value(values: Iterable[tuple[str, float]], total: float) -> str | None:
    held: dict[str, float] = {}
    for value, weight in values:
        held[value] = held.get(value, 0.0) + weight
    return next((value for value, weight in held.items() if weight > total / 2), None)


def decide(reports: Sequence[Report], electorate: Electorate, quorum: Quorum) -> Consensus:
    """The consensus of ``reports`` (at most one per validator) among ``electorate`` under ``quorum``
    (the rules in the module docstring)."""
    counted = [report for report in reports if electorate.weight(report.validator_hotkey) > 0]
    uncounted = tuple(sorted(r.validator_hotkey for r in reports if electorate.weight(r.validator_hotkey) <= 0))
    total = electorate.total
    share = (lambda weight: weight / total) if total > 0 else (lambda _weight: 0.0)
    weight = electorate.weight
    reported = sum(weight(r.validator_hotkey) for r in counted)
    passed = sum(weight(r.validator_hotkey) for r in counted if r.passed)
    failed = reported - passed
    needed_count = min(quorum.min_validators, len(electorate))
    content_hash = _majority_value(
        ((r.content_hash, weight(r.validator_hotkey)) for r in counted if r.content_hash is not None), total
    )
    view = functools.partial(
        Consensus,
        reported=len(counted),
        validators=len(electorate),
        reported_share=share(reported),
        passed_share=share(passed),
        failed_share=share(failed),
        content_hash=content_hash,
        uncounted=uncounted,
    )
    quorum_words = (
        f"a quorum is {needed_count} validator{'s' if needed_count != 1 else ''} holding "
        f"{_percent(quorum.stake_share)} of the stake"
    )
    if total <= 0 or len(counted) < needed_count or reported < quorum.stake_share * total * (1 - 1e-12):
        reason = (
            f"awaiting a quorum: {len(counted)} of {len(electorate)} validators reported, holding "
            f"{_percent(share(reported))} of the stake; {quorum_words}"
        )
        return view(AWAITING_QUORUM, measured_tokens_per_sec=None, logits_ok=None, reason=reason)
    if passed > total / 2:
        figure = majority_figure(
            ((r.measured_tokens_per_sec or 0.0, weight(r.validator_hotkey)) for r in counted if r.passed), total
        )
        checked = any(r.logits_ok is not None for r in counted if r.passed)
        reason = (
            f"passed by validators holding {_percent(share(passed))} of the stake "
            f"({sum(r.passed for r in counted)} of {len(electorate)})"
        )
        return view(PASSED, measured_tokens_per_sec=figure, logits_ok=True if checked else None, reason=reason)
    if failed > total / 2:
        reason = (
            f"failed by validators holding {_percent(share(failed))} of the stake "
            f"({sum(not r.passed for r in counted)} of {len(electorate)})"
        )
        measured = [
            (r.measured_tokens_per_sec, weight(r.validator_hotkey))
            for r in counted
            if r.measured_tokens_per_sec is not None
        ]
        figure = majority_figure(measured, sum(held for _, held in measured))
        return view(FAILED, measured_tokens_per_sec=figure, logits_ok=None, reason=reason)
    reason = (
        f"disputed: passed by {_percent(share(passed))} of the stake, failed by {_percent(share(failed))}; "
        f"one side needs more than half of the stake"
    )
    return view(DISPUTED, measured_tokens_per_sec=None, logits_ok=None, reason=reason)


@dataclass(frozen=True)
class Agreement:
    """How one validator's reports compare with the settled consensus: ``judged`` reports on
    submissions whose consensus is settled, ``agreed`` of them with the same verdict;
    ``median_deviation``: the median of |its figure / consensus figure - 1| over the submissions
    it and the consensus both passed (None when there are none)."""

    validator_hotkey: str
    judged: int
    agreed: int
    median_deviation: float | None

    @property
    def disagreed(self) -> int:
        return self.judged - self.agreed

    @property
    def share(self) -> float | None:
        return None if not self.judged else self.agreed / self.judged


def agreement(judged: Iterable[tuple[Consensus, Sequence[Report]]]) -> list[Agreement]:
    """Per validator that reported on a settled submission, its :class:`Agreement`, by hotkey."""
    counts: dict[str, list[int]] = {}
    deviations: dict[str, list[float]] = {}
    for consensus, reports in judged:
        if not consensus.settled:
            continue
        for report in reports:
            tally = counts.setdefault(report.validator_hotkey, [0, 0])
            tally[0] += 1
            tally[1] += report.passed == (consensus.state == PASSED)
            # A failed submission's figure is for information only, not a consensus figure.
            figure = consensus.measured_tokens_per_sec if consensus.state == PASSED else None
            if report.passed and figure and report.measured_tokens_per_sec is not None:
                deviations.setdefault(report.validator_hotkey, []).append(
                    abs(report.measured_tokens_per_sec / figure - 1)
                )
    return [
        Agreement(
            hotkey, judged_count, agreed, statistics.median(deviations[hotkey]) if deviations.get(hotkey) else None
        )
        for hotkey, (judged_count, agreed) in sorted(counts.items())
    ]
