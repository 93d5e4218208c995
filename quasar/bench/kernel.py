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

Everything is written to DIR (``bench.json``, ``log.txt``); the tables are printed last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from quasar.evaluate.verification import worst_block_error
from quasar.evaluate.workload import HEAD_DIM, HIDDEN_SIZE, NUM_HEADS
from quasar.log import setup_logging
from quasar.reference import QuasarAttentionReference, chunk_quasar_reference, relative_error
from quasar.starter_fork import template_root

# The layer validators benchmark (quasar.evaluate.workload).
LAYER: dict[str, Any] = {"hidden_size": HIDDEN_SIZE, "head_dim": HEAD_DIM, "num_heads": NUM_HEADS}
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


def time_forward(layer: nn.Module, length: int, runs: int, warmup: int = 2) -> tuple[float, int, float]:
    """Median seconds of one forward of ``randn(1, length, 512)`` under bf16 autocast, the peak
    device memory (bytes, input included) of one forward, and the runs' spread: (slowest -
    fastest) / median."""
    x = torch.randn(1, length, LAYER["hidden_size"], device="cuda")
    times = []
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        for _ in range(warmup):
            layer(x)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(runs):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = layer(x)[0]
            stop.record()
            del out
            torch.cuda.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
    peak = torch.cuda.max_memory_allocated()
    del x
    torch.cuda.empty_cache()
    median = statistics.median(times)
    return median, peak, (max(times) - min(times)) / median


def kernel_breakdown(layer: nn.Module, length: int) -> tuple[list[dict], list[dict]]:
    """Device time of one forward (after a warm-up), largest first: per kernel name, and per
    PyTorch operator and input shapes (which line of the layer launched what)."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(1, length, LAYER["hidden_size"], device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            layer(x)
            torch.cuda.synchronize()
    totals: dict[str, list[float]] = {}
    for event in prof.events():
        if event.device_type.name == "CUDA":
            entry = totals.setdefault(event.name, [0.0, 0])
            entry[0] += event.device_time_total / 1e3
            entry[1] += 1
    kernels = [
        {"kernel": k[:90], "ms": v[0], "calls": v[1]}
        for k, v in sorted(totals.items(), key=lambda item: item[1][0], reverse=True)
    ]
    operators = sorted(
        (
            {
                "operator": row.key,
                "shapes": str(row.input_shapes)[:120],
                "ms": row.self_device_time_total / 1e3,
                "calls": row.count,
            }
            for row in prof.key_averages(group_by_input_shape=True)
            if row.self_device_time_total > 0
        ),
        key=lambda r: -r["ms"],
    )
    return kernels, operators


def kernel_resources() -> list[dict]:
    """Registers and spills of every compiled variant of the fork's Triton kernels (run them first).

    Read from Triton's per-device kernel caches, whose layout is private to Triton: a version
    that keeps them elsewhere gives an empty list rather than an error.
    """
    import importlib

    import triton

    rows = []
    for module_name in ("wy", "chunk", "chunk_intra_token_parallel", "layer_kernels"):
        module = importlib.import_module(f"fla.ops.quasar.{module_name}")
        for name, fn in vars(module).items():
            if not isinstance(fn, triton.runtime.jit.JITFunction) or fn.__module__ != module.__name__:
                continue
            for caches in getattr(fn, "device_caches", {}).values():
                compiled = caches[0] if isinstance(caches, tuple) and isinstance(caches[0], dict) else {}
                for kernel in compiled.values():
                    rows.append(
                        {
                            "kernel": name,
                            "num_warps": kernel.metadata.num_warps,
                            "registers": getattr(kernel, "n_regs", None),
                            "spills": getattr(kernel, "n_spills", None),
                        }
                    )
    return rows


def conv_sweep(length: int, blocks: list[tuple[int, int, int]], runs: int = 20) -> list[dict]:
    """Median milliseconds of the fused causal conv + SiLU of q, k and v on a ``length``-token tile
    of the layer's projection (as the layer reads it: in place, after the 3 inputs before the
    tile) for each (tokens, channels, warps)."""
    import triton.testing
    from fla.ops.quasar.layer_kernels import causal_conv_silu

    width = 3 * LAYER["hidden_size"]
    projected = torch.randn(1, 3 + length, width + LAYER["head_dim"], device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(width, 4, device="cuda")
    rows = []
    for block in blocks:
        ms = triton.testing.do_bench(
            lambda block=block: causal_conv_silu(projected, weight, 3, block), rep=runs * 5, return_mode="median"
        )
        rows.append({"block": list(block), "length": length, "ms": ms, "gb_per_s": 2 * length * width * 2 / ms / 1e6})
    return rows


@contextlib.contextmanager
def compiling_only(threads: int):
    """Every Triton kernel launched inside compiles (on ``threads`` threads at once, Triton's
    AsyncCompileMode) and does not run: a forward inside is a dry run that compiles its kernels."""
    from triton.runtime import _async_compile
    from triton.runtime.jit import KernelInterface

    launch = KernelInterface.__getitem__
    KernelInterface.__getitem__ = lambda kernel, grid: (
        lambda *args, **kwargs: kernel.run(*args, grid=grid, warmup=True, **kwargs)
    )
    try:
        with ThreadPoolExecutor(threads) as pool, _async_compile.AsyncCompileMode(pool):
            yield
    finally:
        KernelInterface.__getitem__ = launch


def compile_sweep(lengths: list[int], threads: int = 0) -> list[dict]:
    """The first and second forward of the fork's layer at each length in turn, as a fresh
    evaluation meets them, with the Triton kernels compiled for each (new ``.cubin`` files in
    ``TRITON_CACHE_DIR``, which should start empty): where an evaluation's warm-up time goes.
    ``threads``: first a dry forward that compiles the length's kernels on that many threads at once."""
    cache = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    layer, _ = fork_layers(seed=0)
    seen = set(cache.rglob("*.cubin")) if cache.exists() else set()
    rows = []
    for length in lengths:
        x = torch.randn(1, length, LAYER["hidden_size"], device="cuda")
        seconds = []
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            dry_s = None
            if threads:
                torch.cuda.synchronize()
                started = time.perf_counter()
                with compiling_only(threads):
                    layer(x)
                torch.cuda.synchronize()
                dry_s = time.perf_counter() - started
            for _ in range(2):
                torch.cuda.synchronize()
                started = time.perf_counter()
                layer(x)
                torch.cuda.synchronize()
                seconds.append(time.perf_counter() - started)
        compiled = set(cache.rglob("*.cubin")) - seen
        seen |= compiled
        rows.append(
            {
                "length": length,
                "threads": threads,
                "dry_s": dry_s,
                "first_s": seconds[0],
                "second_s": seconds[1],
                "compiled": len(compiled),
                "kernels": sorted(path.stem for path in compiled),
            }
        )
        del x
        torch.cuda.empty_cache()
    return rows


