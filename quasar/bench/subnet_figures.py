"""The simulated subnet's figures (quasar/bench/simulate_subnet.py), per round, from the API's
database and the simulation's ground truth."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from rich.table import Table
from sqlalchemy import select

from quasar import scheduling, scoring
from quasar.api.db import Database, EvaluationReport, Submission
from quasar.bench.subnet_actors import COPY, HONEST, World

# A round whose devices sat idle more than this share of their time while work waited for them ran
# slower than the validators it simulates (a validator's loop turns a device round in about a
# second of a 25 s evaluation): its late pairs are the machine's, and do not show the schedule's.
LAG_LIMIT = 0.10


@dataclass(frozen=True)
class RevealedSubmission:
    """A submission of the API's database once revealed: its round, ready time and claim are set
    then (``state`` stays the stored one: ready or superseded)."""

    id: int
    hotkey: str
    state: str
    submitted_at: float
    target_sequence_length: int
    round_id: int
    ready_at: float
    claimed_tokens_per_sec: float

    @classmethod
    def of(cls, row: Submission) -> RevealedSubmission:
        """``row`` as revealed; ValueError when it is not."""
        if row.round_id is None or row.ready_at is None or row.claimed_tokens_per_sec is None:
            raise ValueError(f"submission {row.id} ({row.state}) is not revealed")
        return cls(
            row.id,
            row.hotkey,
            row.state,
            row.submitted_at,
            row.target_sequence_length,
            row.round_id,
            row.ready_at,
            row.claimed_tokens_per_sec,
        )


@dataclass
class RoundFigures:
    round_id: int
    submissions: int  # honest
    superseded: int  # honest, replaced by a newer one of their hotkey before any report
    # honest: from a submission to the first evaluation of it or of a newer one of its hotkey,
    # median / p95 / max minutes
    waits_min: tuple[float, float, float] | None
    unevaluated: int  # honest, neither it nor a newer one of its hotkey evaluated at the end
    queue_mean: float  # the longest queue over the validators (sample_queue), sampled
    queue_max: int
    gpu_hours: float
    gpu_hours_not_placeable: float
    gpu_capacity_hours: float  # the validators' devices for the round
    idle_with_work: float  # share of the devices' time in the round idle while work waited (idle_with_work)
    newest_within_round: bool  # every validator evaluated every honest hotkey's newest within a round
    newest_worst_min: float
    newest_late: int  # (honest submission, validator) pairs past a round
    top4: list[str]
    true_top4: list[str]

    @property
    def top4_true(self) -> bool:
        return self.top4 == self.true_top4

    @property
    def lagged(self) -> bool:
        """The validators' loops, not their devices, set the pace: late pairs in this round say
        more about the machine running the simulation than about the schedule."""
        return self.idle_with_work > LAG_LIMIT


@dataclass
class RunFigures:
    backend: str
    miners: int
    spammers: int
    copiers: int
    validators: int
    workers: int
    eval_seconds: float
    round_blocks: int
    speedup: float
    wall_s: float
    rounds: list[RoundFigures]
    refused_copies: int
    miner_errors: dict[str, int]
    honest_wait_median_min: float | None


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def sample_queue(database: Database, validators: list[str], first_round: int) -> dict[str, int]:
    """Each validator's queue: ready submissions of the scheduled rounds it has not reported on."""
    with database.read() as session:
        ready = session.scalars(
            select(Submission.id).where(Submission.state == "ready", Submission.round_id >= first_round)
        ).all()
        reported = (
            session.execute(
                select(EvaluationReport.validator_hotkey, EvaluationReport.submission_id).where(
                    EvaluationReport.submission_id.in_(ready)
                )
            ).all()
            if ready
            else []
        )
    done = defaultdict(set)
    for validator, submission_id in reported:
        done[validator].add(submission_id)
    return {validator: len(set(ready) - done[validator]) for validator in validators}


def busy_seconds(starts: list[float], eval_s: float, begin: float, end: float) -> float:
    """Device-seconds of evaluations started at ``starts`` (each ``eval_s`` long) within [begin, end)."""
    return sum(max(0.0, min(start + eval_s, end) - max(start, begin)) for start in starts)


