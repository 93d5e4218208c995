"""Running evaluations for the validator loop: the :class:`Evaluator` protocol and its production
implementation, one worker process per evaluation (quasar/validator/worker.py).

The loop starts an evaluation on an idle device and polls it; it never waits on one, so syncing,
fetching, reporting and weights go on while GPUs are busy. A worker's outcome becomes either a
result (the fork's fault or merit: recorded, never run again) or an error (this validator's
fault: retried, see quasar/validator/state.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import quasar
from quasar import forks
from quasar.evaluate import EvaluationOptions, EvaluationReport, options_from_settings
from quasar.evaluate.report import OK
from quasar.evaluate.verification import REFERENCE_DOES_NOT_FIT
from quasar.validator.devices import Device
from quasar.validator.records import EvaluationKey, EvaluationResult
from quasar.validator.worker import options_to_json

logger = logging.getLogger(__name__)

# The harness reports this when it could not build the sandbox: this machine's fault, never the fork's.
SANDBOX_UNAVAILABLE = "sandbox unavailable"
# The parent's own reason (a fork's message enters a reason after "warm-up at T=N failed:" and
# the like, never right after the length).
_NOT_VERIFIABLE_HERE = re.compile(rf"T=\d+: {re.escape(REFERENCE_DOES_NOT_FIT)} ")
# A worker gets this long beyond the clone and evaluation limits (Python and torch start-up, the report).
WORKER_MARGIN_S = 300.0
CANCELLED = "cancelled by the validator"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class EvaluationOutcome:
    """How an evaluation ended: a ``result``, or an ``error`` on this validator's side."""

    result: EvaluationResult | None = None
    error: str | None = None


class RunningEvaluation(Protocol):
    key: EvaluationKey
    device: Device

    def poll(self) -> EvaluationOutcome | None:
        """The outcome once the evaluation has ended (the same one on every later call), else None."""

    def cancel(self) -> None:
        """Ask the evaluation to stop (it cleans up its sandbox); poll() reports when it has."""

    def kill(self) -> None:
        """Stop it at once and wait until it has."""


class Evaluator(Protocol):
    def start(self, key: EvaluationKey, device: Device) -> RunningEvaluation:
        """Start evaluating ``key`` on ``device`` and return at once."""


def result_from_report(report: EvaluationReport, content_hash: str | None = None) -> EvaluationOutcome:
    """The outcome of a harness report run without a claim: ``correct`` is its verdict (imports,
    every length run and matching the reference, the target measured). A sandbox that could not
    be built, or a length whose float32 reference this machine could not hold, is an error of
    this validator, not a result. ``content_hash``: the fork's kernel
    content hash (quasar/originality.py)."""
    unavailable = [reason for reason in report.reasons if reason.startswith(SANDBOX_UNAVAILABLE)]
    unavailable += [reason for reason in report.reasons if _NOT_VERIFIABLE_HERE.match(reason)]
    if unavailable:
        return EvaluationOutcome(error="; ".join(unavailable))
    benchmarks = {
        item.seq_len: item.tokens_per_sec
        for item in report.lengths.values()
        if item.status == OK and item.tokens_per_sec is not None
    }
    return EvaluationOutcome(
        result=EvaluationResult(
            correct=report.passed,
            measured_tokens_per_sec=report.measured_tokens_per_sec,
            benchmarks=benchmarks,
            reasons=tuple(report.reasons),
            notes=tuple(report.notes),
            report=report.to_dict(),
            content_hash=content_hash,
        )
    )


def _content_hash(data: dict) -> str | None:
    """The worker's content hash when it is one (64 lowercase hex digits), else None."""
    value = data.get("content_hash")
    return value if isinstance(value, str) and _SHA256.fullmatch(value) else None


def outcome_from_worker(data: object) -> EvaluationOutcome:
    """The outcome a worker wrote (see quasar/validator/worker.py)."""
    if not isinstance(data, dict):
        return EvaluationOutcome(error="the worker wrote something other than a JSON object")
    kind, error = data.get("outcome"), str(data.get("error", ""))
    if kind == "clone_unavailable":
        return EvaluationOutcome(error=f"the fork could not be fetched on this host: {error}")
    if kind == "not_here":
        return EvaluationOutcome(error=f"this validator cannot evaluate it with its settings: {error}")
    if kind == "clone_failed":
        return EvaluationOutcome(
            result=EvaluationResult(correct=False, measured_tokens_per_sec=None, reasons=(f"clone failed: {error}",))
        )
    if kind == "refused":
        return EvaluationOutcome(
            result=EvaluationResult(
                correct=False,
                measured_tokens_per_sec=None,
                reasons=(f"cannot evaluate: {error}",),
                content_hash=_content_hash(data),
            )
        )
    if kind == "evaluated" and isinstance(data.get("report"), dict):
        try:
            report = EvaluationReport.from_dict(data["report"])
        except (TypeError, ValueError) as problem:
            return EvaluationOutcome(error=f"the worker's report cannot be read: {problem}")
        return result_from_report(report, _content_hash(data))
    return EvaluationOutcome(error=f"the worker wrote an unknown outcome {kind!r}")


