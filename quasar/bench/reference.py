"""``quasar bench reference``: time the validator's own share of an evaluation, the float32
reference that checks the fork.

    quasar bench reference --out DIR [--lens 512,1024,2048,100k,1M] [--profile-lens 512,1M]

For each length, the parent's verification of one length as an evaluation runs it
(``verification.verify_length``: the timed requests it draws, the correctness request among them,
every forward of each against ``QuasarAttentionReference``, and the correctness request's whole
output) on made-up child replies of the evaluation's sizes, the longest length as the target
(more requests checked there): the same reference work, whatever the fingerprints say. Prints the seconds
per length and, at each of ``--profile-lens``, where that time goes (device time per operator from
torch.profiler, against the wall time: a wall far above the device time is host-bound).
Written to DIR/reference.json as well.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from quasar.evaluate import workload
from quasar.evaluate.cli import parse_seq_lens
from quasar.evaluate.options import DEFAULT_TOKENS_PER_REQUEST, MAX_FORWARDS_PER_REQUEST, forwards_per_request
from quasar.evaluate.report import LengthResult
from quasar.evaluate.session import Request
from quasar.evaluate.timing import LengthRun
from quasar.evaluate.verification import requests_to_verify, verify_length
from quasar.log import setup_logging
from quasar.reference import QuasarAttentionReference

# Timed requests of a made-up length (an evaluation times 2 s of them: 100 to 200 at most lengths).
TIMED_REQUESTS = 150


def made_up_run(
    length: int, generator: torch.Generator, tokens_per_request: int = DEFAULT_TOKENS_PER_REQUEST
) -> LengthRun:
    """A length's run as the child would leave it, with random fingerprints and output."""
    count = forwards_per_request(length, tokens_per_request, MAX_FORWARDS_PER_REQUEST)
    shape = workload.FINGERPRINT_SHAPE

    def request(forwards: int) -> Request:
        seeds = torch.randint(0, 2**62, (2,), generator=generator).tolist()
        return Request(seeds[0], seeds[1], torch.randn(forwards, *shape, generator=generator), round_trip_ns=1)

    run = LengthRun(LengthResult(seq_len=length, forwards_per_request=count))
    run.timed = [request(count) for _ in range(TIMED_REQUESTS)]
    run.check = run.timed[TIMED_REQUESTS // 2]
    run.repeat = Request(run.check.input_seed, run.check.basis_seed, run.check.fingerprints.clone(), 1)
    run.output = torch.randn(1, length, workload.HIDDEN_SIZE, generator=generator).to(torch.bfloat16)
    return run


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def profile(
    reference: torch.nn.Module,
    length: int,
    device: str,
    generator: torch.Generator,
    target: bool,
    tokens_per_request: int,
) -> dict:
    """Device and host time per operator (the largest) of one length's verification, and its wall time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    run = made_up_run(length, generator, tokens_per_request)
    synchronize(device)
    started = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        verify_length(run, reference, device, lambda event: None, target=target)
        synchronize(device)
    wall = time.perf_counter() - started
    rows = sorted(
        (
            {
                "operator": row.key[:60],
                "device_ms": row.self_device_time_total / 1e3,
                "host_ms": row.self_cpu_time_total / 1e3,
                "calls": row.count,
            }
            for row in prof.key_averages()
            if row.self_device_time_total > 0 or row.self_cpu_time_total > 1e4
        ),
        key=lambda row: -max(row["device_ms"], row["host_ms"]),
    )
    return {
        "length": length,
        "wall_s": wall,
        "device_s": sum(r["device_ms"] for r in rows) / 1e3,
        "operators": rows[:15],
    }


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench reference") -> int:
    """Time the reference work per length; the tables on stdout, everything in --out."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Time the validator's own share of an evaluation: the float32 reference that checks the fork.",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--lens", type=parse_seq_lens, default=(512, 1024, 2048, 100_000, 1_000_000))
    parser.add_argument("--profile-lens", type=parse_seq_lens, default=())
    parser.add_argument(
        "--tokens-per-request",
        type=int,
        default=DEFAULT_TOKENS_PER_REQUEST,
        help="tokens a request's forwards make (default: an evaluation's on CUDA, 2^18)",
    )
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    args.out.mkdir(parents=True, exist_ok=True)
    console = Console(width=80)
    generator = torch.Generator().manual_seed(0)
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(0), strict=True)
    reference = reference.to(args.device).eval()
    # The shortest length once first, untimed: the allocator's growth and the libraries' start-up.
    verify_length(
        made_up_run(min(args.lens), generator, args.tokens_per_request), reference, args.device, lambda event: None
    )
    rows = []
    for length in args.lens:
        run = made_up_run(length, generator, args.tokens_per_request)
        target = length == max(args.lens)
        forwards = requests_to_verify(run, target) * run.result.forwards_per_request
        synchronize(args.device)
        started = time.perf_counter()
        verify_length(run, reference, args.device, lambda event: None, target=target)
        synchronize(args.device)
        seconds = time.perf_counter() - started
        rows.append(
            {"length": length, "seconds": seconds, "forwards": forwards, "tokens_per_sec": forwards * length / seconds}
        )
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "lengths": rows,
    }
    result["profiles"] = [
        profile(reference, length, args.device, generator, length == max(args.lens), args.tokens_per_request)
        for length in args.profile_lens
    ]
    (args.out / "reference.json").write_text(json.dumps(result, indent=1))

    table = Table(title=f"the parent's reference per length ({result['device']})")
    for column in ("T", "seconds", "forwards checked", "M tokens/s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            f"{row['length']:,}", f"{row['seconds']:.2f}", str(row["forwards"]), f"{row['tokens_per_sec'] / 1e6:.2f}"
        )
    table.add_row("all", f"{sum(r['seconds'] for r in rows):.2f}", "", "")
    console.print(table)
    for found in result["profiles"]:
        table = Table(title=f"T={found['length']:,}: wall {found['wall_s']:.2f} s, device {found['device_s']:.2f} s")
        for column in ("operator", "device ms", "host ms", "calls"):
            table.add_column(column, justify="left" if column == "operator" else "right")
        for row in found["operators"]:
            table.add_row(row["operator"][:40], f"{row['device_ms']:.1f}", f"{row['host_ms']:.1f}", str(row["calls"]))
        console.print(table)
    return 0
