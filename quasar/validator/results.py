"""From the validator's own measured results to what it reports and the weights it sets (pure).

Everything here ranks and judges through quasar/scoring.py, so the verdict sent to the API, the
API's leaderboard and the weights on chain apply the same rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rich.table import Table

from quasar import scoring
from quasar.api.schemas import MAX_BENCHMARK_ENTRIES, MAX_REASON_LENGTH, MAX_REASONS
from quasar.chain.base import Metagraph, SubnetHyperparameters
from quasar.terminal import compact_rate, compact_table, short_hotkey
from quasar.validator.records import SubmissionRecord


def scoring_result(record: SubmissionRecord) -> scoring.Result:
    """A submission with a finished evaluation as a scoring result (not measured counts as 0)."""
    submission, result = record.submission, record.evaluation.result
    if result is None:
        raise ValueError(f"submission {submission.submission_id} has no finished evaluation")
    return scoring.Result.judged(submission, result.measured_tokens_per_sec, result.correct, record.logits_ok)


@dataclass(frozen=True)
class ApiReport:
    """The body of ``POST /validator/report`` for one submission."""

    submission_id: int
    verdict: str
    correct: bool
    logits_ok: bool | None
    measured_tokens_per_sec: float | None
    benchmarks: dict[int, float]
    reasons: tuple[str, ...]
    lengths: tuple[dict[str, Any], ...] | None = None  # schemas.ReportedLength fields, per length run
    content_hash: str | None = None  # of the fork's kernel files (quasar/originality.py)


def reported_lengths(harness_report: Mapping[str, Any] | None) -> tuple[dict[str, Any], ...] | None:
    """The per-length figures of a harness report (``EvaluationReport.to_dict()``) for the API: status,
    tokens/sec, peak memory and correctness at each length, shortest first; None without a report
    (the fork was not cloned or not evaluated)."""
    if harness_report is None:
        return None
    items = sorted(harness_report.get("lengths", {}).values(), key=lambda item: item["seq_len"])
    return tuple(
        {
            "seq_len": int(item["seq_len"]),
            "status": item["status"],
            "tokens_per_sec": item.get("tokens_per_sec"),
            "peak_vram_mb": item.get("peak_vram_mb"),
            "correct": item.get("correct"),
        }
        for item in items[:MAX_BENCHMARK_ENTRIES]
    )


def _printable(text: str) -> str:
    # A fork's reply may carry lone surrogates (JSON escapes any code point); no UTF-8 holds them,
    # so the API would refuse the whole report and the fork's failure would never be recorded.
    text = text.encode("utf-8", "replace").decode("utf-8")
    cleaned = "".join(ch if ch in "\n\t" or (ord(ch) >= 32 and ord(ch) != 127) else " " for ch in text).strip()
    return cleaned if len(cleaned) <= MAX_REASON_LENGTH else cleaned[: MAX_REASON_LENGTH - 3] + "..."


def bounded_reasons(reasons: Iterable[str]) -> tuple[str, ...]:
    """Reasons within the API's limits: printable, at most MAX_REASON_LENGTH each, MAX_REASONS in all."""
    kept = [text for text in (_printable(reason) for reason in reasons) if text]
    if len(kept) > MAX_REASONS:
        kept = kept[: MAX_REASONS - 1] + [f"... and {len(kept) - MAX_REASONS + 1} more"]
    return tuple(kept)


def api_report(record: SubmissionRecord) -> ApiReport:
    """The verdict (passed iff eligible: correct, logits not failed, measured ≥ 0.9 × claimed) and
    every reason: the evaluation's, the claim's and the logit check's; notes last."""
    result = record.evaluation.result
    if result is None:
        raise ValueError(f"submission {record.submission.submission_id} has no finished evaluation")
    scored = scoring_result(record)
    reasons = list(result.reasons)
    if result.correct and result.measured_tokens_per_sec is not None:
        claim = scoring.ineligibility_reason(replace(scored, logits_ok=None))
        if claim is not None:
            reasons.append(f"claim check: {claim}")
    if record.logits_reason and record.logits_ok is not None:
        reasons.append(f"logit check {'passed' if record.logits_ok else 'failed'}: {record.logits_reason}")
    reasons += result.notes
    return ApiReport(
        submission_id=record.submission.submission_id,
        verdict="passed" if scoring.is_eligible(scored) else "failed",
        correct=result.correct,
        logits_ok=record.logits_ok,
        measured_tokens_per_sec=result.measured_tokens_per_sec,
        benchmarks=dict(result.benchmarks),
        reasons=bounded_reasons(reasons),
        lengths=reported_lengths(result.report),
        content_hash=result.content_hash,
    )


@dataclass(frozen=True)
class WeightPlan:
    """The weights to set: places 1-4 by uid, and the unassigned share on the owner's uid.

    When the owner's hotkey holds no uid (``owner_uid`` None) the unassigned share goes nowhere
    (``dropped``) and the placed shares are set alone, scaled to sum 1.
    """

    ranking: scoring.Ranking
    weights: dict[int, float]  # uid -> weight; sums to 1 (empty: nothing to set)
    uids: dict[str, int]  # hotkey -> uid of every placed hotkey
    hotkeys: dict[int, str]  # uid -> hotkey of every uid in ``weights`` (checked on chain when submitting)
    owner_uid: int | None
    dropped: float  # the unassigned share not set because the owner's hotkey holds no uid
    unregistered: tuple[str, ...]  # hotkeys with results that are no longer registered (left out)


