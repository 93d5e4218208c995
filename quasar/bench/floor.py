"""``quasar bench floor``: what the benchmark layer's sequence of passes costs when every pass moves
its bytes at copy speed.

    quasar bench floor --out DIR [--lengths 65536,1000000] [--tile 65536] [--runs 20]

The starter fork's layer runs, per tile: the fp32 -> bf16 cast of the input, the input product
(cuBLAS), the conv + SiLU of k and v, the WY pass, the segment pass, the combine, the output pass
and the output product (cuBLAS). Here the cast and both products are the real operations, and each
Triton pass is a stand-in that reads and writes the bytes the pass must move (:func:`pass_bytes`)
as plainly as the GPU can: a copy of the bytes both read and written, a sum over the bytes only
read, a fill of the bytes only written. The combine moves almost nothing and is left out.

Two sequences are timed, each pass alone and all of them in one CUDA graph per length:

- ``today``: the passes as the starter fork runs them;
- ``fused``: the least fusion that issue 16's 120 M tokens/s at 1M needs: the cast inside the
  input product (timed as cuBLAS's product of an input already in bf16, so it flatters the fused
  product, which would read fp32) and the conv of k and v inside the WY pass (which then writes k
  for the later passes).

A sequence that cannot reach a speed at copy speed cannot reach it with real kernels either. The
tables are printed, and everything is written to DIR/floor.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from quasar.evaluate.workload import HEAD_DIM, HIDDEN_SIZE, NUM_HEADS
from quasar.log import setup_logging

# The layer validators benchmark (quasar.evaluate.workload).
LAYER: dict[str, int] = {"hidden_size": HIDDEN_SIZE, "head_dim": HEAD_DIM, "num_heads": NUM_HEADS}
BF16, FP32 = 2, 4


@dataclass(frozen=True)
class PassBytes:
    """Bytes one token's pass reads and writes; ``operation`` is "cast", "product" or "stand-in"."""

    name: str
    read: int
    write: int
    operation: str


def pass_bytes(hidden_size: int, head_dim: int, num_heads: int, fused: bool) -> list[PassBytes]:
    """Per token, each pass of the layer (``fused``: cast in the input product, conv of k and v in
    the WY pass). The projections are q | k | v | W_g1 x, 3 H D + D wide, all intermediates bf16."""
    hd = head_dim * num_heads
    projections = 3 * hd + head_dim
    passes = []
    if fused:
        passes.append(PassBytes("input product, fp32 in", FP32 * hidden_size, BF16 * projections, "product"))
        passes.append(PassBytes("conv k, v + WY", BF16 * 2 * hd, BF16 * 3 * hd, "stand-in"))
    else:
        passes.append(PassBytes("cast", FP32 * hidden_size, BF16 * hidden_size, "cast"))
        passes.append(PassBytes("input product", BF16 * hidden_size, BF16 * projections, "product"))
        passes.append(PassBytes("conv k, v", BF16 * 2 * hd, BF16 * 2 * hd, "stand-in"))
        passes.append(PassBytes("WY", BF16 * 2 * hd, BF16 * 2 * hd, "stand-in"))
    passes.append(PassBytes("segment", BF16 * 3 * hd, 0, "stand-in"))
    # q's projections (convolved as they are loaded), k, w, u and the gate's input W_g1 x.
    passes.append(PassBytes("output", BF16 * (4 * hd + head_dim), BF16 * hd, "stand-in"))
    passes.append(PassBytes("output product", BF16 * hd, BF16 * hidden_size, "product"))
    return passes


