"""The validator loop: sync, fetch, evaluate, check logits, report, set weights; again.

One :meth:`Validator.step` does each phase once, in this order:

1. sync the metagraph from the chain, and follow the submission API where the subnet owner moves it
   (its location on chain read again every few minutes: quasar/api/lookup.py);
2. collect evaluations that ended: a result is stored for good, an error of this validator is
   retried (quasar/validator/state.py);
3. challenge the miner's inference endpoint of each submission whose evaluation passed, only
   while no benchmark runs on the reference model's device (so a check never disturbs a timing);
4. report each evaluated and checked submission to the API, for at most REPORT_BUDGET_S a step
   (quasar/validator/reporting.py);
5. fetch from the API as much work as the idle devices can start now, no more: the API's schedule
   (quasar/scheduling.py) picks what is worth a GPU at the moment it is asked, so work fetched
   ahead would be evaluated in an order the schedule no longer holds; record each new submission
   in the state (a finished (fork, commit, target) is never evaluated again), once checked
   (quasar/validator/intake.py);
6. start evaluations on idle devices: one at a time per device, never two of one fork at once;
7. with ``VALIDATOR_ROLE=primary``, add the results that the hotkey's other processes (workers,
   on this host or others) reported, as the API holds them (``GET /validators/{hotkey}/reports``,
   from the last one read: quasar/validator/intake.py, report_cursor.py);
8. every EPOCH_BLOCKS chain blocks, rank this validator's own results (quasar/scoring.py) and set
   weights (quasar/validator/weight_setting.py): places 1-4 by uid, the unassigned share to
   the subnet owner's uid, or, when the owner's hotkey holds no uid, the placed shares alone. A
   worker (``VALIDATOR_ROLE=worker``) never sets weights: its hotkey's primary does.

A phase that raises is logged and the step goes on; so does the loop. :meth:`run_forever` steps
until SIGINT/SIGTERM, then stops running evaluations (their sandboxes are killed), puts them back
to pending and returns.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence

from quasar.api.client import ApiClient
from quasar.chain.base import Chain, Metagraph
from quasar.config import Settings
from quasar.errors import QuasarError
from quasar.log import Repeats
from quasar.validator.devices import Device
from quasar.validator.evaluator import CANCELLED, EvaluationOutcome, Evaluator, RunningEvaluation
from quasar.validator.intake import import_results, record_work
from quasar.validator.logit_check import LogitChecker, why_logit_checks_wait
from quasar.validator.records import SubmissionRecord
from quasar.validator.reporting import REPORT_BUDGET_S, report_ready
from quasar.validator.results import scoring_result
from quasar.validator.state import ValidatorState
from quasar.validator.state_files import ABANDONED, FAILED, PASSED, SKIPPED
from quasar.validator.steps import StepSummary, one_item
from quasar.validator.weight_setting import LAST_WEIGHTS_BLOCK, WeightSetter

logger = logging.getLogger(__name__)

# Seconds running evaluations get to stop cleanly (kill their sandbox) before they are killed.
STOP_GRACE_S = 20.0
POLL_S = 0.5
# However quiet the subnet, a running validator says where it stands this often (one line).
HEARTBEAT_S = 600.0
PRIMARY, WORKER = "primary", "worker"


class StopRequested(QuasarError):
    """Raised by :meth:`Validator.pause` once the validator is asked to stop."""


class Validator:
    """The validator of ``wallet``'s hotkey. Every collaborator is passed in, so tests drive it
    step by step against a dev chain, a real API and real evaluations."""

    def __init__(
        self,
        settings: Settings,
        chain: Chain,
        api: ApiClient,
        wallet,
        evaluator: Evaluator,
        logit_checker: LogitChecker,
        state: ValidatorState,
        *,
        devices: Sequence[Device],
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        interval_s: float | None = None,
        heartbeat_s: float = HEARTBEAT_S,
        report_budget_s: float = REPORT_BUDGET_S,
        follow_api: Callable[[], None] | None = None,
    ):
        if not devices:
            raise ValueError("a validator needs at least one device to evaluate on")
        self.settings = settings
        self.chain = chain
        self.api = api
        self.wallet = wallet
        self.hotkey = wallet.hotkey.ss58_address
        self.evaluator = evaluator
        self.logit_checker = logit_checker
        self.state = state
        self.devices = list(devices)
        # ``clock`` gives the times the state stores (the wall clock's); ``monotonic`` measures intervals,
        # which a step of the wall clock (NTP, an operator's date -s) must not lengthen or cut short.
        self.clock = clock
        self.interval_s = interval_s if interval_s is not None else max(1.0, min(12.0, chain.block_time_s))
        self.heartbeat_s = heartbeat_s
        self.report_budget_s = report_budget_s
        self.follow_api = follow_api  # keeps ``api`` where the subnet owner publishes it (ApiFollower)
        self.allow_local_forks = settings.local_forks_allowed
        self.metagraph: Metagraph | None = None
        self.running: dict[str, RunningEvaluation] = {}  # device name -> its evaluation
        self._stop = threading.Event()
        self.weights = WeightSetter(settings, chain, wallet, state, monotonic=monotonic)
        self.repeats = Repeats(logger, clock=monotonic)  # keys: the phases' names, "logit wait" and "reports"

    # --- control ---

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Finish the current phase, then stop (what SIGINT and SIGTERM do)."""
        self._stop.set()

    def pause(self, seconds: float) -> None:
        """Wait ``seconds``; raise :class:`StopRequested` as soon as the validator is asked to stop.
        The logit checker's wait between tries (quasar/validator/cli.py): a miner answering 503
        forever otherwise held a stop for those waits, past pm2's kill_timeout."""
        if self._stop.wait(seconds):
            raise StopRequested

    @property
    def idle(self) -> bool:
        """Nothing running and nothing left to evaluate, check or report."""
        return not self.running and self.state.open_submissions() == 0

    def step(self) -> StepSummary:
        """One iteration of every phase (see the module docstring); never raises for a phase's failure."""
        summary = StepSummary()
        phases = [
            ("sync", self._sync),
            ("collect", self._collect),
            ("logit checks", self._check_logits),
            ("report", self._report),
            ("fetch", self._fetch),
            ("start evaluations", self._start_evaluations),
        ]
        if self.settings.validator_role == PRIMARY:
            phases.append(("import results", self._import_results))
        if self.settings.validator_role != WORKER:
            phases.append(("weights", self._maybe_set_weights))
        for name, phase in phases:
            if self.stopping:
                break
            try:
                phase(summary)
                self.repeats.ended(name, f"validator step: {name} works again")
            except Exception as error:  # one phase's failure must not end the loop
                said = f"{type(error).__name__}: {error}"  # a timeout's or an assert's message is empty
                # A QuasarError's message says what failed and the cure (the API out of reach): a
                # traceback, 28 lines under it, is for what no code foresaw.
                unforeseen = None if isinstance(error, QuasarError) else error
                self.repeats.say(name, logging.ERROR, f"validator step: {name} failed; going on: {said}", unforeseen)
                summary.failed_phases.append(name)
        return summary

    def run_forever(self) -> None:
        """Step every ``interval_s`` (sooner when an evaluation ends) until stopped by
        :meth:`request_stop`, SIGINT or SIGTERM; then stop running evaluations cleanly."""
        logger.info(
            "validator %s on %s subnet %d: evaluating on %s; weights every %d blocks",
            self.hotkey,
            self.settings.network,
            self.chain.netuid,
            ", ".join(device.name for device in self.devices),
            self.settings.epoch_blocks,
        )
        with self._signals_stop():
            try:
                last_heartbeat = time.monotonic()
                while not self.stopping:
                    self.step()
                    if time.monotonic() - last_heartbeat >= self.heartbeat_s:
                        logger.info("%s", self.status_line())
                        last_heartbeat = time.monotonic()
                    self._sleep(self.interval_s)
            finally:
                self.shutdown()
        logger.info("validator stopped")

    def status_line(self) -> str:
        """Where the validator stands: the block, evaluations running, submissions open and when
        weights are next due (the heartbeat :meth:`run_forever` logs every ``heartbeat_s``)."""
        block = self.metagraph.block if self.metagraph is not None else None
        stored = self.state.get_meta(LAST_WEIGHTS_BLOCK)
        due = "at the next step" if stored is None else f"after block {int(stored) + self.weights.interval}"
        return (
            f"at block {block if block is not None else '?'}: {len(self.running)} evaluation(s) running, "
            f"{self.state.open_submissions()} submission(s) open; weights due {due}"
        )

    def run_until_idle(self, timeout_s: float) -> None:
        """Step until :attr:`idle` (tests and one-off runs); TimeoutError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.step()
            if self.idle:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the validator was not idle after {timeout_s:g} s")
            self._sleep(min(self.interval_s, max(0.0, deadline - time.monotonic())))

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop every running evaluation (cleanly within ``grace_s``, then by force) and put it
        back to pending without counting an attempt; a result that arrived meanwhile is kept."""
        running = list(self.running.values())
        if running:
            logger.info("stopping %d running evaluation(s)", len(running))
        for evaluation in running:
            evaluation.cancel()
        deadline = time.monotonic() + grace_s
        while any(evaluation.poll() is None for evaluation in running) and time.monotonic() < deadline:
            time.sleep(0.1)
        for evaluation in running:
            if evaluation.poll() is None:
                logger.warning("evaluation of %s did not stop within %g s; killing it", evaluation.key, grace_s)
                evaluation.kill()
            outcome = evaluation.poll()
            if outcome is not None and outcome.result is not None:
                self.state.finish_evaluation(evaluation.key, outcome.result, self.clock())
            else:
                self.state.cancel_evaluation(evaluation.key)
        self.running.clear()

    @contextlib.contextmanager
    def _signals_stop(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, _frame) -> None:
            logger.info("%s received: stopping after the current phase", signal.Signals(signum).name)
            self.request_stop()

        previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, less when stopped or when a running evaluation ends."""
        deadline = time.monotonic() + seconds
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or any(evaluation.poll() is not None for evaluation in self.running.values()):
                return
            self._stop.wait(min(POLL_S, remaining))

    # --- phases ---

    def _sync(self, summary: StepSummary) -> None:
        self.metagraph = self.chain.metagraph()
        if self.follow_api is not None:
            self.follow_api()

    def _fetch(self, summary: StepSummary) -> None:
        wanted = len(self.devices) - len(self.running) - len(self.state.pending_evaluations(self.clock()))
        if wanted <= 0:
            return
        batch = self.api.fetch_work(limit=wanted)
        if len(batch.items) > wanted:
            logger.warning(
                "the API sent %d work items where %d were asked for; the first %d are taken",
                len(batch.items),
                wanted,
                wanted,
            )
        for item in batch.items[:wanted]:
            with one_item("recording a work item"):
                record_work(self.state, item, self.allow_local_forks, self.clock, summary)

    def _collect(self, summary: StepSummary) -> None:
        for device_name, evaluation in list(self.running.items()):
            outcome = evaluation.poll()
            if outcome is None:
                continue
            with one_item(f"recording the evaluation of {evaluation.key}"):
                self._record_outcome(evaluation, outcome, summary)
                del self.running[device_name]  # only once recorded: otherwise tried again next step

    def _record_outcome(self, evaluation: RunningEvaluation, outcome: EvaluationOutcome, summary: StepSummary) -> None:
        key, now = evaluation.key, self.clock()
        if outcome.result is not None:
            self.state.finish_evaluation(key, outcome.result, now)
            result = outcome.result
            measured = "-" if result.measured_tokens_per_sec is None else f"{result.measured_tokens_per_sec:,.0f}"
            logger.info(
                "evaluation of %s on %s: %s, %s tokens/s at the target%s",
                key,
                evaluation.device.name,
                "correct" if result.correct else "FAILED",
                measured,
                "" if result.correct else f" ({'; '.join(result.reasons)})",
            )
        elif outcome.error == CANCELLED:
            self.state.cancel_evaluation(key)
        else:
            status = self.state.fail_attempt(key, outcome.error or "unknown error", now)
            summary.retried.append(key)
            if status == ABANDONED:
                logger.error(
                    "evaluation of %s failed on this validator's side too often; abandoned (not reported, "
                    "not ranked): %s",
                    key,
                    outcome.error,
                )
            else:
                logger.warning(
                    "evaluation of %s failed on this validator's side; it runs again: %s", key, outcome.error
                )

    def _check_logits(self, summary: StepSummary) -> None:
        if self.metagraph is None or self.devices[0].name in self.running:
            return
        records = self.state.needing_logit_check()
        waiting = why_logit_checks_wait(self.api) if records else None
        if waiting is not None:
            self.repeats.say("logit wait", logging.ERROR, f"logit checks wait for a later step: {waiting}")
            return
        self.repeats.ended("logit wait")
        for record in records:
            if self.stopping:
                return
            # A failure here is this validator's: the check runs again next step.
            with one_item(f"the logit check of submission {record.submission.submission_id}"):
                try:
                    outcome, reason = self._logit_outcome(record, self.metagraph)
                except StopRequested:
                    # Nothing recorded: a stop is no verdict on the miner; the check runs after the restart.
                    logger.info(
                        "logit check of submission %d given up: the validator is stopping",
                        record.submission.submission_id,
                    )
                    return
                self.state.record_logits(record.submission.submission_id, outcome, reason, self.clock())
                log = logger.debug if outcome != FAILED else logger.warning
                log(
                    "logit check of submission %d from %s: %s (%s)",
                    record.submission.submission_id,
                    record.submission.hotkey,
                    outcome,
                    reason,
                )

    def _logit_outcome(self, record: SubmissionRecord, metagraph: Metagraph) -> tuple[str, str]:
        result = record.evaluation.result
        if result is None or not result.correct:
            return SKIPPED, "not checked: the evaluation failed"
        hotkey = record.submission.hotkey
        neuron = metagraph.by_hotkey(hotkey)
        if neuron is None:
            return FAILED, f"hotkey {hotkey} is not registered on subnet {metagraph.netuid}"
        if neuron.endpoint is None:
            return FAILED, f"hotkey {hotkey} (uid {neuron.uid}) published no inference endpoint on chain"
        check = self.logit_checker.check(neuron.endpoint.base_url, hotkey)
        return (PASSED if check.passed else FAILED), check.reason

    def _report(self, summary: StepSummary) -> None:
        report_ready(self.api, self.state, self.repeats, self.clock, self.report_budget_s, self._stop.is_set, summary)

    def _import_results(self, summary: StepSummary) -> None:
        """Add what the hotkey's other processes reported since the last look (module docstring, 7)."""
        import_results(self.api, self.state, self.hotkey, self.allow_local_forks, self.clock, summary)

    def _start_evaluations(self, summary: StepSummary) -> None:
        idle = [device for device in self.devices if device.name not in self.running]
        if not idle:
            return
        # One fork checkout at a time: a worker deletes its checkout when it ends.
        busy = {(evaluation.key.fork_url, evaluation.key.commit_hash) for evaluation in self.running.values()}
        for key in self.state.pending_evaluations(self.clock()):
            if not idle or self.stopping:
                return
            if (key.fork_url, key.commit_hash) in busy:
                continue
            device = idle.pop(0)
            attempt = self.state.start_evaluation(key, device.name, self.clock())
            try:
                self.running[device.name] = self.evaluator.start(key, device)
            except Exception as error:  # a worker that cannot start is this validator's failure
                logger.exception("cannot start the evaluation of %s on %s", key, device.name)
                self.state.fail_attempt(key, f"the evaluation could not start: {error}", self.clock())
                idle.insert(0, device)
                continue
            busy.add((key.fork_url, key.commit_hash))
            summary.started.append(key)
            if attempt > 1:
                logger.info("evaluation of %s: attempt %d", key, attempt)

    def _maybe_set_weights(self, summary: StepSummary) -> None:
        """Once an epoch, rank this validator's own results and set weights (quasar/validator/weight_setting.py)."""
        if self.metagraph is None or not self.weights.due(self.metagraph.block):
            return
        results = []
        for record in self.state.scored():
            with one_item(f"scoring submission {record.submission.submission_id}"):
                results.append(scoring_result(record))
        if self.weights.set_weights(self.metagraph.block, results):
            summary.weights_set = True
