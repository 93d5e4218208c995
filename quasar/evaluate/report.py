"""The evaluation report: typed results that cross from the harness to validators and miners.

``EvaluationReport.to_dict()`` is the JSON of ``quasar evaluate --json`` and of
``quasar local-validator --json``; ``from_dict`` reads it back. ``render_report`` prints it as
rich tables.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from quasar.safe_text import without_terminal_controls

PASS = "pass"
FAIL = "fail"

# Status of one sequence length.
OK = "ok"
OOM = "oom"
TIMEOUT = "timeout"
ERROR = "error"
SKIPPED = "skipped"
# On the CPU, the fork's forward launched a Triton kernel, which needs a GPU driver.
NEEDS_GPU = "needs-gpu"


def clean_text(text: object, limit: int) -> str:
    """``text`` as it may enter a report: terminal controls replaced by ``?``, at most ``limit``
    characters (the end cut and marked). Every string that comes from the sandboxed child
    (error messages, its timing note, its output) goes through here; rich markup in it is
    escaped where the report is printed (:func:`render_report`)."""
    cleaned = without_terminal_controls(str(text))
    return cleaned if len(cleaned) <= limit else cleaned[: max(limit - 1, 0)] + "…"


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


@dataclass
class ImportCheck:
    """Result of the import validation of ``fla/ops/quasar/`` (docs/rules.md section 4 step 2)."""

    ok: bool
    profile: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass
class LengthResult:
    """Benchmark and correctness at one sequence length.

    Speeds come from the parent's clock (docs/evaluation.md, "Timing"): ``timed_runs`` timed requests of
    ``forwards_per_request`` forwards each, one time per forward from each request (its round
    trip less the harness's cost, divided by the count; ``subtracted_us`` per forward);
    ``tokens_per_sec`` from their median, ``tokens_per_sec_max`` from the fastest request (the
    best the fork did here), ``tokens_per_sec_min`` from the slowest, ``cv`` over them.
    ``runs_verified`` counts the timed forwards checked against the reference (every forward of
    ``requests_verified`` requests, the correctness request among them); ``request_error`` is the
    largest error estimated for one of those requests from all its forwards' fingerprints, and
    ``escape_probability`` the chance that a fork degrading just over half of the timed requests
    (enough to move their median) had none of them checked; ``requests_checked_ahead`` how many of
    them the parent computed while the child warmed up.
    ``peak_vram_mb`` is what the fork's process reported (informational: fork code could fake it):
    the peak of the length's warm-up above the memory allocated before it (the fork's forwards and
    the length's float32 inputs). ``rel_error`` is over the whole sequence, ``rel_error_eighths``
    per eighth, ``worst_block_error`` over 64-token blocks relative to the sequence's RMS;
    ``fingerprint_error`` is the largest estimated error among the timed forwards checked against
    the reference, of their outputs or of their absolute values. ``timing`` says how the child ran
    the timed forwards, as it reported (informational, like the memory): ``"cuda-graph"`` (one CUDA
    graph per request), ``"eager (capture failed: REASON)"`` or ``"eager (cpu)"``.
    """

    seq_len: int
    status: str = SKIPPED
    tokens_per_sec: float | None = None
    tokens_per_sec_min: float | None = None
    tokens_per_sec_max: float | None = None
    cv: float | None = None
    median_ms: float | None = None
    timed_runs: int = 0
    peak_vram_mb: float | None = None
    finite: bool | None = None
    rel_error: float | None = None
    rel_error_eighths: list[float] = field(default_factory=list)
    worst_block_error: float | None = None
    correct: bool | None = None
    repeat_rel_diff: float | None = None
    repeat_agree: bool | None = None
    runs_verified: int = 0
    fingerprint_error: float | None = None
    subtracted_us: float | None = None
    request_error: float | None = None
    escape_probability: float | None = None
    requests_checked_ahead: int = 0
    error: str | None = None
    forwards_per_request: int = 0
    requests_verified: int = 0
    timing: str | None = None


@dataclass
class Timings:
    """Wall-clock seconds spent in each part of an evaluation (for the overhead figure)."""

    import_check_s: float = 0.0
    # How long before the evaluation began its sandboxed child was started (a validator's worker
    # starts it while cloning the fork); 0 when the evaluation started it.
    started_before_s: float = 0.0
    # The part of the child's start the evaluation waited for (the import check runs meanwhile).
    startup_s: float = 0.0
    calibration_s: float = 0.0
    load_s: float = 0.0
    warmup_s: float = 0.0
    # Of warmup_s: each length's first forward, where the fork's kernels compile.
    first_forward_s: float = 0.0
    timed_s: float = 0.0
    correctness_s: float = 0.0
    # Of correctness_s: receiving the correctness requests' outputs from the child.
    output_s: float = 0.0
    reference_s: float = 0.0
    total_s: float = 0.0

    @property
    def overhead_s(self) -> float:
        """Everything but the timed runs themselves."""
        return self.total_s - self.timed_s


@dataclass
class EvaluationReport:
    """Everything an evaluation found, with a verdict and every reason for it."""

    verdict: str
    reasons: list[str]
    repo: str
    target_seq_len: int
    seq_lens: list[int]
    device: str
    device_name: str
    import_check: ImportCheck | None
    lengths: dict[str, LengthResult]
    claimed_tokens_per_sec: float | None = None
    measured_tokens_per_sec: float | None = None
    claim_ok: bool | None = None
    league: str | None = None
    multiplier: float | None = None
    weighted_score: float | None = None
    recommended_claim: float | None = None
    notes: list[str] = field(default_factory=list)
    sandbox: str = ""
    # The packages the fork could import besides its own (environment.py).
    environment: str = ""
    # Where the child and the parent's timing thread ran (timing and pinning: docs/evaluation.md, pinning.py).
    cpu_pinning: str = ""
    weights_seed: int | None = None
    timings: Timings = field(default_factory=Timings)
    log_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data; a non-finite number (a NaN output's error) becomes None."""
        data = asdict(self)
        data["timings"]["overhead_s"] = self.timings.overhead_s
        return _finite_or_none(data)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, default=str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvaluationReport:
        """Rebuild a report from ``to_dict()`` output (unknown keys are ignored)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("import_check") is not None:
            values["import_check"] = ImportCheck(**values["import_check"])
        values["lengths"] = {
            key: LengthResult(**{k: v for k, v in item.items() if k in {f.name for f in fields(LengthResult)}})
            for key, item in values.get("lengths", {}).items()
        }
        timing_fields = {f.name for f in fields(Timings)}
        values["timings"] = Timings(**{k: v for k, v in values.get("timings", {}).items() if k in timing_fields})
        return cls(**values)


def _number(value: float | None, digits: str = ",.0f") -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return str(value)
    return format(value, digits)


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("[green]yes[/]" if value else "[red]no[/]")


def _timing(timing: str | None) -> str:
    """The timing mode in a table cell: "graph" or "eager" (the reason is in the report's notes)."""
    if timing is None:
        return "-"
    return "graph" if timing == "cuda-graph" else timing.split(" ", 1)[0]


# Below this many columns (an 80-column SSH terminal) the lengths table drops the slowest and
# fastest requests, the timing mode and the worst eighth, shows tokens/s in M or k, and folds the
# three checks into one column; the notes and the JSON report have the rest.
WIDE_REPORT_COLUMNS = 150


# Timed requests whose durations vary more than this (coefficient of variation) make the measured
# speed and the recommended claim unreliable: something else shares the GPU or the CPU.
HIGH_CV = 0.10


def noise_warnings(report: EvaluationReport) -> list[str]:
    """One line per length whose timed requests varied more than :data:`HIGH_CV`, saying what it costs."""
    warnings = []
    if report.device == "cpu":
        cure = "measure again while nothing else keeps this machine's CPUs busy"
    else:
        cure = "measure again on an idle GPU (nvidia-smi shows other processes)"
    for key in sorted(report.lengths, key=int):
        item = report.lengths[key]
        if item.cv is not None and math.isfinite(item.cv) and item.cv > HIGH_CV:
            cost = (
                " and the recommended claim sits far under the median" if item.seq_len == report.target_seq_len else ""
            )
            warnings.append(
                f"T={item.seq_len:,}: timed requests vary by cv {item.cv:.3f} (over {HIGH_CV:g}): the "
                f"speed is uncertain{cost}; {cure}"
            )
    return warnings


def _cv(value: float | None) -> str:
    """The cv cell, marked red when over :data:`HIGH_CV`."""
    text = _number(value, ".3f")
    return f"[red]{text}![/]" if value is not None and math.isfinite(value) and value > HIGH_CV else text


def _checks(item: LengthResult) -> str:
    """The finite, repeat and correctness checks of a length in one cell: ``yes``, or what failed."""
    failed = [
        name
        for name, value in (("nan", item.finite), ("repeat", item.repeat_agree), ("wrong", item.correct))
        if value is False
    ]
    if failed:
        return f"[red]{', '.join(failed)}[/]"
    return "-" if item.correct is None else "[green]yes[/]"


def _lengths_table(report: EvaluationReport, wide: bool) -> Any:
    """One row per length; ``wide`` adds the slowest and fastest requests, the worst eighth and
    each check in a column of its own."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    from quasar.terminal import compact_rate

    title = escape(f"{report.repo} on {report.device_name or report.device}")
    if wide:
        table = Table(title=title, title_justify="left")
        columns: tuple[str, ...] = (
            "T",
            "status",
            "tok/s (median)",
            "slowest",
            "fastest",
            "cv",
            "timing",
            "MiB",
            "rel err",
            "1/8 max",
            "finite",
            "repeat",
            "correct",
        )
    else:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        columns = ("T", "status", "tok/s", "cv", "MiB", "rel err", "checks")
    for column in columns:
        table.add_column(column, justify="left" if column in ("status", "checks") else "right", no_wrap=True)
    for key in sorted(report.lengths, key=int):
        item = report.lengths[key]
        status = item.status if item.status == OK else f"[red]{escape(item.status)}[/]"
        if wide:
            worst_eighth = max(item.rel_error_eighths) if item.rel_error_eighths else None
            cells: tuple[str, ...] = (
                _number(item.tokens_per_sec),
                _number(item.tokens_per_sec_min),
                _number(item.tokens_per_sec_max),
                _cv(item.cv),
                escape(_timing(item.timing)),
                _number(item.peak_vram_mb),
                _number(item.rel_error, ".2e"),
                _number(worst_eighth, ".2e"),
                _flag(item.finite),
                _flag(item.repeat_agree),
                _flag(item.correct),
            )
        else:
            cells = (
                compact_rate(item.tokens_per_sec),
                _cv(item.cv),
                _number(item.peak_vram_mb),
                _number(item.rel_error, ".2e"),
                _checks(item),
            )
        table.add_row(f"{item.seq_len:,}", status, *cells)
    return table


def _checks_line(report: EvaluationReport) -> str | None:
    """How the target length's timed requests were checked, and the chance a fork degrading just
    over half of them escaped (None where it was not measured)."""
    item = report.lengths.get(str(report.target_seq_len))
    if item is None or item.escape_probability is None or not item.timed_runs:
        return None
    probability = item.escape_probability
    shown = "0" if probability == 0 else f"{probability:.2%}" if probability >= 1e-4 else f"{probability:.1e}"
    return (
        f"{item.requests_verified} of {item.timed_runs} timed requests at T={item.seq_len:,} checked in full; "
        f"a fork degrading over half escapes with p = {shown}"
    )


def render_report(report: EvaluationReport, console: Any = None) -> None:
    """Print ``report`` as rich tables: one row per length, then the verdict and its reasons.

    The lengths table fits the console: every column from :data:`WIDE_REPORT_COLUMNS` columns
    on, a narrower one below (legible at 80 columns). Text that may come from the fork (reasons,
    notes, the timing mode) is printed as text: rich markup in it is escaped."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    console.print(_lengths_table(report, wide=console.width >= WIDE_REPORT_COLUMNS))

    summary = Table(show_header=False, box=None)
    summary.add_column(style="bold")
    summary.add_column()
    verdict = "[bold green]PASS[/]" if report.passed else "[bold red]FAIL[/]"
    summary.add_row("verdict", verdict)
    summary.add_row(
        "target", f"{report.target_seq_len:,} tokens (league {report.league or '-'}, × {report.multiplier or '-'})"
    )
    summary.add_row("measured at target", f"{_number(report.measured_tokens_per_sec)} tokens/s")
    if report.claimed_tokens_per_sec is not None:
        check = "ok" if report.claim_ok else "FAILS the 0.9 × claim check"
        summary.add_row("claimed", f"{_number(report.claimed_tokens_per_sec)} tokens/s ({check})")
    multiplier = report.multiplier
    if report.weighted_score is not None and multiplier:
        summary.add_row(
            "weighted score",
            f"{_number(report.weighted_score)} (scored at the "
            f"{'claimed' if report.claimed_tokens_per_sec is not None else 'measured'} speed × {multiplier:g})",
        )
    else:
        summary.add_row("weighted score", _number(report.weighted_score))
    recommended = report.recommended_claim
    if recommended is not None and multiplier and report.measured_tokens_per_sec is not None:
        scores = min(recommended, report.measured_tokens_per_sec) * multiplier if report.passed else 0.0
        summary.add_row(
            "recommended claim",
            f"{_number(recommended)} tokens/s (a submission claiming it scores "
            f"{_number(scores)}: min(claimed, measured) × {multiplier:g})",
        )
    else:
        summary.add_row("recommended claim", f"{_number(recommended)} tokens/s")
    if report.import_check is not None:
        state = "ok" if report.import_check.ok else f"{len(report.import_check.errors)} error(s)"
        summary.add_row(
            "import check", f"{state}, {len(report.import_check.warnings)} warning(s) ({report.import_check.profile})"
        )
    checks = _checks_line(report)
    if checks is not None:
        summary.add_row("timed checks", checks)
    summary.add_row("sandbox", escape(report.sandbox) or "-")
    if report.environment:
        summary.add_row("environment", escape(report.environment))
    summary.add_row("CPUs", escape(report.cpu_pinning) or "-")
    summary.add_row("time", f"{report.timings.total_s:.1f} s in all, {report.timings.timed_s:.1f} s timed")
    console.print(summary)
    for warning in noise_warnings(report):
        console.print(f"[yellow]noisy:[/] {escape(warning)}", highlight=False)
    for note in report.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    for warning in report.import_check.warnings if report.import_check else []:
        console.print(f"[yellow]import warning:[/] {escape(warning)}", highlight=False)
    for reason in report.reasons:
        console.print(f"[red]reason:[/] {escape(reason)}", highlight=False)