class Tiles:
    """The tensors of one tile (``tile`` tokens) and, per pass, its step ``steps[name](start, stop)``
    over tokens ``start`` to ``stop`` of an input ``x [T, hidden]`` in fp32 and an output
    ``[T, hidden]`` in bf16."""

    def __init__(self, x: torch.Tensor, tile: int, passes: list[PassBytes]):
        hidden = x.shape[1]
        device = x.device
        self.x = x
        self.out = torch.empty(x.shape, device=device, dtype=torch.bfloat16)
        self.x_bf16 = torch.empty(tile, hidden, device=device, dtype=torch.bfloat16)
        self.steps: dict[str, Callable[[int, int], None]] = {}
        for found in passes:
            if found.operation == "cast":
                self.steps[found.name] = self._cast
            elif found.operation == "product":
                self.steps[found.name] = self._product(found, tile, device)
            else:
                self.steps[found.name] = self._stand_in(found, tile, device)

    def _cast(self, start: int, stop: int) -> None:
        self.x_bf16[: stop - start].copy_(self.x[start:stop])

    def _product(self, found: PassBytes, tile: int, device) -> Callable[[int, int], None]:
        if found.name.startswith("input"):
            width = found.write // BF16
            weight = torch.randn(width, self.x.shape[1], device=device, dtype=torch.bfloat16).t()
            result = torch.empty(tile, width, device=device, dtype=torch.bfloat16)
            # The fused product's input is the whole sequence cast before timing (see the module's docstring).
            source = self.x.to(torch.bfloat16) if found.read == FP32 * self.x.shape[1] else None

            def product(start: int, stop: int) -> None:
                operand = source[start:stop] if source is not None else self.x_bf16[: stop - start]
                torch.matmul(operand, weight, out=result[: stop - start])

            return product
        weight = torch.randn(self.x.shape[1], found.read // BF16, device=device, dtype=torch.bfloat16).t()
        heads = torch.randn(tile, found.read // BF16, device=device, dtype=torch.bfloat16)

        def output_product(start: int, stop: int) -> None:
            torch.matmul(heads[: stop - start], weight, out=self.out[start:stop])

        return output_product

    @staticmethod
    def _stand_in(found: PassBytes, tile: int, device) -> Callable[[int, int], None]:
        both = min(found.read, found.write) // BF16
        only_read = (found.read - found.write) // BF16 if found.read > found.write else 0
        only_written = (found.write - found.read) // BF16 if found.write > found.read else 0
        source, copy = (torch.randn(tile, both, device=device, dtype=torch.bfloat16) for _ in range(2))
        read = torch.randn(tile, only_read, device=device, dtype=torch.bfloat16)
        written = torch.empty(tile, only_written, device=device, dtype=torch.bfloat16)
        total = torch.empty((), device=device, dtype=torch.float32)

        def stand_in(start: int, stop: int) -> None:
            rows = stop - start
            if both:
                copy[:rows].copy_(source[:rows])
            if only_read:
                torch.sum(read[:rows], dim=(0, 1), dtype=torch.float32, out=total)
            if only_written:
                written[:rows].zero_()

        return stand_in

    def run(self, names: list[str], tile: int) -> None:
        """The named passes, tile after tile, over the whole sequence."""
        length = self.x.shape[0]
        for start in range(0, length, tile):
            stop = min(start + tile, length)
            for name in names:
                self.steps[name](start, stop)


def median_seconds(work: Callable[[], None], runs: int, device: torch.device) -> tuple[float, float]:
    """Median seconds of ``work`` and the spread (max / min - 1) over ``runs`` timings after a warm-up:
    on CUDA one CUDA graph of it replayed between events, on the CPU wall-clock time."""
    if device.type != "cuda":
        work()
        times = []
        for _ in range(runs):
            begun = time.perf_counter()
            work()
            times.append(time.perf_counter() - begun)
        return statistics.median(times), max(times) / min(times) - 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        work()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        work()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(runs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times), max(times) / min(times) - 1


def measure_sequence(x: torch.Tensor, tile: int, fused: bool, runs: int, device: torch.device) -> dict:
    """One sequence of passes over ``x``: each pass alone, then all of them in one graph. Its tiles'
    buffers are freed on return, before the next sequence allocates its own."""
    length = x.shape[0]
    passes = pass_bytes(**LAYER, fused=fused)
    tiles = Tiles(x, tile, passes)
    rows = []
    for each in passes:
        seconds, spread = median_seconds(functools.partial(tiles.run, [each.name], tile), runs, device)
        rows.append(
            {
                **asdict(each),
                "seconds": seconds,
                "spread": spread,
                "bytes_per_second": (each.read + each.write) * length / seconds,
            }
        )
    names = [each.name for each in passes]
    seconds, spread = median_seconds(lambda: tiles.run(names, tile), runs, device)
    return {
        "passes": rows,
        "seconds": seconds,
        "spread": spread,
        "tokens_per_second": length / seconds,
        "bytes_per_token": sum(each.read + each.write for each in passes),
    }


def measure(length: int, tile: int, runs: int, device: torch.device) -> dict:
    """Each sequence at ``length`` tokens: every pass alone and all of them in one graph."""
    x = torch.randn(length, LAYER["hidden_size"], device=device)
    return {
        sequence: measure_sequence(x, tile, fused, runs, device)
        for sequence, fused in (("today", False), ("fused", True))
    }


def table(length: int, sequence: str, measured: dict) -> Table:
    result = Table(title=f"{sequence}, T = {length:,}: {measured['tokens_per_second'] / 1e6:.1f} M tokens/s")
    for column in ("pass", "B/token", "ms", "TB/s"):
        result.add_column(column, justify="left" if column == "pass" else "right")
    for row in measured["passes"]:
        result.add_row(
            row["name"],
            f"{row['read'] + row['write']:,}",
            f"{row['seconds'] * 1e3:.3f}",
            f"{row['bytes_per_second'] / 1e12:.2f}",
        )
    result.add_row(
        f"all (spread {measured['spread']:.1%})",
        f"{measured['bytes_per_token']:,}",
        f"{measured['seconds'] * 1e3:.3f}",
        "",
    )
    return result


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench floor") -> int:
    """Time both sequences at every length; the tables on stdout, everything in --out."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="What the benchmark layer's sequence of passes "
        "costs when every pass moves its bytes at copy speed.",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lengths", default="65536,1000000", help="comma-separated token counts")
    parser.add_argument("--tile", type=int, default=65_536, help="tokens per tile, as the layer's layer_tile_tokens")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    device = torch.device(args.device)
    lengths = [int(float(text)) for text in args.lengths.split(",") if text]
    console = Console(width=80)
    args.out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    results = {"device": name, "torch": torch.__version__, "tile": args.tile, "runs": args.runs, "lengths": {}}
    with torch.inference_mode():
        for length in lengths:
            measured = measure(length, min(args.tile, length), args.runs, device)
            results["lengths"][str(length)] = measured
            for sequence, found in measured.items():
                console.print(table(length, sequence, found))
            (args.out / "floor.json").write_text(json.dumps(results, indent=2))
    console.print(f"device: {name}")
    return 0
