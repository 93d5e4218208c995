"""Evaluate a checked-out fork: import check, sandboxed benchmark, correctness, claim, score.

:func:`evaluate` is what a validator runs on a submission and what ``quasar local-validator``
runs for a miner. The design, the threat model and the figures behind it: docs/evaluation.md;
the parts: options.py, session.py, timing.py, references.py, verification.py.
"""

from __future__ import annotations

import logging
import math
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from quasar.config.values import parse_device
from quasar.evaluate import pinning
from quasar.evaluate.environment import evaluation_environment
from quasar.evaluate.gpus import missing_gpu_here
from quasar.evaluate.options import (
    CPU_NOTE,
    MAX_FORWARDS_PER_REQUEST,
    MAX_TOKENS_PER_REQUEST,
    EvaluationInputError,
    EvaluationOptions,
    ProgressCallback,
    ProgressEvent,
    check_lengths,
    draw_weights_seed,
    request_counts,
)
from quasar.evaluate.references import ReferenceWork
from quasar.evaluate.report import (
    FAIL,
    OK,
    OOM,
    PASS,
    SKIPPED,
    EvaluationReport,
    ImportCheck,
    LengthResult,
    Timings,
    clean_text,
)
from quasar.evaluate.sandbox import SandboxedChild, SandboxError, SandboxUnavailable
from quasar.evaluate.session import ChildFailure, Session, reply_failure
from quasar.evaluate.start import SandboxStart
from quasar.evaluate.timing import (
    TIMED_ROUNDS,
    LengthRun,
    calibrate,
    child_usable,
    finish_length,
    length_step,
    prepare_length,
    recommended_claim,
    time_rounds,
)
from quasar.evaluate.triton_seed import ensure_seed
from quasar.evaluate.verification import verify_all

logger = logging.getLogger(__name__)

# The longest the load waits for the fork's bytecode, compiled beside the import check (sandbox_contents.py).
PRECOMPILE_WAIT_S = 30.0


def _pinning_note(plan: pinning.CpuPlan | None, note: str, child_cpus: list[int] | None, timing_pinned: bool) -> str:
    """What the report says about pinning: the plan, and where it did not take effect."""
    if plan is None:
        return note
    problems = []
    if child_cpus is not None and frozenset(child_cpus) != plan.child:
        problems.append(f"the child runs on CPUs {pinning.format_cpu_list(child_cpus)} instead")
    if not timing_pinned:
        problems.append("the timing thread could not be pinned")
    return note + "".join(f"; {problem}" for problem in problems)


@dataclass(frozen=True)
class _Benchmark:
    """What the sandboxed benchmark of one evaluation works with: the reference work, the options,
    the deadline, where progress goes, and the report it writes its findings and timings to."""

    references: ReferenceWork
    options: EvaluationOptions
    deadline: float
    progress: ProgressCallback
    report: EvaluationReport

    @property
    def lengths(self) -> list[int]:
        return self.report.seq_lens

    @property
    def timings(self) -> Timings:
        return self.report.timings


def _benchmark_in_sandbox(sandbox: SandboxStart, work: _Benchmark) -> tuple[dict[int, LengthRun], Callable[[], None]]:
    """Wait for the sandboxed child and run every length in it; the parent's timing thread runs
    pinned (if planned) until the child is done, then gets its own CPUs back.

    Returns the runs and a function to call once the parent's own work is done: it waits for the
    child to be gone and records its output. The child is closed on a thread of its own meanwhile
    (its exit, its GPU context torn down, the straggler scan: about a second on an H100 machine),
    since nothing it could do after its last reply changes the parent's verdict.
    """
    runs = {
        length: LengthRun(LengthResult(seq_len=length), output_offset=sandbox.offsets[length])
        for length in work.lengths
    }
    work.progress(ProgressEvent("start"))
    plan, note = sandbox.plan, sandbox.note
    try:
        child = sandbox.wait()
    except SandboxUnavailable as error:
        work.report.reasons.append(f"sandbox unavailable: {error}")
        return runs, lambda: None
    except SandboxError as error:
        work.report.reasons.append(f"sandbox: {error}")
        return runs, lambda: None
    try:
        # What this evaluation waited for: a child started before it (started_before_s) may be up already.
        work.timings.startup_s = max(0.0, time.monotonic() - sandbox.started - work.timings.started_before_s)
        work.report.sandbox = child.isolation_note
        if child.seeded_files:
            work.report.notes.append(
                f"Triton cache seeded with {child.seeded_files} file(s) of the starter fork's compilations: "
                "kernels the same as the starter's were not compiled again"
            )
        with pinning.pinned(plan.timing if plan is not None else None) as timing_pinned:
            work.report.cpu_pinning = _pinning_note(plan, note, child.child_cpus, timing_pinned)
            _measure(child, runs, work)
    except BaseException:
        child.close()
        raise
    closing = threading.Thread(target=child.close, name="quasar-sandbox-close")
    closing.start()

    def closed() -> None:
        closing.join()
        work.report.log_tail = clean_text(child.output.text()[-8000:], 8000)
        if child.stragglers_killed:
            work.report.reasons.append(
                f"{child.stragglers_killed} process(es) started by the fork outlived it and were killed"
            )

    return runs, closed


