"""The measurements of ``quasar bench kernel`` (kernel.py) on the fork's QuasarAttention layer, on
one GPU: its checks against the reference (layer and core op), its speed and peak memory, the
core op's speed, where a forward's device time goes (per kernel and operator), the compiled
kernels' registers and spills, the causal conv kernel's block shapes and what compilation costs."""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from quasar.evaluate.verification import worst_block_error
from quasar.evaluate.workload import HEAD_DIM, HIDDEN_SIZE, NUM_HEADS
from quasar.reference import QuasarAttentionReference, chunk_quasar_reference, relative_error

# The layer validators benchmark (quasar.evaluate.workload).

LAYER: dict[str, Any] = {"hidden_size": HIDDEN_SIZE, "head_dim": HEAD_DIM, "num_heads": NUM_HEADS}


# --- the fork's layer and its checks ---


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


# --- timing ---


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
