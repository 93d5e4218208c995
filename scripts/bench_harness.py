#!/usr/bin/env python3
"""Figures of the evaluation harness for benchmarks/RESULTS.md, on the starter fork.

    python scripts/bench_harness.py --out DIR [--device cuda] [--runs 5]

1. Agreement: ``--runs`` separate evaluations (each a fresh sandbox) at ``--agreement-lens``
   with target ``--agreement-target``; per length, the spread of the medians,
   ``(max - min) / min``, which must stay within 2% on one H100.
2. Full: one evaluation at 512, 1024, 2048 and 100k with target ``--full-target`` (1M).
3. Overhead of each evaluation beyond its timed runs, by part.

Each report is written to DIR as JSON as soon as it exists; the summary is printed last.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from quasar.evaluate.__main__ import parse_seq_lens
from quasar.evaluate.harness import EvaluationOptions, evaluate
from quasar.evaluate.report import EvaluationReport
from quasar.evaluate.sandbox import SandboxPolicy
from quasar.starter_fork import copy_starter_tree


def spread(values: list[float]) -> float:
    """``(max - min) / min`` of positive values."""
    return (max(values) - min(values)) / min(values)


def overhead_row(name: str, report: EvaluationReport) -> list[str]:
    t = report.timings
    return [name, f"{t.total_s:.1f}", f"{t.timed_s:.1f}", f"{t.overhead_s:.1f}", f"{t.startup_s:.1f}",
            f"{t.calibration_s:.1f}", f"{t.load_s:.1f}", f"{t.warmup_s:.1f}", f"{t.correctness_s:.1f}",
            f"{t.reference_s:.1f}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--agreement-lens", type=parse_seq_lens, default=(512, 1024, 2048))
    parser.add_argument("--agreement-target", type=int, default=100_000)
    parser.add_argument("--full-lens", type=parse_seq_lens, default=(512, 1024, 2048, 100_000))
    parser.add_argument("--full-target", type=int, default=1_000_000)
    parser.add_argument("--allow-unsandboxed", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    console = Console(width=150)
    args.out.mkdir(parents=True, exist_ok=True)
    policy = SandboxPolicy(allow_unsandboxed=args.allow_unsandboxed)
    fork = Path(tempfile.mkdtemp(prefix="starter-")) / "fork"
    copy_starter_tree(fork)
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "command": " ".join(sys.argv)}

    reports: list[tuple[str, EvaluationReport]] = []
    agreement_options = EvaluationOptions(seq_lens=tuple(args.agreement_lens), device=args.device, policy=policy)
    for index in range(args.runs):
        report = evaluate(fork, args.agreement_target, None, agreement_options)
        (args.out / f"agreement_{index}.json").write_text(report.to_json())
        console.print(f"agreement run {index}: {report.verdict} {report.reasons} "
                      f"{ {k: round(v.tokens_per_sec or 0) for k, v in report.lengths.items()} }")
        reports.append((f"agreement {index}", report))
    full = evaluate(fork, args.full_target, None,
                    EvaluationOptions(seq_lens=tuple(args.full_lens), device=args.device, policy=policy))
    (args.out / "full.json").write_text(full.to_json())
    reports.append(("full", full))

    agreement = [report for name, report in reports if name.startswith("agreement")]
    table = Table(title=f"agreement of {len(agreement)} evaluations ({agreement[0].device_name})")
    for column in ("T", "medians (tokens/s)", "spread", "cv of runs (max)", "timed runs", "rel error (max)"):
        table.add_column(column)
    summary: dict = {"meta": meta, "agreement": {}, "full": {}, "overhead": {}}
    for key in agreement[0].lengths:
        items = [report.lengths[key] for report in agreement]
        medians = [item.tokens_per_sec for item in items if item.tokens_per_sec]
        if len(medians) != len(items):
            table.add_row(key, "not measured in every run", "-", "-", "-", "-")
            continue
        summary["agreement"][key] = {"medians": medians, "spread": spread(medians)}
        table.add_row(key, ", ".join(f"{m:,.0f}" for m in medians), f"{spread(medians):.2%}",
                      f"{max(i.cv for i in items):.3f}", str(items[0].timed_runs),
                      f"{max(i.rel_error for i in items):.2e}")
    console.print(table)

    table = Table(title=f"full evaluation, target {args.full_target:,} ({full.verdict})")
    for column in ("T", "tokens/s", "min", "max", "cv", "peak MiB", "rel error", "worst eighth", "worst block",
                   "fingerprint", "verified"):
        table.add_column(column)
    for key, item in full.lengths.items():
        summary["full"][key] = {"tokens_per_sec": item.tokens_per_sec, "status": item.status, "error": item.error,
                                "rel_error": item.rel_error, "peak_vram_mb": item.peak_vram_mb}
        worst_eighth = max(item.rel_error_eighths) if item.rel_error_eighths else None
        cells = [item.tokens_per_sec, item.tokens_per_sec_min, item.tokens_per_sec_max]
        table.add_row(key, *(f"{c:,.0f}" if c else "-" for c in cells), f"{item.cv or 0:.3f}",
                      f"{item.peak_vram_mb or 0:,.0f}", f"{item.rel_error or 0:.2e}", f"{worst_eighth or 0:.2e}",
                      f"{item.worst_block_error or 0:.2e}", f"{item.fingerprint_error or 0:.2e}",
                      f"{item.runs_verified}/{item.timed_runs}")
    console.print(table)
    for reason in full.reasons:
        console.print(f"reason: {reason}")

    table = Table(title="seconds per evaluation (overhead = total - timed)")
    for column in ("evaluation", "total", "timed", "overhead", "startup", "calibration", "load", "warm-up",
                   "correctness", "reference"):
        table.add_column(column)
    for name, report in reports:
        table.add_row(*overhead_row(name, report))
        summary["overhead"][name] = report.to_dict()["timings"]
    console.print(table)
    console.print(f"sandbox: {full.sandbox}; date {meta['date']}")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"bench_harness: {time.monotonic() - start:.0f} s")
    sys.exit(code)
