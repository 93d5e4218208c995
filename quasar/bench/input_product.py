"""``quasar bench input-product``: the layer's input side, today's cast and cuBLAS product against
the Gluon product that casts as it loads (``fla.ops.quasar.gluon_input``), on one Hopper GPU.

    quasar bench input-product --out DIR [--fork PATH] [--lengths 65536,1000000] [--tile 65536]
                               [--tilings 128x256x32x4,...] [--runs 20]

Per tile of ``--tile`` tokens (and the W - 1 rows before it that a later tile projects again), as
the layer runs it: ``x [rows, 512]`` fp32 to ``[rows, 1600]`` bf16 with the benchmark layer's
widths. First each tiling is checked against the reference (the cast, then ``torch.matmul``) on
fresh random inputs at several row counts, written into a strided output as the layer's buffer
is; then each is timed over the whole sequence in one CUDA graph (medians and spreads of
``--runs`` replays). Tables on stdout, everything in DIR/input_product.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from quasar.bench.floor import median_seconds
from quasar.evaluate.workload import CONV_SIZE, HEAD_DIM, HIDDEN_SIZE, WIDTH
from quasar.log import setup_logging
from quasar.starter_fork import template_root

# q | k | v | W_g1 x: the benchmark layer's input projections.
PROJECTIONS = 3 * WIDTH + HEAD_DIM
# Row counts of the correctness check: under one block, ragged, a tile with its conv rows before it.
CHECK_ROWS = (1, 127, 1000, 4099, 65_536 + CONV_SIZE - 1)


def parse_tiling(text: str):
    """``MxNxKxS`` (block_m, block_n, block_k and stages) as the fork's ``InputProductTiles``."""
    from fla.ops.quasar.gluon_input import InputProductTiles

    try:
        block_m, block_n, block_k, stages = (int(part) for part in text.split("f")[0].split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a tiling is MxNxKxS, e.g. 128x128x64x6; got {text!r}") from None
    in_flight = int(text.split("f")[1]) if "f" in text else 1
    return InputProductTiles(block_m=block_m, block_n=block_n, block_k=block_k, stages=stages, in_flight=in_flight)


def label(tiling) -> str:
    """A tiling as ``parse_tiling`` reads it."""
    shape = "x".join(str(n) for n in (tiling.block_m, tiling.block_n, tiling.block_k, tiling.stages))
    return shape + (f"f{tiling.in_flight}" if tiling.in_flight != 1 else "")


def check(tiling, device: torch.device) -> dict:
    """The tiling's largest difference from the reference over :data:`CHECK_ROWS`, relative to the
    reference's largest value, with the output written into the middle of a wider buffer whose
    other columns must stay untouched."""
    from fla.ops.quasar.gluon_input import cast_product

    worst = 0.0
    generator = torch.Generator(device=device).manual_seed(torch.seed() % 2**31)
    for rows in CHECK_ROWS:
        x = torch.randn(rows, HIDDEN_SIZE, device=device, generator=generator)
        weight = (torch.randn(PROJECTIONS, HIDDEN_SIZE, device=device, generator=generator) / 16).to(torch.bfloat16)
        expected = torch.matmul(x.to(torch.bfloat16), weight.t()).float()
        buffer = torch.full((rows + 3, PROJECTIONS + 64), 7.0, device=device, dtype=torch.bfloat16)
        cast_product(x, weight, buffer[3:, :PROJECTIONS], tiling)
        if not torch.all(buffer[:3] == 7.0) or not torch.all(buffer[:, PROJECTIONS:] == 7.0):
            raise AssertionError(f"{tiling} wrote outside its output at {rows} rows")
        worst = max(worst, ((buffer[3:, :PROJECTIONS].float() - expected).abs().max() / expected.abs().max()).item())
    return {"relative_error": worst}


def sequence_work(x: torch.Tensor, weight: torch.Tensor, tile: int, tiling):
    """One pass of the input side over ``x``, tile by tile, each tile's rows with the W - 1 before
    it: ``tiling`` None is today's cast and cuBLAS product."""
    from fla.ops.quasar.gluon_input import cast_product

    length = x.shape[0]
    before = CONV_SIZE - 1
    buffer = torch.empty(tile + before, weight.shape[0], device=x.device, dtype=torch.bfloat16)
    weight_t = weight.t()

    def work() -> None:
        for start in range(0, length, tile):
            first = max(0, start - before)
            rows = x[first : min(start + tile, length)]
            out = buffer[: rows.shape[0]]
            if tiling is None:
                torch.matmul(rows.to(torch.bfloat16), weight_t, out=out)
            else:
                cast_product(rows, weight, out, tiling)

    return work


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench input-product") -> int:
    """Check every tiling, then time it and today's input side at every length."""
    parser = argparse.ArgumentParser(prog=prog, description="The layer's input side: cast + cuBLAS against Gluon.")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--fork", type=Path, default=template_root(), help="the fork's tree (default the starter's)")
    parser.add_argument("--lengths", default="65536,1000000", help="comma-separated token counts")
    parser.add_argument("--tile", type=int, default=65_536, help="tokens per tile, as the layer's layer_tile_tokens")
    parser.add_argument("--tilings", default="128x128x64x6,128x128x64x4,128x128x32x8")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    # The fork's own package is named fla, as upstream's is: its tree goes first on the import path.
    sys.path.insert(0, str(args.fork.resolve()))
    tilings = [parse_tiling(text) for text in args.tilings.split(",") if text]
    device = torch.device("cuda")
    console = Console(width=80)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "checks": {},
        "lengths": {},
    }
    import triton

    results["triton"] = triton.__version__
    labels = {None: "cast + cuBLAS"} | {tiling: label(tiling) for tiling in tilings}
    with torch.inference_mode():
        for tiling in tilings:
            results["checks"][labels[tiling]] = check(tiling, device)
        for length in (int(float(text)) for text in args.lengths.split(",") if text):
            x = torch.randn(length, HIDDEN_SIZE, device=device)
            weight = (torch.randn(PROJECTIONS, HIDDEN_SIZE, device=device) / 16).to(torch.bfloat16)
            found = {}
            for tiling in [None, *tilings]:
                seconds, spread = median_seconds(
                    sequence_work(x, weight, min(args.tile, length), tiling), args.runs, device
                )
                found[labels[tiling]] = {"seconds": seconds, "spread": spread}
            results["lengths"][str(length)] = found
            shown = Table(title=f"input side, T = {length:,}")
            for column in ("variant", "ms", "spread", "vs cast + cuBLAS", "max rel. error"):
                shown.add_column(column, justify="left" if column == "variant" else "right")
            base = found["cast + cuBLAS"]["seconds"]
            for name, row in found.items():
                error = results["checks"].get(name, {}).get("relative_error")
                shown.add_row(
                    name,
                    f"{row['seconds'] * 1e3:.3f}",
                    f"{row['spread']:.1%}",
                    f"{base / row['seconds']:.3f}x",
                    "" if error is None else f"{error:.1e}",
                )
            console.print(shown)
            (args.out / "input_product.json").write_text(json.dumps(results, indent=2))
    console.print(f"device: {results['device']}, triton {results['triton']}")
    return 0
