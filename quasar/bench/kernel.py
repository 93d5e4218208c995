"""``quasar bench kernel``: check and time the starter fork's QuasarAttention kernels on one GPU.

    quasar bench kernel --out DIR [--fork PATH] [--lengths ...] [--variants JSON]

1. Correctness: the benchmark layer under bf16 autocast against ``QuasarAttentionReference`` (fp32)
   at every ``--check-lengths`` (each eighth of the sequence on its own), and the core op against
   ``chunk_quasar_reference`` in fp32 and bf16 with packed sequences and states.
2. Variants: the layer at the longest length under each tuning in ``--variants`` (JSON list);
   with ``--check-variants`` each one is also checked as in 1.
3. Speed and peak memory of the fork's layer (best variant) at ``--lengths``; with ``--upstream``,
   the same layer with upstream fla's ``chunk_delta_rule`` as its core (``fla-core`` on the path of a
   child process, since both packages are named ``fla``), side by side.
4. Where the time goes at the longest length: device time per kernel and per operator
   (torch.profiler), and the registers and spills of each compiled kernel.
5. With ``--conv-blocks``, the causal conv kernel alone under each block shape.

``--forward-only T`` runs one forward of the fork's layer at T tokens and nothing else: a target
for a profiler, e.g. ``ncu --kernel-name regex:quasar --launch-count 5 quasar bench kernel
--out DIR --forward-only 65536``.

Everything is written to DIR (``bench.json``, ``log.txt``); the tables are printed last. The
measurements are in kernel_measurements.py, the upstream path in kernel_upstream.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from quasar.bench.kernel_measurements import (
    check_core,
    check_layer,
    compile_sweep,
    conv_sweep,
    fork_layers,
    forward_once,
    kernel_breakdown,
    kernel_resources,
    time_core,
    time_forward,
    use_tuning,
)
from quasar.bench.kernel_upstream import upstream_main
from quasar.log import setup_logging
from quasar.starter_fork import template_root

DEFAULT_VARIANTS = [
    {},
    {"segment_chunks": 8},
    {"segment_chunks": 32},
    {"segment_warps": 2, "output_warps": 2},
    {"num_stages": 2},
    {"layer_tile_tokens": 65_536},
    {"layer_tile_tokens": 262_144},
]


def parse_lengths(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def build_parser(prog: str) -> argparse.ArgumentParser:
    """The command line of ``quasar bench kernel``."""
    parser = argparse.ArgumentParser(
        prog=prog, description="Check and time the starter fork's QuasarAttention kernels on one GPU, in one call."
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--fork",
        type=Path,
        default=Path(str(template_root())),
        help="the fork's tree whose fla is checked and timed (default the starter fork's)",
    )
    parser.add_argument("--lengths", type=parse_lengths, default=parse_lengths("65536,262144,1000000"))
    parser.add_argument(
        "--check-lengths", type=parse_lengths, default=parse_lengths("512,1024,2048,65536,262144,1000000")
    )
    parser.add_argument(
        "--variants",
        type=json.loads,
        default=None,
        help="JSON list of tunings to time at the longest length (default: a small sweep)",
    )
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--check-variants",
        action="store_true",
        help="check the layer at --check-lengths under every variant, not only the fastest",
    )
    parser.add_argument("--upstream", action="store_true", help="also time upstream fla's chunk_delta_rule path")
    parser.add_argument("--upstream-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--check", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--compile-lengths",
        type=parse_lengths,
        default=[],
        help="first: the first and second forward at each of these lengths in turn, and the "
        "kernels Triton compiled for each (set TRITON_CACHE_DIR to an empty folder), "
        "under each of --variants in turn",
    )
    parser.add_argument(
        "--compile-threads",
        type=int,
        default=0,
        help="with --compile-lengths: first compile each length's kernels in a dry forward on "
        "this many threads at once (Triton's AsyncCompileMode)",
    )
    parser.add_argument(
        "--conv-blocks",
        type=json.loads,
        default=[],
        help="JSON list of [tokens, channels, warps] blocks of the causal conv kernel to time",
    )
    parser.add_argument(
        "--forward-only",
        type=int,
        default=0,
        metavar="T",
        help="only run one forward of the fork's layer at T tokens (under the first of "
        "--variants, if given): a target for a profiler such as ncu",
    )
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench kernel") -> int:
    """Check, time and profile the fork's kernels; everything is written to --out."""
    args = build_parser(prog).parse_args(argv)
    setup_logging(quiet=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.upstream_only:
        return upstream_main(args)

    # The fork's own package is named fla, as upstream's is: its tree goes first on the import path
    # of this process (the upstream path runs in a child process of its own, below).
    sys.path.insert(0, str(args.fork.resolve()))
    if args.forward_only:
        return forward_once(args.forward_only, args.variants[0] if args.variants else None, args.out)
    if args.variants is None:
        args.variants = DEFAULT_VARIANTS
    report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import triton

    report["triton"] = triton.__version__
    log = open(args.out / "log.txt", "a")

    def emit(key, value):
        report.setdefault(key, []).append(value)
        line = json.dumps({key: value})
        print(line, flush=True)
        log.write(line + "\n")
        (args.out / "bench.json").write_text(json.dumps(report, indent=1))

    folder = Path(tempfile.mkdtemp(prefix="tuning-"))
    # With several variants, each one's sweep compiles only what differs from the ones before it
    # (Triton's cache holds the rest): the first variant's row is a fresh evaluation's compilation.
    for variant in (args.variants or [None]) if args.compile_lengths else []:
        if variant is not None:  # with no variants, the fork's own tuning.json
            use_tuning(variant, folder)
        for row in compile_sweep(args.compile_lengths, args.compile_threads):
            emit("compile", {**row, "tuning": variant})

    upstream = None
    if args.upstream:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""),) if p)}
        # -P: the current folder stays off the child's import path (a fork's fla there would shadow upstream's).
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-m",
                "quasar",
                "bench",
                "kernel",
                "--upstream-only",
                "--check",
                "--out",
                str(args.out),
                "--lengths",
                ",".join(map(str, args.lengths)),
                "--check-lengths",
                "65536",
                "--runs",
                str(args.runs),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # One GPU: wait for the child before timing anything here.
        assert upstream.stdout is not None  # stdout=PIPE
        for line in upstream.stdout:
            log.write("upstream: " + line)
            print("upstream:", line.rstrip(), flush=True)
            if line.startswith("{"):
                emit("upstream", json.loads(line))
        upstream.wait()

    def check_layers(**tuning) -> None:
        for length in args.check_lengths:
            emit("layer_check", {**check_layer(length), **tuning})
            torch.cuda.empty_cache()

    for row in check_core():
        emit("core_check", row)
    check_layers()

    if args.conv_blocks:
        for row in conv_sweep(65_536, [tuple(block) for block in args.conv_blocks]):
            emit("conv_block", row)

    longest = max(args.lengths)
    layer, _ = fork_layers(seed=0)
    best = None
    for variant in args.variants:
        use_tuning(variant, folder)
        seconds, peak, spread = time_forward(layer, longest, args.runs)
        emit(
            "variant",
            {
                "tuning": variant,
                "length": longest,
                "tokens_per_sec": longest / seconds,
                "peak_gib": peak / 2**30,
                "spread": spread,
            },
        )
        if args.check_variants:
            check_layers(tuning=variant)
        if best is None or longest / seconds > best[1]:
            best = (variant, longest / seconds)
    if best is not None:  # with no variants the fork's shipped tuning.json is what gets timed
        use_tuning(best[0], folder)
        report["best_tuning"] = best[0]
        if best[0] != args.variants[0] and not args.check_variants:
            # The checks above ran the fork's own tuning: a faster variant is checked before it counts.
            check_layers(tuning=best[0])
    for length in args.lengths:
        seconds, peak, spread = time_forward(layer, length, args.runs)
        emit("fork", {"length": length, "tokens_per_sec": length / seconds, "peak_gib": peak / 2**30, "spread": spread})
    from fla.ops.quasar import chunk_quasar

    seconds = time_core(chunk_quasar, longest, args.runs)
    emit("fork_core", {"core_length": longest, "core_tokens_per_sec": longest / seconds})
    kernels, operators = kernel_breakdown(layer, longest)
    for row in kernels[:15]:
        emit("kernels", row)
    for row in operators[:15]:
        emit("operators", row)
    for row in kernel_resources():
        emit("kernel_resources", row)

    print_tables(report, longest)
    return 0