def _measure(child: SandboxedChild, runs: dict[int, LengthRun], work: _Benchmark) -> None:
    """Calibrate, load the fork and run every length in a started child; fills ``runs``."""
    session = Session(child, work.deadline)
    weights_seed = work.references.weights_seed
    try:
        counts = request_counts(work.lengths, work.options)
        try:
            harness_ns = calibrate(session, runs, counts, work.timings, work.progress)
        finally:
            # The parent's reference work runs on the device while the child warms up (not measured).
            work.references.release()
        started = time.monotonic()
        work.progress(ProgressEvent("load"))
        child.precompiled(timeout=PRECOMPILE_WAIT_S)
        header = {"op": "load", "fork_dir": child.fork_dir, "weights_seed": weights_seed}
        reply, _, _ = session.request(
            header,
            time.monotonic() + work.options.load_timeout_s,
            f"loading the fork's layer (limit {work.options.load_timeout_s:g} s)",
        )
        work.timings.load_s = time.monotonic() - started
        if not reply.get("ok"):
            raise reply_failure(reply, None, "loading the fork's layer (fla.layers.quasar.QuasarAttention)")
    except ChildFailure as failure:
        work.report.reasons.append(failure.message)
        return
    # Each length is prepared (warm-up, capture, correctness), shortest first; then the timed
    # requests run in rounds over every prepared length (module docstring, "Stability").
    prepared: list[int] = []
    stopped = None
    warmup_since = time.monotonic()

    def references_done() -> None:
        waited = time.monotonic()
        work.references.wait()
        work.timings.reference_s += time.monotonic() - waited

    for length in work.lengths:
        run = runs[length]
        if length not in harness_ns:
            break
        if length == work.lengths[-1]:
            # The longest length's warm-up needs the most memory: the reference (its transient
            # float32 work on the device included) is done before it, so it never costs the fork memory.
            references_done()
        run.cost_ns = harness_ns[length]
        run.check_seeds = work.references.check_seeds[length]
        run.seed_pool = work.references.timed_seeds.get(length, [])
        run.precomputed = work.references.precomputed.get(length, {})
        run.check_round = secrets.randbelow(TIMED_ROUNDS)
        failed = length_step(
            run, prepare_length, session, run, work.options, counts[length], work.timings, work.progress, warmup_since
        )
        if failed is None:
            prepared.append(length)
        elif not child_usable(child, failed):
            stopped = f"the evaluation stopped at T={length}"
            break
        elif failed == OOM:
            break
    if stopped is None:
        # ... and ends before the timed requests.
        references_done()
        stopped = time_rounds(session, child, runs, prepared, counts, work.options, work.timings, work.progress)
    for length in prepared:
        run = runs[length]
        if run.result.error is not None:
            continue
        if not run.timed or run.check is None:
            run.result.error = f"not timed: {stopped}"
            run.timed, run.check, run.output, run.repeat = [], None, None, None
            continue
        finish_length(run, counts[length])
        work.progress(ProgressEvent("timed", length, run.result.timed_runs, run.result.timed_runs))
        logger.info(
            "T=%d: %.0f tokens/s (median of %d, cv %.3f)",
            length,
            run.result.tokens_per_sec,
            run.result.timed_runs,
            run.result.cv,
        )


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu" if device == "cpu" else f"{device} (not available to the parent)"


def _import_check(repo: Path, options: EvaluationOptions) -> ImportCheck:
    from quasar.imports import validate_repo

    found = validate_repo(repo, profile=options.import_profile, require_cu=options.require_cu)
    return ImportCheck(
        ok=found.ok,
        profile=options.import_profile,
        errors=[str(f) for f in found.errors],
        warnings=[str(f) for f in found.warnings],
    )