def idle_with_work(
    samples: list[tuple[float, dict[str, int]]],
    starts: dict[str, list[float]],
    workers: int,
    eval_s: float,
    until: float,
) -> float:
    """Device-seconds the validators' stand-in GPUs sat idle while the API had work for them.

    ``samples``: (when, each validator's queue) in time order, each standing until the next (the
    last until ``until``); ``starts``: per validator, when its evaluations started. A validator has
    work waiting while its queue is longer than what it may hold itself (a submission per device
    being evaluated, and as many evaluated but not yet reported); its devices idle then are idle
    for its loop's sake, not the schedule's: on a machine short of CPU, the loop's next step comes
    late, and at ``--speedup`` times compressed every real second of that is many simulated ones."""
    idle = 0.0
    for (begin, queues), end in zip(samples, [when for when, _ in samples[1:]] + [until], strict=True):
        for validator, waiting in queues.items():
            if end > begin and waiting > 2 * workers:
                used = busy_seconds(starts.get(validator, []), eval_s, begin, end)
                idle += max(0.0, workers * (end - begin) - used)
    return idle


def evaluations_of_newest(
    submissions: dict[int, RevealedSubmission], by_submission: dict[int, dict[str, float]], validators: list[str]
) -> dict[int, dict[str, float]]:
    """Per submission and validator: when the validator first reported on it or on a newer
    submission of the same hotkey (by ready time); a validator missing had done neither."""
    by_hotkey: dict[str, list[RevealedSubmission]] = defaultdict(list)
    for row in submissions.values():
        by_hotkey[row.hotkey].append(row)
    evaluated_by: dict[int, dict[str, float]] = {}
    for rows in by_hotkey.values():
        earliest: dict[str, float] = {}
        for row in sorted(rows, key=lambda row: (row.ready_at, row.id), reverse=True):
            for validator in validators:
                at = by_submission.get(row.id, {}).get(validator)
                if at is not None:
                    earliest[validator] = min(at, earliest.get(validator, math.inf))
            evaluated_by[row.id] = dict(earliest)
    return evaluated_by


def fourth_place_at(samples: list[tuple[float, float | None]], when: float) -> float | None:
    """The leaderboard's fourth place as last sampled at or before ``when`` (None: none yet)."""
    earlier = [fourth for at, fourth in samples if at <= when]
    return earlier[-1] if earlier else None


def figures_per_round(
    database: Database,
    world: World,
    validators: list[str],
    workers: int,
    first_round: int,
    rounds: int,
    round_s: float,
    eval_s: float,
    leaderboards: dict[int, list[str]],
    queue: dict[int, list[tuple[float, dict[str, int]]]],
    fourth_places: dict[int, list[tuple[float, float | None]]],
) -> tuple[list[RoundFigures], list[float]]:
    """Each round's figures from the API's database and the ground truth (module docstring), and
    every honest submission's wait (minutes) until it, or a newer submission of its hotkey, was
    first evaluated; the simulation's rounds are numbered from 0, the chain's from ``first_round``."""
    with database.read() as session:
        rows = session.scalars(select(Submission).where(Submission.round_id.is_not(None)))
        submissions = {row.id: RevealedSubmission.of(row) for row in rows}
        reports = session.execute(
            select(EvaluationReport.submission_id, EvaluationReport.validator_hotkey, EvaluationReport.reported_at)
        ).all()
    by_submission: dict[int, dict[str, float]] = defaultdict(dict)
    for submission_id, validator, reported_at in reports:
        by_submission[submission_id][validator] = reported_at
    kernels = {kernel.submission_id: kernel for kernel in world.kernels.values() if kernel.submission_id is not None}
    evaluated_at = defaultdict(list)  # round -> (kernel, its upper bound, when its evaluation started)
    started: dict[str, list[float]] = defaultdict(list)  # validator -> when its evaluations started
    for fork, commit, when, validator in world.evaluations:
        started[validator].append(when)
        kernel = world.kernels[(fork, commit)]
        row = None if kernel.submission_id is None else submissions.get(kernel.submission_id)
        if row is not None:
            bound = scheduling.upper_bound(row.claimed_tokens_per_sec, row.target_sequence_length)
            evaluated_at[row.round_id - first_round].append((kernel, bound, when))
    evaluated_by = evaluations_of_newest(submissions, by_submission, validators)
    figures, all_waits = [], []
    for round_id in range(rounds):
        mine = {sid: row for sid, row in submissions.items() if row.round_id == first_round + round_id}
        honest = [row for sid, row in mine.items() if kernels.get(sid) and kernels[sid].kind == HONEST]
        waits = sorted(
            (min(evaluated_by[row.id].values()) - row.ready_at) / 60 for row in honest if evaluated_by[row.id]
        )
        all_waits += waits
        # The ranking a perfect measurement would give what the validators judged (a superseded
        # kernel never was), by the subnet's own rules; copies are not ranked.
        truth = [
            scoring.Result(
                hotkey=row.hotkey,
                submission_id=sid,
                submitted_at=row.submitted_at,
                target_sequence_length=row.target_sequence_length,
                claimed_tokens_per_sec=row.claimed_tokens_per_sec,
                measured_tokens_per_sec=kernels[sid].true_speed,
                correct=True,
                logits_ok=True,
            )
            for sid, row in mine.items()
            if sid in kernels
            and kernels[sid].kind != COPY
            and len(by_submission.get(sid, ())) >= min(2, len(validators))
        ]
        true_top4 = [placement.hotkey for placement in scoring.rank(truth).placements[:4]]
        spent = evaluated_at[round_id]
        not_placeable = []
        for kernel, bound, when in spent:
            fourth = fourth_place_at(fourth_places.get(round_id, []), when)
            if kernel.kind == COPY or (fourth is not None and bound < fourth):
                not_placeable.append(kernel)
        # Each validator, for each honest submission: how long until it evaluated it or a newer one
        # of the same hotkey (a newer one supersedes it: evaluating that is evaluating the newest).
        delays = [
            evaluated_by[row.id].get(validator, math.inf) - row.ready_at for row in honest for validator in validators
        ]
        worst = max(delays, default=0.0)
        samples = queue.get(round_id, [])
        longest = [max(queues.values(), default=0) for _, queues in samples]
        # The round's last sample stands until the next round's first.
        until = queue[round_id + 1][0][0] if queue.get(round_id + 1) else samples[-1][0] if samples else 0.0
        idle = idle_with_work(samples, started, workers, eval_s, until)
        figures.append(
            RoundFigures(
                round_id=round_id,
                submissions=len(honest),
                superseded=sum(1 for row in honest if row.state == "superseded"),
                waits_min=(statistics.median(waits), percentile(waits, 0.95), waits[-1]) if waits else None,
                unevaluated=sum(1 for row in honest if not evaluated_by[row.id]),
                queue_mean=statistics.fmean(longest) if longest else 0.0,
                queue_max=max(longest, default=0),
                gpu_hours=len(spent) * eval_s / 3600,
                gpu_hours_not_placeable=len(not_placeable) * eval_s / 3600,
                gpu_capacity_hours=len(validators) * workers * round_s / 3600,
                idle_with_work=idle / (len(validators) * workers * round_s),
                newest_within_round=worst <= round_s,
                newest_worst_min=worst / 60,
                newest_late=sum(1 for delay in delays if delay > round_s),
                top4=leaderboards.get(round_id, []),
                true_top4=true_top4,
            )
        )
    return figures, all_waits