# --- the upstream path (child process: fla-core's ``fla``, not the fork's) ---


class UpstreamLayer(nn.Module):
    """The benchmark layer built from upstream fla's modules (``ShortConvolution``,
    ``FusedRMSNormGated``) with its ``chunk_delta_rule`` (beta := alpha, scale 1) as the core."""

    def __init__(self):
        super().__init__()
        from fla.modules import FusedRMSNormGated, ShortConvolution

        self.reference = QuasarAttentionReference(**LAYER, mode="chunk")
        params = dict(self.reference.named_parameters())
        width = LAYER["num_heads"] * LAYER["head_dim"]
        convs = [ShortConvolution(width, 4, bias=False, activation="silu") for _ in "qkv"]
        self.convs = nn.ModuleList(convs)
        for conv, name in zip(convs, "qkv", strict=True):
            conv.weight.data.copy_(params[f"{name}_conv1d.weight"])
        self.norm = FusedRMSNormGated(LAYER["head_dim"], activation="sigmoid", eps=1e-5)
        self.norm.weight.data.copy_(params["o_norm.weight"])

    def forward(self, x):
        from fla.ops.delta_rule import chunk_delta_rule

        r, H, D = self.reference, LAYER["num_heads"], LAYER["head_dim"]
        params = dict(r.named_parameters())
        q, k, v = (
            conv(F.linear(x, params[f"{name}_proj.weight"]))[0].unflatten(-1, (H, D))
            for conv, name in zip(self.convs, "qkv")
        )
        alpha = upstream_alpha(k, F.softplus(params["beta_log"].float()))
        o, _ = chunk_delta_rule(q, k, v, alpha.to(q.dtype), scale=1.0)
        g = F.linear(F.linear(x, params["g_proj.0.weight"]), params["g_proj.1.weight"], params["g_proj.1.bias"])
        y = self.norm(o, g.unflatten(-1, (H, D))).flatten(-2)
        return (F.linear(y, params["o_proj.weight"]),)