@dataclass(eq=False)
class WorkerEvaluation:
    """One worker process evaluating ``key`` on ``device``, killed once past ``deadline`` (monotonic)."""

    key: EvaluationKey
    device: Device
    process: subprocess.Popen
    job_path: Path
    result_path: Path
    deadline: float
    checkout: Path | None = None  # where the worker clones the fork (None: a URL it will refuse)
    started: float = field(default_factory=time.monotonic, init=False)
    _outcome: EvaluationOutcome | None = field(default=None, init=False)
    _stop_reason: str | None = field(default=None, init=False)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def poll(self) -> EvaluationOutcome | None:
        if self._outcome is not None:
            return self._outcome
        code = self.process.poll()
        if code is None:
            if time.monotonic() > self.deadline and self._stop_reason is None:
                self._stop_reason = f"the worker ran past its limit of {self.deadline - self.started:.0f} s"
                logger.error("evaluation of %s on %s: %s; killing it", self.key, self.device.name, self._stop_reason)
                self._signal_group(signal.SIGKILL)
            return None
        self._outcome = self._read_outcome(code)
        for path in (self.job_path, self.result_path):
            path.unlink(missing_ok=True)
        if self.checkout is not None:
            # The worker removes its clone as it ends; one killed (its deadline, the OOM killer) cannot.
            try:
                forks.remove_checkout(self.checkout)
            except OSError as error:
                logger.warning("cannot remove the clone %s of %s: %s", self.checkout, self.key, error)
        return self._outcome

    def _read_outcome(self, code: int) -> EvaluationOutcome:
        """The worker's result (even one written just before it was stopped), else why there is none."""
        try:
            data = json.loads(self.result_path.read_text())
        except FileNotFoundError:
            if self._stop_reason is not None:
                return EvaluationOutcome(error=self._stop_reason)
            how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
            return EvaluationOutcome(error=f"the evaluation worker {how} without a result (see the log above)")
        except (OSError, ValueError) as error:
            return EvaluationOutcome(error=f"the worker's result {self.result_path} cannot be read: {error}")
        return outcome_from_worker(data)

    def cancel(self) -> None:
        if self.poll() is None and self._stop_reason is None:
            self._stop_reason = CANCELLED
            self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        if self._stop_reason is None:
            self._stop_reason = CANCELLED
        self._signal_group(signal.SIGKILL)
        self.process.wait()
        self.poll()


class SubprocessEvaluator:
    """Starts ``python -m quasar.validator.worker`` per evaluation; jobs, results and the clone
    cache live under ``work_dir``."""

    def __init__(
        self,
        work_dir: str | os.PathLike,
        options: EvaluationOptions,
        allow_local: bool,
        clone_timeout_s: float = forks.DEFAULT_TIMEOUT_S,
        debug: bool = False,
    ):
        self.work_dir = Path(work_dir)
        self.options = options
        self.allow_local = allow_local
        self.clone_timeout_s = clone_timeout_s
        self.debug = debug
        self.jobs_dir = self.work_dir / "jobs"
        self.cache_dir = self.work_dir / "forks"

    @classmethod
    def from_settings(cls, settings, work_dir: str | os.PathLike) -> SubprocessEvaluator:
        """Lengths, time limit and allocator settings from ``settings``; local fork paths only on
        the dev chain or with ALLOW_LOCAL_FORKS, as the API accepts them."""
        options = options_from_settings(settings)
        return cls(work_dir, options, allow_local=settings.local_forks_allowed, debug=settings.debug)

    def discard_leftover_clones(self) -> None:
        """Empty the clone cache: at start (the state file's lock makes this process the only user of
        ``work_dir``) whatever is there was left by workers of a validator killed outright, or is a
        key's lock file, which versions before 90dfa13 kept after the evaluation ended."""
        leftovers = list(self.cache_dir.iterdir()) if self.cache_dir.is_dir() else []
        if leftovers:
            clones = sum(path.is_dir() for path in leftovers)
            logger.info(
                "removing what %s holds, left by an earlier run: %d clone(s) of evaluations that did not end, "
                "%d lock file(s)",
                self.cache_dir,
                clones,
                len(leftovers) - clones,
            )
            shutil.rmtree(self.cache_dir)

    def start(self, key: EvaluationKey, device: Device) -> WorkerEvaluation:
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        text = f"{key.fork_url}\n{key.commit_hash}\n{key.target_sequence_length}"
        name = hashlib.sha256(text.encode()).hexdigest()[:24]
        job_path, result_path = self.jobs_dir / f"{name}.json", self.jobs_dir / f"{name}.result.json"
        result_path.unlink(missing_ok=True)
        options = replace(self.options, device=device.torch_device)
        job = {
            "fork_url": key.fork_url,
            "commit_hash": key.commit_hash,
            "target_sequence_length": key.target_sequence_length,
            "allow_local": self.allow_local,
            "cache_dir": str(self.cache_dir),
            "clone_timeout_s": self.clone_timeout_s,
            "options": options_to_json(options),
            "result_path": str(result_path),
            "parent_pid": os.getpid(),
            "debug": self.debug,
        }
        job_path.write_text(json.dumps(job))
        env = dict(os.environ)
        env["CUDA_VISIBLE_DEVICES"] = device.cuda_visible_devices
        # GPUs numbered in PCI bus order, as nvidia-smi and the sandbox's device nodes number them.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        package_root = str(Path(quasar.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (package_root, env.get("PYTHONPATH"))))
        # Started from the loop's (main) thread: PR_SET_PDEATHSIG follows the thread that forked.
        process = subprocess.Popen(
            [sys.executable, "-m", "quasar.validator.worker", str(job_path)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.clone_timeout_s + self.options.timeout_s + WORKER_MARGIN_S
        logger.debug("evaluating %s on %s (worker pid %d)", key, device.name, process.pid)
        try:
            checkout = forks.clone_dir_for(self.cache_dir, key.fork_url, key.commit_hash, allow_local=self.allow_local)
        except forks.ForkError:
            checkout = None
        return WorkerEvaluation(key, device, process, job_path, result_path, deadline, checkout)