def plan_weights(
    results: Iterable[scoring.Result], metagraph: Metagraph, owner_uid: int | None, epsilon: float
) -> WeightPlan:
    """Rank the results of hotkeys registered now (others are dropped before ranking, so they hold
    no place) and turn the top-4 shares into uid weights; the unassigned share goes to ``owner_uid``,
    or, when it is None (the owner's hotkey holds no uid), nowhere: the placed shares are scaled to
    sum 1 (docs/rules.md section 5)."""
    uids = {neuron.hotkey: neuron.uid for neuron in metagraph.neurons}
    results = list(results)
    registered = [result for result in results if result.hotkey in uids]
    unregistered = tuple(sorted({result.hotkey for result in results if result.hotkey not in uids}))
    ranking = scoring.rank(registered, epsilon=epsilon)
    weights: dict[int, float] = {}
    for hotkey, share in ranking.weights.items():
        weights[uids[hotkey]] = weights.get(uids[hotkey], 0.0) + share
    dropped = 0.0
    if ranking.unassigned > 0 and owner_uid is not None:
        weights[owner_uid] = weights.get(owner_uid, 0.0) + ranking.unassigned
    elif ranking.unassigned > 0:
        dropped = ranking.unassigned
        placed = sum(weights.values())
        weights = {uid: weight / placed for uid, weight in weights.items()} if placed > 0 else {}
    holders = {neuron.uid: neuron.hotkey for neuron in metagraph.neurons}
    placed_uids = {placement.hotkey: uids[placement.hotkey] for placement in ranking.placements}
    return WeightPlan(
        ranking,
        weights,
        placed_uids,
        {uid: holders[uid] for uid in weights if uid in holders},
        owner_uid,
        dropped,
        unregistered,
    )


# The most uids a plan names: the four places and the owner.
MAX_WEIGHTED_UIDS = len(scoring.PLACE_SHARES) + 1


def weights_refusal(
    plan: WeightPlan, hyperparameters: SubnetHyperparameters, subnet_size: int, setter_uid: int
) -> str | None:
    """Why ``plan`` cannot be set as the rules split the weights on a subnet with these
    hyperparameters (None when it can): a share above ``max_weight_limit`` (the SDK would move the
    excess to the other uids, the chain refuse it), or fewer uids than ``min_allowed_weights``. A
    weight on the setter's own uid alone is exempt from both, as on chain."""
    if not plan.weights or list(plan.weights) == [setter_uid]:
        return None
    largest = max(plan.weights.values())
    if largest > hyperparameters.max_weight_share + 1e-9:
        return (
            f"the largest weight, {largest:.4f}, is above the subnet's max_weight_limit "
            f"({hyperparameters.max_weight_limit}, a share of {hyperparameters.max_weight_share:.4f}): the SDK "
            "would move the excess to the other uids, which QUASAR's split does not allow"
        )
    needed = min(subnet_size, hyperparameters.min_allowed_weights)
    if len(plan.weights) < needed:
        return (
            f"the subnet needs weights on at least {needed} uids (min_allowed_weights "
            f"{hyperparameters.min_allowed_weights}) and this epoch's split names {len(plan.weights)}"
        )
    return None


def weights_table(plan: WeightPlan) -> Table:
    """The ranking behind ``plan``: each placed uid's score, share and weight, and where the
    unassigned share goes; 80 columns wide (hotkeys shortened, tokens/s in M)."""
    table = compact_table(f"QUASAR weights (tie margin ε = {plan.ranking.epsilon:g})")
    for column in ("#", "uid", "hotkey", "sub", "league", "verified", "score", "share", "weight"):
        table.add_column(column, justify="left" if column in ("hotkey", "league") else "right", no_wrap=True)
    for placement in plan.ranking.placements:
        result = placement.result
        uid = plan.uids[placement.hotkey]
        table.add_row(
            str(placement.place),
            str(uid),
            short_hotkey(placement.hotkey),
            str(result.submission_id),
            scoring.league_for(result.target_sequence_length).name,
            compact_rate(scoring.verified_tokens_per_sec(result)),
            compact_rate(placement.weighted_score),
            f"{placement.share:.2f}",
            f"{plan.weights.get(uid, 0.0):.4f}",
        )
    if plan.ranking.unassigned > 0 and plan.owner_uid is not None:
        table.add_row(
            "-",
            str(plan.owner_uid),
            "owner",
            "",
            "unassigned",
            "",
            "",
            f"{plan.ranking.unassigned:.2f}",
            f"{plan.weights.get(plan.owner_uid, 0.0):.4f}",
        )
    elif plan.dropped > 0:
        table.add_row("-", "-", "owner", "", "no uid", "", "", f"{plan.dropped:.2f}", "-")
    if plan.ranking.unassigned > 0:
        table.caption = (
            "unassigned places go to the subnet owner's uid (burned)"
            if plan.owner_uid is not None
            else "unassigned places not set: the owner's hotkey holds no uid"
        )
        table.caption_justify = "left"
    return table
