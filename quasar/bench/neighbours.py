"""``quasar bench neighbours``: an honest evaluation beside a hostile one, as a validator with two
GPUs runs them.

    quasar bench neighbours --out DIR [--runs 2] [--lens 512,1024,2048] [--target 1M]
        [--hostile exhaust_processes,other_gpus]

The starter fork is evaluated by the validator's worker process (quasar/validator/worker.py) on
GPU 0, ``--runs`` times alone, then ``--runs`` times beside each hostile fork, which another
worker evaluates on GPU 1 at the same moment: ``exhaust_processes`` starts processes until its
sandbox refuses more and holds them; ``other_gpus`` keeps every GPU it can reach busy from a
process of its own. Prints, at 80 columns, the starter's median tokens/s per length alone and
beside each (their ratio must stay within 2%), its verdicts, and what the hostile forks reached;
writes every report and ``neighbours.json`` to DIR. Needs two GPUs, and a checkout of the
repository: the hostile forks are the attack tests' (tests/hostile_forks).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from quasar.evaluate.cli import parse_seq_lens
from quasar.evaluate.options import DEFAULT_SEQ_LENS, EvaluationOptions
from quasar.evaluate.report import EvaluationReport
from quasar.log import setup_logging
from quasar.starter_fork import commit_new_repository, copy_starter_tree
from quasar.validator.devices import Device
from quasar.validator.evaluator import SubprocessEvaluator
from quasar.validator.records import EvaluationKey

HOSTILE_PARAMETERS: dict[str, dict[str, Any]] = {
    "exhaust_processes": {"most": 100_000, "name": "qneighbour", "hold_seconds": 35},
    "other_gpus": {"burn_seconds": 35},
}


def write_hostile_fork(dest: Path, attack: str, **params: object) -> Path:
    """The attack tests' hostile fork ``attack`` written into ``dest``. The attacks are test code, not
    part of the installed package: they are read from the checkout this package runs from."""
    corpus = Path(__file__).resolve().parents[2] / "tests" / "hostile_forks" / "__init__.py"
    if not corpus.is_file():
        raise SystemExit(
            f"{corpus} is missing: this benchmark runs from a checkout of the repository, "
            "whose attack tests' hostile forks it evaluates"
        )
    spec = importlib.util.spec_from_file_location("hostile_forks", corpus)
    assert spec is not None and spec.loader is not None, corpus
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.write_hostile_fork(dest, attack, **params)


def committed(tree: Path, paths: list[PurePosixPath] | None = None) -> str:
    """Commit ``tree`` as a fresh repository (the worker clones it); the commit."""
    files = (
        paths
        if paths is not None
        else sorted(PurePosixPath(p.relative_to(tree).as_posix()) for p in tree.rglob("*") if p.is_file())
    )
    return commit_new_repository(tree, files, "bench_neighbours")


def run_workers(
    jobs: list[tuple[Path, str, Device]], target: int, options: EvaluationOptions, work_dir: Path
) -> list[EvaluationReport]:
    """Start one worker per job at once and wait for all; their reports, in order."""
    running = [
        SubprocessEvaluator(work_dir / device.cuda_visible_devices, options, allow_local=True).start(
            EvaluationKey(str(fork), commit, target), device
        )
        for fork, commit, device in jobs
    ]
    outcomes: list = [None] * len(running)
    while any(outcome is None for outcome in outcomes):
        for index, worker in enumerate(running):
            if outcomes[index] is None:
                outcomes[index] = worker.poll()
        time.sleep(0.05)
    reports = []
    for outcome in outcomes:
        if outcome.result is None or outcome.result.report is None:
            raise SystemExit(f"a worker gave no report: {outcome}")
        reports.append(EvaluationReport.from_dict(outcome.result.report))
    return reports


def medians(reports: list[EvaluationReport]) -> dict[str, float | None]:
    """The median over evaluations of each length's median tokens/s (None where one was not measured)."""
    found: dict[str, float | None] = {}
    for key in reports[0].lengths:
        values = [report.lengths[key].tokens_per_sec for report in reports]
        measured = [value for value in values if value]
        found[key] = statistics.median(measured) if len(measured) == len(values) else None
    return found


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench neighbours") -> int:
    """Run the evaluations; exit status 0 when every honest one passed within 2% of alone."""
    parser = argparse.ArgumentParser(
        prog=prog, description="An honest evaluation beside a hostile one, as a validator with two GPUs runs them."
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--lens", type=parse_seq_lens, default=DEFAULT_SEQ_LENS)
    parser.add_argument("--target", type=parse_seq_lens, default=(1_000_000,))
    parser.add_argument(
        "--hostile",
        default=",".join(HOSTILE_PARAMETERS),
        help=f"hostile forks beside the honest one (default {','.join(HOSTILE_PARAMETERS)})",
    )
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs two GPUs")
    console = Console(width=80)
    args.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="neighbours-"))
    starter = scratch / "starter"
    starter_commit = committed(starter, copy_starter_tree(starter))
    options = EvaluationOptions(seq_lens=tuple(args.lens), device="cuda")
    target = args.target[0]
    honest_gpu, hostile_gpu = Device("cuda:0", "0"), Device("cuda:1", "1")

    results: dict[str, list[EvaluationReport]] = {"alone": []}
    hostile_reports: dict[str, list[EvaluationReport]] = {}
    for run in range(args.runs):
        [report] = run_workers([(starter, starter_commit, honest_gpu)], target, options, scratch / "work")
        results["alone"].append(report)
        console.print(f"alone {run}: {report.verdict}, {report.measured_tokens_per_sec:,.0f} tokens/s at target")
    for name in args.hostile.split(","):
        hostile = write_hostile_fork(scratch / name, name, **HOSTILE_PARAMETERS[name])
        hostile_commit = committed(hostile)
        results[name], hostile_reports[name] = [], []
        for run in range(args.runs):
            honest, attacker = run_workers(
                [(starter, starter_commit, honest_gpu), (hostile, hostile_commit, hostile_gpu)],
                target,
                options,
                scratch / "work",
            )
            results[name].append(honest)
            hostile_reports[name].append(attacker)
            reached = [
                line
                for line in attacker.log_tail.splitlines()
                if line.startswith(("FORK-REFUSED", "GPUS-REACHED", "GPU-NODES"))
            ]
            console.print(
                f"beside {name} {run}: {honest.verdict}, {honest.measured_tokens_per_sec or 0:,.0f} "
                f"tokens/s; it: {attacker.verdict}; {'; '.join(reached)[:200]}",
                highlight=False,
            )
    for kind, reports in {**results, **{f"{k}-hostile": v for k, v in hostile_reports.items()}}.items():
        for index, report in enumerate(reports):
            (args.out / f"{kind}_{index}.json").write_text(report.to_json())

    alone = medians(results["alone"])
    table = Table(title=f"starter on GPU 0, median tokens/s ({torch.cuda.get_device_name(0)})")
    table.add_column("T", justify="right")
    table.add_column("alone", justify="right")
    for name in hostile_reports:
        table.add_column(f"beside {name}", justify="right", overflow="fold")
    summary: dict[str, Any] = {
        "alone": alone,
        "beside": {},
        "verdicts": {k: [r.verdict for r in v] for k, v in results.items()},
    }
    for key in alone:
        base = alone[key]
        cells = [f"{int(key):,}", f"{base / 1e6:.2f} M" if base else "-"]
        for name in hostile_reports:
            beside = medians(results[name])[key]
            summary["beside"].setdefault(name, {})[key] = beside
            cells.append(f"{beside / 1e6:.2f} M ({beside / base - 1:+.1%})" if beside and base else "-")
        table.add_row(*cells)
    console.print(table)
    (args.out / "neighbours.json").write_text(json.dumps(summary, indent=1))
    honest_ok = all(report.passed for reports in results.values() for report in reports)
    within = all(
        abs(summary["beside"][name][key] / alone[key] - 1) <= 0.02
        for name in hostile_reports
        for key in alone
        if alone[key] and summary["beside"][name][key]
    )
    console.print(f"every honest evaluation passed: {honest_ok}; within 2% of alone at every length: {within}")
    return 0 if honest_ok and within else 1