def _score(report: EvaluationReport, runs: dict[int, LengthRun]) -> None:
    """Claim check, league, weighted score and recommended claim (docs/rules.md section 5)."""
    from quasar import scoring

    target = report.target_seq_len
    league = scoring.league_for(target)
    report.league, report.multiplier = league.name, league.multiplier
    target_run = runs[target]
    measured = target_run.result.tokens_per_sec if target_run.result.status == OK else None
    report.measured_tokens_per_sec = measured
    if measured is None:
        report.reasons.append(f"the target length T={target} was not measured")
        return
    report.recommended_claim = recommended_claim(target, [r.forward_ns for r in target_run.timed])
    claimed = report.claimed_tokens_per_sec
    if claimed is not None:
        report.claim_ok = measured >= scoring.CLAIM_FACTOR * claimed
        if not report.claim_ok:
            report.reasons.append(
                f"measured {measured:,.0f} tokens/s at T={target} is below {scoring.CLAIM_FACTOR} "
                f"× claimed {claimed:,.0f}"
            )
    correct = all(run.result.correct for run in runs.values())
    result = scoring.Result(
        hotkey="evaluation",
        submission_id=0,
        submitted_at=0.0,
        target_sequence_length=target,
        claimed_tokens_per_sec=claimed if claimed is not None else measured,
        measured_tokens_per_sec=measured,
        correct=correct,
        logits_ok=None,
    )
    report.weighted_score = scoring.weighted_score(result)


def evaluate(
    repo_path: str | Path,
    target_seq_len: int,
    claimed_tokens_per_sec: float | None = None,
    options: EvaluationOptions | None = None,
    progress: ProgressCallback | None = None,
    sandbox: SandboxStart | None = None,
    references: ReferenceWork | None = None,
) -> EvaluationReport:
    """Evaluate the fork checked out at ``repo_path`` for ``target_seq_len``; never raises for the fork's faults.

    Starts the sandboxed child (no fork code runs in it before ``load``) and runs the import
    check while it starts; if the check passes, runs the fork's layer in the child at every
    length of ``options.seq_lens`` plus the target, checks it against the reference, the claim
    and the score; if not, kills the child. Raises :class:`EvaluationInputError` only for bad
    arguments (a missing directory, a length out of range, a non-positive claim, a ``sandbox``
    or ``references`` started for other lengths, device or weights).

    ``sandbox``: a child started without its fork for these lengths and options (start.py), which
    gets the fork here; ``references``: the reference work already started for them
    (:class:`ReferenceWork`). A validator's worker starts both while it clones the fork; the
    evaluation owns them from here and closes them on every path.
    """
    try:
        return _evaluate(
            repo_path,
            target_seq_len,
            claimed_tokens_per_sec,
            options or EvaluationOptions(),
            progress or (lambda event: None),
            sandbox,
            references,
        )
    finally:
        if sandbox is not None:
            sandbox.close()
        if references is not None:
            references.join()