def figures_table(run_figures: RunFigures) -> Table:
    """One row per round, in 80 columns."""
    table = Table(
        title=f"{run_figures.backend}: per round, in simulated time. queue: mean/max; p50 p95 max: "
        f"minutes to an honest submission's first evaluation; GPU: share of the devices' time "
        f"used; idle: share of it idle while work waited (the loops lagging); no place: share of "
        f"the used on what could not place; late: (honest submission, validator) pairs evaluated "
        f"after a round, or never",
        title_justify="left",
    )
    for column in ("round", "queue", "p50", "p95", "max", "GPU", "idle", "no place", "late", "top 4"):
        table.add_column(column, justify="left" if column in ("round", "top 4") else "right")
    for item in run_figures.rounds:
        waits = ("-", "-", "-") if item.waits_min is None else tuple(f"{value:.0f}" for value in item.waits_min)
        share = item.gpu_hours_not_placeable / item.gpu_hours if item.gpu_hours else 0.0
        used = item.gpu_hours / item.gpu_capacity_hours if item.gpu_capacity_hours else 0.0
        table.add_row(
            str(item.round_id + 1),
            f"{item.queue_mean:.0f}/{item.queue_max}",
            *waits,
            f"{used:.0%}",
            f"{item.idle_with_work:.0%}",
            f"{share:.0%}",
            str(item.newest_late),
            "true" if item.top4_true else "NOT",
        )
    return table


def lag_verdict(run_figures: RunFigures) -> str | None:
    """What to make of late pairs in rounds where the loops lagged (:attr:`RoundFigures.lagged`):
    None when there are none. A round with no late pair holds even so (its devices did less
    than they could, and still kept up)."""
    lagged = [item for item in run_figures.rounds if item.newest_late and item.lagged]
    if not lagged:
        return None
    rounds = ", ".join(f"{item.round_id + 1} ({item.idle_with_work:.0%} idle)" for item in lagged)
    return (
        f"not shown: late pairs in round(s) {rounds} came while the devices sat idle more than "
        f"{LAG_LIMIT:.0%} of their time with work waiting; this machine, not the schedule, set the "
        f"pace: run again at a lower --speedup or on a less loaded machine"
    )