def print_tables(report: dict, longest: int) -> None:
    """The core op's speed beside upstream's (when timed), and the layer's speed and peak memory at each length."""
    up_core = [r for r in report.get("upstream", []) if "core_tokens_per_sec" in r]
    if up_core:
        fork_core = report["fork_core"][0]["core_tokens_per_sec"]
        upstream_core = up_core[0]["core_tokens_per_sec"]
        print(
            f"\ncore alone at {longest}: fork {fork_core / 1e6:.2f} M tok/s, upstream "
            f"{upstream_core / 1e6:.2f} M tok/s, ratio {fork_core / upstream_core:.2f}"
        )
    print("\nlength  fork M tok/s  peak GiB  upstream M tok/s  peak GiB  ratio")
    ups = {r["length"]: r for r in report.get("upstream", []) if "length" in r}
    for row in report["fork"]:
        up = ups.get(row["length"])
        print(
            f"{row['length']:>8}  {row['tokens_per_sec'] / 1e6:10.2f}  {row['peak_gib']:8.2f}  "
            + (
                f"{up['tokens_per_sec'] / 1e6:14.2f}  {up['peak_gib']:8.2f}  "
                f"{row['tokens_per_sec'] / up['tokens_per_sec']:5.2f}"
                if up
                else "-"
            )
        )