def _evaluate(
    repo_path: str | Path,
    target_seq_len: int,
    claimed_tokens_per_sec: float | None,
    options: EvaluationOptions,
    progress: ProgressCallback,
    sandbox: SandboxStart | None,
    references: ReferenceWork | None,
) -> EvaluationReport:
    started = time.monotonic()
    repo = Path(repo_path)
    if not repo.is_dir():
        raise EvaluationInputError(f"repository path {str(repo)!r} is not a directory")
    if claimed_tokens_per_sec is not None and not (
        math.isfinite(claimed_tokens_per_sec) and claimed_tokens_per_sec > 0
    ):
        raise EvaluationInputError(f"claimed tokens/sec must be a positive number, got {claimed_tokens_per_sec!r}")
    try:  # as DEVICE is checked, spaces included: the GPU check below and torch read only these
        exact = parse_device(options.device) == options.device
    except ValueError:
        exact = False
    if not exact:
        raise EvaluationInputError(f"device must be cpu, cuda or cuda:N, got {options.device!r}")
    no_gpu = missing_gpu_here(options.device)
    if no_gpu is not None:
        raise EvaluationInputError(
            f"device {options.device}: {no_gpu} (--device cpu runs small lengths, for tests only: not a benchmark)"
        )
    lengths = check_lengths(options.seq_lens, target_seq_len, options.device, options.policy.memory_bytes)
    if not 1 <= options.max_forwards_per_request <= MAX_FORWARDS_PER_REQUEST:
        raise EvaluationInputError(
            f"max_forwards_per_request {options.max_forwards_per_request!r}: expected 1 to {MAX_FORWARDS_PER_REQUEST}"
        )
    if options.tokens_per_request is not None and not (
        isinstance(options.tokens_per_request, int) and 0 <= options.tokens_per_request <= MAX_TOKENS_PER_REQUEST
    ):
        raise EvaluationInputError(
            f"tokens_per_request {options.tokens_per_request!r}: expected an integer from 0 to {MAX_TOKENS_PER_REQUEST}"
        )
    if sandbox is not None and (sandbox.lengths != lengths or sandbox.device != options.device):
        raise EvaluationInputError(
            f"the sandbox was started for T={sandbox.lengths} on {sandbox.device}, "
            f"not for T={lengths} on {options.device}"
        )
    if references is not None and (
        sorted(references.check_seeds) != lengths
        or references.device != options.device
        or options.weights_seed not in (None, references.weights_seed)
    ):
        raise EvaluationInputError(
            f"the reference work was started for T={sorted(references.check_seeds)} on "
            f"{references.device} with other weights than asked for"
        )
    weights_seed = references.weights_seed if references is not None else draw_weights_seed(options)
    report = EvaluationReport(
        verdict=FAIL,
        reasons=[],
        repo=str(repo),
        target_seq_len=target_seq_len,
        seq_lens=lengths,
        device=options.device,
        device_name="",
        import_check=None,
        lengths={str(length): LengthResult(seq_len=length) for length in lengths},
        claimed_tokens_per_sec=claimed_tokens_per_sec,
        weights_seed=weights_seed,
    )
    if options.device == "cpu":
        report.notes.append(CPU_NOTE)
    report.environment = evaluation_environment().describe()
    timings = report.timings

    progress(ProgressEvent("import-check"))
    if sandbox is None:
        policy = ensure_seed(options.triton_seed_dir, options.device, lengths, options.policy)
        sandbox = SandboxStart(lengths, options.device, policy, options.pin_cpus, repo=repo)
    else:
        sandbox.provide_fork(repo)
        timings.started_before_s = started - sandbox.started
    try:
        checking = time.monotonic()
        report.import_check = _import_check(repo, options)
        timings.import_check_s = time.monotonic() - checking
        if not report.import_check.ok:
            report.reasons += [f"import check: {error}" for error in report.import_check.errors]
        else:
            deadline = time.monotonic() + options.timeout_s
            if references is None:
                references = ReferenceWork(
                    weights_seed, options.device, lengths, request_counts(lengths, options), options.max_timed_runs
                )
            work = _Benchmark(references, options, deadline, progress, report)
            runs, closed = _benchmark_in_sandbox(sandbox, work)
            try:
                report.reasons += verify_all(runs, references, timings, progress, target_seq_len)
            finally:
                closed()
    finally:
        sandbox.close()
    if report.import_check.ok:
        for length, run in runs.items():
            report.lengths[str(length)] = run.result
            if run.result.status not in (OK, SKIPPED) and run.result.error:
                report.reasons.append(
                    run.result.error if run.result.status == OOM else f"T={length}: {run.result.error}"
                )
        for length, run in runs.items():
            if (run.result.timing or "").startswith("eager (capture failed"):
                report.notes.append(
                    f"T={length}: timed {run.result.timing}; the harness's cost subtracted is that "
                    "of a CUDA graph, so a forward that can be captured times faster"
                )
        skipped = [str(length) for length, run in runs.items() if run.result.status == SKIPPED]
        if skipped and not any(r.startswith("sandbox") for r in report.reasons):
            report.notes.append(f"not run: T={', '.join(skipped)}")
        _score(report, runs)
        if report.sandbox.startswith("UNSANDBOXED"):
            report.notes.append(report.sandbox)
    report.device_name = _device_name(options.device)
    report.verdict = PASS if not report.reasons else FAIL
    timings.total_s = time.monotonic() - started
    progress(ProgressEvent("done"))
    logger.info(
        "evaluation of %s: %s%s", repo, report.verdict, "" if report.passed else f" ({'; '.join(report.reasons)})"
    )
    return report
