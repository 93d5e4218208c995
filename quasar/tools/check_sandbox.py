"""``quasar check-sandbox``: what this machine's evaluation sandbox enforces, and whether a fork's
kernels run inside it.

    quasar check-sandbox [--device cuda] [--out DIR] [--sys-variants]

For validators (and miners) setting up a host: prints, at 80 columns, each measure of the sandbox
(docs/validator.md, "The evaluation sandbox") and whether it holds here: namespaces, the seccomp filter, a uid
of its own, a cgroup of its own (or the memory watchdog standing in for it) and the packages a fork
may import; then evaluates the starter fork briefly in the sandbox on ``--device`` (else DEVICE; its Triton
kernels compile and run there, the CUDA driver reads what it needs of /sys). With
``--sys-variants``, should that fail, it tries again with more of /sys visible (the PCI devices,
then all of it) and says which works. Exit status 0 when the starter fork passes with the default
sandbox. ``--out DIR`` also writes ``sandbox.json``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from quasar import config
from quasar.evaluate import confinement, syscall_filter
from quasar.evaluate.cli import add_common_arguments, start
from quasar.evaluate.environment import evaluation_environment
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import EvaluationInputError, EvaluationOptions
from quasar.evaluate.sandbox import SandboxPolicy, namespaces_supported
from quasar.evaluate.sandbox_layout import SYS_BINDS
from quasar.starter_fork import write_starter_fork
from quasar.terminal import WrappingParser

# /sys as the default sandbox has it, then with the PCI devices (where the CUDA driver finds its
# GPUs' NUMA nodes and resources), then whole.
SYS_VARIANTS = {"default": SYS_BINDS, "with PCI": SYS_BINDS + ("/sys/bus/pci", "/sys/devices"), "whole": ("/sys",)}


def measures(configured_cgroup: str | None) -> list[tuple[str, bool, str]]:
    """Each measure of the sandbox: its name, whether it holds here, and a note."""
    found = []
    supported, why = namespaces_supported()
    found.append(("namespaces", supported, why or "network, mount, pid, ipc, uts"))
    loaded, why = syscall_filter.available()
    found.append(("seccomp filter", loaded, why or f"libseccomp; {len(syscall_filter.REFUSED)} calls refused"))
    root = os.geteuid() == 0
    if not (supported and loaded):
        found.append(("own uid", False, "none without the sandbox: the fork would run as this user"))
    else:
        found.append(
            ("own uid", root, "root: a uid per sandbox" if root else "not root: an unprivileged user namespace")
        )
    cgroup, why = confinement.make_cgroup(confinement.CGROUP_PREFIX + "check", 1 << 30, 64, configured_cgroup)
    if cgroup is not None:
        limited = "processes and memory" if "pids" in cgroup.directories else "memory (processes: the uid's limit)"
        found.append(("own cgroup", True, f"cgroup v{cgroup.version}: {limited} limited"))
        cgroup.remove()
    else:
        found.append(("own cgroup", False, f"memory watchdog instead ({why})"))
    found.append(("environment", True, evaluation_environment().describe()))
    return found


def try_variant(
    fork: Path, device: str, sys_paths: tuple[str, ...], configured_cgroup: str | None, allow_unsandboxed: bool = False
) -> dict:
    """A brief evaluation of the starter fork with ``sys_paths`` of /sys visible."""
    policy = SandboxPolicy(sys_paths=sys_paths, cgroup_path=configured_cgroup, allow_unsandboxed=allow_unsandboxed)
    options = EvaluationOptions(
        seq_lens=(), device=device, warmup_runs=2, min_timed_runs=2, max_timed_runs=4, timed_seconds=0.2, policy=policy
    )
    started = time.monotonic()
    report = evaluate(fork, 512, None, options)
    return {
        "verdict": report.verdict,
        "seconds": time.monotonic() - started,
        "sandbox": report.sandbox,
        "reasons": report.reasons,
        "log_tail": report.log_tail[-2000:],
    }


def main(argv: Sequence[str] | None = None, prog: str = "quasar check-sandbox") -> int:
    """Print the measures and the starter fork's verdict; exit status 0 when it passes in the default sandbox."""
    parser = WrappingParser(
        prog=prog,
        description="What this machine's evaluation sandbox enforces, and whether a fork's kernels run inside it.",
    )
    parser.add_argument(
        "--device",
        help=f"where the starter fork runs (default: the DEVICE setting, {config.OPTIONS_BY_KEY['device'].default})",
    )
    parser.add_argument("--out", type=Path, metavar="DIR", help="also write DIR/sandbox.json")
    parser.add_argument("--sys-variants", action="store_true", help="if the default sandbox fails, try more of /sys")
    add_common_arguments(parser)
    args, settings = start(parser, argv)
    console = Console(width=80)
    configured_cgroup = settings.sandbox_cgroup or None
    device = args.device or settings.device
    found = measures(configured_cgroup)
    table = Table(title="the evaluation sandbox on this machine")
    for column in ("measure", "holds", "how"):
        table.add_column(column, overflow="fold")
    for name, holds, note in found:
        table.add_row(name, "[green]yes[/]" if holds else "[red]no[/]", escape(note))
    console.print(table)
    if not all(holds for name, holds, _ in found if name in ("namespaces", "seccomp filter")):
        console.print(
            "No sandbox on this host: a validator will not start here; a miner benchmarks its "
            "candidates only with MINER_ALLOW_UNSANDBOXED=true (quasar evaluate, local-validator and "
            "this command: --allow-unsandboxed), the fork's code then running as this user.",
            highlight=False,
        )

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="quasar-check-") as scratch:
        fork = Path(scratch) / "starter"
        write_starter_fork(fork)
        for name, sys_paths in SYS_VARIANTS.items():
            if name != "default" and (not args.sys_variants or results["default"]["verdict"] == "pass"):
                break
            try:
                results[name] = try_variant(fork, device, sys_paths, configured_cgroup, args.allow_unsandboxed)
            except EvaluationInputError as error:
                parser.error(str(error))
            result = results[name]
            console.print(
                f"/sys {name}: starter fork {result['verdict']} in {result['seconds']:.1f} s", highlight=False
            )
            if result["sandbox"]:
                console.print(f"  sandbox: {escape(result['sandbox'])}", highlight=False)
            for reason in result["reasons"]:
                console.print(f"  reason: {escape(reason)}", highlight=False)
            if result["verdict"] == "pass":
                break
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        summary = {"measures": [{"measure": n, "holds": h, "how": w} for n, h, w in found], "variants": results}
        (args.out / "sandbox.json").write_text(json.dumps(summary, indent=1))
    return 0 if results["default"]["verdict"] == "pass" else 1
