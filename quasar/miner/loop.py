"""The miner's optimization loop.

One cycle:

1. sync the workspace's clone with the fork (repairing a candidate a crash left applied);
2. pick the target length: ``TARGET_SEQUENCE_LENGTH``, or the candidate length with the best
   weighted score (tokens/sec × league multiplier) among those the GPU runs correctly, found
   by one evaluation over all of them (redone when the best commit changes);
3. measure the best commit (the baseline) with the harness, as validators will;
4. up to ``AGENT_ITERATIONS`` times: ask the next strategy for a candidate, apply it, run the
   import check and the evaluation; if it passes and is faster than the best by
   ``MIN_IMPROVEMENT`` (or by the two measurements' spread, when that is larger), commit it and
   submit it (the submission pushes it: a kept commit is not public before it is submitted, so
   nobody can claim it first, docs/rules.md section 5); otherwise roll it back. Every attempt is
   recorded in the state, so none is tried twice. A strategy failing in a way it does not report
   as a StrategyError (a bug, input it does not handle) has that failure logged with its
   traceback and recorded as the attempt's error, and sits out the rest of the cycle;
5. wait ``OPTIMIZATION_INTERVAL`` seconds, revealing a pending commitment when it is due and
   logging each validator's verdict on the miner's submissions as it arrives.

No exception from one cycle ends the loop; the next cycle starts from a clean checkout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from quasar import scoring
from quasar.evaluate import EvaluationOptions, EvaluationReport, ProgressEvent, evaluate
from quasar.evaluate.report import OK
from quasar.imports import QUASAR_DIR, validate_repo
from quasar.miner.files import replace_file
from quasar.miner.state import Measurement, MinerState, StateStore
from quasar.miner.status import VerdictWatcher
from quasar.miner.strategies import (
    ERROR,
    FAILED,
    KEPT,
    REJECTED,
    SLOWER,
    AgentStrategy,
    Attempt,
    Candidate,
    EditRejected,
    Strategy,
    StrategyError,
)
from quasar.miner.strategies.base import printable_line
from quasar.miner.submission import DEFAULT_CLAIM_SHARE, Submitter, choose_target_length, measurement_from_report
from quasar.miner.workspace import ForkClone
from quasar.terminal import compact_rate, compact_table

logger = logging.getLogger(__name__)

# One length per league: its shortest (the 100k league's is 100k itself).
DEFAULT_CANDIDATE_LENGTHS = (100_000,) + tuple(league.min_length for league in scoring.LEAGUES[1:])
WAIT_STEP_S = 15.0
MAX_REASONS_SHOWN = 3
MAX_UNEXPECTED_REASON = 300


@dataclass(frozen=True)
class LoopConfig:
    """How the loop runs (from settings: AGENT_ITERATIONS, OPTIMIZATION_INTERVAL, MIN_IMPROVEMENT,
    TARGET_SEQUENCE_LENGTH, SUBMISSION_MODE, CLAIM_SHARE)."""

    iterations: int
    interval_s: float
    min_improvement: float
    target_seq_len: int | None = None
    candidate_lengths: tuple[int, ...] = DEFAULT_CANDIDATE_LENGTHS
    claim_share: float = DEFAULT_CLAIM_SHARE


@dataclass
class CycleSummary:
    """What one cycle did."""

    target_seq_len: int | None = None
    baseline: Measurement | None = None
    attempts: list[Attempt] = field(default_factory=list)
    best: Measurement | None = None
    submissions: int = 0


class Evaluator:
    """The evaluation harness with ``options``, a progress bar on terminals, and the last report
    kept as ``reports_dir/latest.json``."""

    def __init__(self, options: EvaluationOptions, reports_dir: Path | None = None, console: Console | None = None):
        self.options = options
        self.reports_dir = reports_dir
        self.console = console or Console(stderr=True)

    def __call__(
        self, repo: Path, target: int, seq_lens: Sequence[int] | None = None, label: str = "evaluation"
    ) -> EvaluationReport:
        options = self.options if seq_lens is None else replace(self.options, seq_lens=tuple(seq_lens))
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, transient=True, disable=not self.console.is_terminal) as bar:
            task = bar.add_task(label, total=None)

            def show(event: ProgressEvent) -> None:
                where = f" T={event.seq_len:,}" if event.seq_len else ""
                bar.update(
                    task,
                    description=f"{label[:60]}: {event.stage}{where}",
                    completed=event.done,
                    total=event.total or None,
                )

            report = evaluate(repo, target, None, options, show)
        if self.reports_dir is not None:
            self.save(report, "latest")
        return report

    def save(self, report: EvaluationReport, name: str) -> None:
        """Write ``report`` as ``reports_dir/NAME.json`` (whole or not at all); a full disk raises an
        OSError naming that file and leaves the previous one."""
        if self.reports_dir is None:
            return
        replace_file(self.reports_dir / f"{name}.json", report.to_json(), "save the evaluation report", mode=0o644)


def required_gain(min_improvement: float, best_cv: float | None, candidate_cv: float | None) -> float:
    """The relative speed-up a candidate must show to be kept: ``min_improvement``, or more when
    the two measurements are noisy (the sum of their coefficients of variation), so a candidate
    is never kept for a difference the benchmark's own spread could explain."""
    return max(min_improvement, (best_cv or 0.0) + (candidate_cv or 0.0))