def upstream_alpha(k: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """alpha_t per token and head (fp32) for keys ``k [B, T, H, D]``."""
    lam = k.float().square().sum(-1)
    return -torch.expm1(-beta * lam) / (lam + 1e-8)


def time_core(op, length: int, runs: int) -> float:
    """Median seconds of ``op(q, k, v, beta)`` on random bf16 ``[1, length, 8, 64]`` inputs."""
    generator = torch.Generator(device="cuda").manual_seed(3)
    shape = (1, length, LAYER["num_heads"], LAYER["head_dim"])
    q, k, v = (torch.randn(shape, device="cuda", generator=generator) for _ in range(3))
    q, k, v = q.bfloat16(), (F.silu(k) * 0.5).bfloat16(), v.bfloat16()
    beta = torch.rand(LAYER["num_heads"], device="cuda", generator=generator) * 4 + 0.5
    times = []
    with torch.inference_mode():
        for index in range(runs + 2):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            op(q, k, v, beta)
            stop.record()
            torch.cuda.synchronize()
            if index >= 2:
                times.append(start.elapsed_time(stop) / 1e3)
    return statistics.median(times)


def upstream_main(args) -> int:
    torch.manual_seed(0)
    layer = UpstreamLayer().cuda()
    results = []
    for length in args.lengths:
        seconds, peak, spread = time_forward(layer, length, args.runs)
        results.append(
            {"length": length, "tokens_per_sec": length / seconds, "peak_gib": peak / 2**30, "spread": spread}
        )
        print(json.dumps(results[-1]), flush=True)
    from fla.ops.delta_rule import chunk_delta_rule

    alphas = {}

    def core(q, k, v, beta):
        if q.shape[1] not in alphas:
            alphas[q.shape[1]] = upstream_alpha(k, beta).to(q.dtype)
        return chunk_delta_rule(q, k, v, alphas[q.shape[1]], scale=1.0)

    length = max(args.lengths)
    seconds = time_core(core, length, args.runs)
    print(json.dumps({"core_length": length, "core_tokens_per_sec": length / seconds}), flush=True)
    if args.check:
        check_length = args.check_lengths[0]
        x = torch.randn(1, check_length, LAYER["hidden_size"], device="cuda")
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x)[0]
        expected = layer.reference(x)[0]
        print(json.dumps({"upstream_check": check_length, "error": relative_error(out, expected)}), flush=True)
    (args.out / "upstream.json").write_text(json.dumps(results, indent=1))
    return 0


# --- the fork ---


def fork_layers(seed: int):
    from fla.layers.quasar import QuasarAttention

    torch.manual_seed(seed)
    layer = QuasarAttention(**LAYER, mode="chunk").cuda()
    reference = QuasarAttentionReference(**LAYER, mode="chunk").cuda()
    reference.load_state_dict(layer.state_dict(), strict=True)
    return layer, reference


def check_layer(length: int) -> dict:
    layer, reference = fork_layers(seed=length)
    x = torch.randn(1, length, LAYER["hidden_size"], device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(x)[0]
    finite = bool(out.isfinite().all())
    expected = reference(x)[0]
    bounds = [length * i // 8 for i in range(9)]
    parts = [relative_error(out[:, a:b], expected[:, a:b]) for a, b in zip(bounds, bounds[1:]) if b > a]
    return {
        "length": length,
        "finite": finite,
        "error": relative_error(out, expected),
        "worst_eighth": max(parts),
        "worst_block": worst_block_error(out, expected),
    }


def check_core() -> list[dict]:
    from fla.ops.quasar import chunk_quasar

    rows = []
    generator = torch.Generator(device="cuda").manual_seed(7)
    cu = torch.tensor([0, 1000, 1001, 70_000, 70_063, 200_000], device="cuda", dtype=torch.int32)
    T = int(cu[-1])
    q, k, v = (torch.randn(1, T, 8, 64, device="cuda", generator=generator) for _ in range(3))
    k = torch.nn.functional.silu(k) * 0.3
    beta = torch.rand(8, device="cuda", generator=generator) * 4 + 0.1
    h0 = torch.randn(5, 8, 64, 64, device="cuda", generator=generator) * 0.1
    for dtype in (torch.float32, torch.bfloat16):
        qd, kd, vd = (x.to(dtype) for x in (q, k, v))
        o, final = chunk_quasar(qd, kd, vd, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu)
        outs, states = [], []
        bounds = cu.tolist()
        for n in range(5):
            a, b = bounds[n], bounds[n + 1]
            ro, rs = chunk_quasar_reference(
                qd[:, a:b], kd[:, a:b], vd[:, a:b], beta, h0[n : n + 1], output_final_state=True
            )
            assert rs is not None  # output_final_state=True
            outs.append(ro)
            states.append(rs)
        rows.append(
            {
                "core": str(dtype),
                "output_error": relative_error(o, torch.cat(outs, 1)),
                "final_state_error": relative_error(final, torch.cat(states)),
            }
        )
    return rows


def use_tuning(variant: dict, folder: Path) -> None:
    """Point the fork at a tuning file holding ``variant``."""
    import fla.ops.quasar.tuning as tuning

    path = folder / f"tuning_{abs(hash(json.dumps(variant, sort_keys=True)))}.json"
    path.write_text(json.dumps(variant))
    tuning.parse_tuning(variant)
    tuning.TUNING_FILE = path
    tuning.load_tuning.cache_clear()


def forward_once(length: int, variant: dict | None, folder: Path) -> int:
    """One forward of the fork's layer at ``length`` tokens under ``variant`` (None: the fork's
    own tuning.json)."""
    if variant is not None:
        use_tuning(variant, folder)
    layer, _ = fork_layers(seed=0)
    x = torch.randn(1, length, LAYER["hidden_size"], device="cuda")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        layer(x)
    torch.cuda.synchronize()
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench kernel") -> int:
    """Check, time and profile the fork's kernels; everything is written to --out."""
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
    args = parser.parse_args(argv)
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
    return 0