def _reasons(report: EvaluationReport) -> str:
    shown = report.reasons[:MAX_REASONS_SHOWN]
    more = len(report.reasons) - len(shown)
    return "; ".join(shown) + (f" (and {more} more)" if more > 0 else "")


class Miner:
    """The loop over one workspace clone (see the module docstring)."""

    def __init__(
        self,
        clone: ForkClone,
        strategies: Sequence[Strategy],
        evaluate_fork: Evaluator,
        submitter: Submitter,
        state: MinerState,
        store: StateStore,
        config: LoopConfig,
        console: Console | None = None,
        before_cycle: Callable[[], None] | None = None,
        verdicts: VerdictWatcher | None = None,
    ):
        if not strategies:
            raise ValueError("the miner needs at least one strategy")
        self.clone = clone
        self.strategies = list(strategies)
        self.evaluate = evaluate_fork
        self.submitter = submitter
        self.state = state
        self.store = store
        self.config = config
        self.console = console or Console()
        self.before_cycle = before_cycle
        self.verdicts = verdicts
        self._turn = 0

    # --- one cycle ---

    def run_cycle(self, stop: threading.Event | None = None) -> CycleSummary:
        """Run one cycle (module docstring); returns what it did."""
        stop = stop or threading.Event()
        summary = CycleSummary()
        if self.before_cycle is not None:
            self.before_cycle()
        head = self.clone.sync()
        self.submitter.advance()
        target = self._choose_target(head)
        summary.target_seq_len = target
        if target is None:
            return summary
        report = self.evaluate(self.clone.path, target, label=f"baseline {head[:12]}")
        baseline = measurement_from_report(report, head, self.config.claim_share)
        summary.baseline = summary.best = baseline
        if baseline is None:
            logger.error(
                "the fork's head %s fails evaluation at T=%d: %s. Candidates are still tried; to start "
                "from correct kernels, push the starter fork (quasar starter-fork DIR) to the fork",
                head[:12],
                target,
                _reasons(report),
            )
        else:
            logger.info(
                "baseline %s: %s tokens/s at T=%d (claim %s)",
                head[:12],
                f"{baseline.tokens_per_sec:,.0f}",
                target,
                f"{baseline.claim:,.0f}",
            )
            self.state.best = baseline
            self.store.save(self.state)
            self.evaluate.save(report, "best")
            summary.submissions += self.submitter.submit_if_better(baseline)
        for configured in self.strategies:
            if isinstance(configured, AgentStrategy):
                configured.target_seq_len = target
        exhausted: set[str] = set()
        for _ in range(self.config.iterations):
            if stop.is_set():
                break
            self.submitter.advance()
            strategy = self._next_strategy(exhausted)
            if strategy is None:
                logger.info("every strategy has tried all it has for now")
                break
            attempt = self._attempt(strategy, target, summary.best, exhausted)
            if attempt is None:
                exhausted.add(strategy.name)
                continue
            summary.attempts.append(attempt)
            self.state.record(attempt)
            self.store.save(self.state)
            if attempt.outcome == KEPT and self.state.best is not None:
                summary.best = self.state.best
                summary.submissions += self.submitter.submit_if_better(self.state.best)
        if summary.best is not None:
            summary.submissions += self.submitter.submit_if_better(summary.best)
        self._print_cycle(summary)
        return summary

    def _next_strategy(self, exhausted: set[str]) -> Strategy | None:
        for _ in range(len(self.strategies)):
            strategy = self.strategies[self._turn % len(self.strategies)]
            self._turn += 1
            if strategy.name not in exhausted:
                return strategy
        return None

    def _choose_target(self, head: str) -> int | None:
        if self.config.target_seq_len:
            return self.config.target_seq_len
        if self.state.target_seq_len and self.state.target_commit == head:
            return self.state.target_seq_len
        lengths = sorted(set(self.config.candidate_lengths))
        logger.info("choosing the target length among %s", ", ".join(f"{n:,}" for n in lengths))
        report = self.evaluate(self.clone.path, lengths[-1], seq_lens=lengths, label="choosing the target length")
        self._print_lengths(report)
        chosen = choose_target_length(report)
        if chosen is None:
            logger.error("no candidate length ran correctly on this GPU: %s", _reasons(report))
            return self.state.target_seq_len
        self.state.target_seq_len, self.state.target_commit = chosen, head
        self.store.save(self.state)
        league = scoring.league_for(chosen)
        logger.info("target length %s (league %s, x%g)", f"{chosen:,}", league.name, league.multiplier)
        return chosen

    def _attempt(
        self, strategy: Strategy, target: int, best: Measurement | None, exhausted: set[str]
    ) -> Attempt | None:
        """Ask ``strategy`` for a candidate and try it; None when the strategy has nothing left.

        A strategy that fails unexpectedly (not a StrategyError) sits out the rest of the cycle
        (added to ``exhausted``): the same input would fail it again."""
        try:
            candidate = strategy.propose(self.clone.path, self.state.attempts)
        except StrategyError as error:
            logger.warning("%s: %s", strategy.name, error)
            return self._no_candidate(
                strategy, REJECTED if isinstance(error, EditRejected) else ERROR, target, best, str(error)
            )
        except Exception as error:  # a strategy's bug is that attempt's error, not the cycle's end
            logger.exception("%s failed unexpectedly (a bug, or input it does not handle)", strategy.name)
            reason = printable_line(f"{type(error).__name__}: {error}")[:MAX_UNEXPECTED_REASON]
            exhausted.add(strategy.name)
            return self._no_candidate(strategy, ERROR, target, best, reason)
        if candidate is None:
            return None
        logger.info("trying %s: %s", candidate.strategy, candidate.description)
        return self._try(candidate, target, best)

    @staticmethod
    def _no_candidate(strategy: Strategy, outcome: str, target: int, best: Measurement | None, reason: str) -> Attempt:
        return Attempt(
            strategy.name,
            f"{strategy.name}:{outcome}:{time.time()}",
            "(no candidate)",
            outcome,
            target,
            None,
            best.tokens_per_sec if best else None,
            reason,
        )

    def _try(self, candidate: Candidate, target: int, best: Measurement | None) -> Attempt:
        best_tps = best.tokens_per_sec if best else None

        def attempt(
            outcome: str, measured: float | None = None, reason: str = "", commit: str | None = None
        ) -> Attempt:
            return Attempt(
                candidate.strategy,
                candidate.key,
                candidate.description,
                outcome,
                target,
                measured,
                best_tps,
                reason,
                commit,
            )

        try:
            applied = candidate.apply(self.clone.path)
        except EditRejected as error:
            return attempt(REJECTED, reason=str(error))
        kept = False
        try:
            imports = validate_repo(self.clone.path)
            if not imports.ok:
                return attempt(REJECTED, reason="import check: " + "; ".join(str(f) for f in imports.errors[:3]))
            report = self.evaluate(self.clone.path, target, label=candidate.description)
            measured = report.measured_tokens_per_sec
            if not report.passed:
                return attempt(FAILED, measured, _reasons(report))
            assert measured is not None
            if best is not None and best_tps is not None:
                needed = required_gain(self.config.min_improvement, best.cv, report.lengths[str(target)].cv)
                if not measured > best_tps * (1 + needed):
                    gain = measured / best_tps - 1
                    return attempt(SLOWER, measured, f"{gain:+.1%} vs best; needs more than {needed:+.1%}")
            commit = self.clone.commit(candidate.paths, self._message(candidate, measured, best_tps, target, report))
            kept = True
            measurement = measurement_from_report(report, commit, self.config.claim_share)
            self.state.best = measurement
            self.store.save(self.state)
            self.evaluate.save(report, "best")
            logger.info(
                "kept %s as %s: %s tokens/s at T=%d", candidate.description, commit[:12], f"{measured:,.0f}", target
            )
            return attempt(KEPT, measured, commit=commit)
        finally:
            if not kept:
                applied.rollback()
                if any(p.startswith(QUASAR_DIR + "/") for p in self.clone.changed_paths()):
                    self.clone.restore_clean()

    @staticmethod
    def _message(
        candidate: Candidate, measured: float, best: float | None, target: int, report: EvaluationReport
    ) -> str:
        before = f"was {best:,.0f}, {measured / best - 1:+.1%}" if best else "the first passing version"
        device = report.device_name or report.device
        return (
            f"{candidate.strategy}: {candidate.description}\n\n"
            f"QUASAR miner: {measured:,.0f} tokens/s at T={target:,} on {device} ({before}).\n"
        )

    # --- forever ---

    def run(self, stop: threading.Event) -> None:
        """Run cycles until ``stop`` is set; an error in a cycle is logged and the loop goes on."""
        while not stop.is_set():
            try:
                self.run_cycle(stop)
            except Exception as error:  # one bad cycle must not end the miner
                logger.error("the cycle failed: %s", error, exc_info=logger.isEnabledFor(logging.DEBUG))
            self.wait(stop, self.config.interval_s)

    def wait(self, stop: threading.Event, seconds: float) -> None:
        """Sleep ``seconds`` (or until ``stop``), revealing a pending commitment when due."""
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            try:
                self.submitter.advance()
            except Exception as error:  # a failed reveal is retried at the next step
                logger.error("advancing the pending reveal failed: %s", error)
            if self.verdicts is not None:
                try:
                    self.verdicts.poll()
                except Exception as error:  # verdicts are only shown; the next step reads them again
                    logger.error("reading this miner's verdicts from the API failed: %s", error)
            left = deadline - time.monotonic()
            if left <= 0:
                return
            stop.wait(min(WAIT_STEP_S, left))

    # --- tables ---

    def _print_lengths(self, report: EvaluationReport) -> None:
        table = compact_table("target length candidates")
        for column in ("T", "league", "status", "tok/s", "weighted", "correct"):
            table.add_column(column, justify="left" if column in ("league", "status") else "right")
        for key in sorted(report.lengths, key=int):
            item = report.lengths[key]
            league = scoring.league_for(item.seq_len)
            weighted = item.tokens_per_sec * league.multiplier if item.status == OK and item.tokens_per_sec else None
            table.add_row(
                f"{item.seq_len:,}",
                f"{league.name} x{league.multiplier:g}",
                item.status,
                compact_rate(item.tokens_per_sec) if item.tokens_per_sec else "-",
                compact_rate(weighted) if weighted else "-",
                "-" if item.correct is None else ("yes" if item.correct else "no"),
            )
        self.console.print(table)

    def _print_cycle(self, summary: CycleSummary) -> None:
        table = compact_table(f"cycle at T={summary.target_seq_len or 0:,}")
        for column in ("#", "strategy", "candidate", "outcome", "tok/s", "vs best"):
            table.add_column(
                column,
                justify="right" if column in ("#", "tok/s", "vs best") else "left",
                no_wrap=column != "candidate",
            )
        reasons = []
        for number, attempt in enumerate(summary.attempts, 1):
            measured = attempt.measured_tokens_per_sec
            relative = (
                f"{measured / attempt.best_tokens_per_sec - 1:+.1%}"
                if measured and attempt.best_tokens_per_sec
                else "-"
            )
            table.add_row(
                str(number),
                escape(attempt.strategy),
                escape(attempt.description),
                escape(attempt.outcome),
                compact_rate(measured) if measured else "-",
                relative,
            )
            if attempt.reason:
                reasons.append(f"{number}: {escape(attempt.reason)}")
        self.console.print(table)
        for reason in reasons:
            self.console.print(reason, highlight=False)
        best = summary.best
        if best is not None:
            self.console.print(
                f"best {best.commit[:12]}: {best.tokens_per_sec:,.0f} tokens/s at "
                f"T={best.target_seq_len:,}, claim {best.claim:,.0f}, weighted "
                f"{best.weighted_score:,.0f}; {summary.submissions} submission(s) this cycle"
            )
