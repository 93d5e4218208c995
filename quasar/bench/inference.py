"""``quasar bench inference``: how long the miner's inference server takes at its limits.

    quasar bench inference [--device cuda] [--dtypes float32,bfloat16,float16] [--runs 3]
        [--warmup 1] [--output FILE] [--tiny]

The server (quasar/inference/server.py) runs one request at a time, the rest waiting in its
queue, and takes prompts of up to INFERENCE_MAX_PROMPT_LEN tokens and gen_len up to
INFERENCE_MAX_GEN_LEN; a validator's challenge is at most LOGITS_MAX_PROMPT_LEN and
LOGITS_MAX_GEN_LEN and must be answered within LOGITS_TIMEOUT (each setting at its default
here). A validator permit holder may send requests at the server's limits. This answers: how
long does one request take with the reference model's architecture (quasar.logits.REFERENCE_SHAPE,
random weights: the time does not depend on them) in each REFERENCE_DTYPE, and so how many
requests at the limits fit in LOGITS_TIMEOUT, and how many of them ahead of an honest challenge
in the queue make it miss (the challenge's own time included; its tries after a 503 are not
modelled). The model is saved to a temporary folder and loaded by the server's loader
(quasar.logits.load_reference_model); each request is timed through
quasar.logits.generate_with_logits, what the server calls. The table is printed at 80 columns
and the figures written as JSON to --output. ``--tiny`` shrinks the architecture (a CPU test).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from quasar.config import OPTIONS_BY_KEY
from quasar.evaluate.gpus import missing_gpu_here
from quasar.log import library_progress_bars, setup_logging
from quasar.logits import (
    DTYPES,
    REFERENCE_SHAPE,
    ReferenceModel,
    check_reference_shape,
    generate_with_logits,
    load_reference_model,
)

# What REFERENCE_SHAPE leaves out of Qwen2.5-0.5B-Instruct's config.json that the loader reads:
# its special ids after the ordinary vocabulary (the prompts' ids), one embedding table for input
# and output, and its context (which bounds prompt + gen_len).
REFERENCE_EXTRAS: dict[str, object] = {
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
}
TINY_SHAPE: dict[str, object] = {
    "model_type": "qwen2",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
TINY_EXTRAS: dict[str, object] = {**REFERENCE_EXTRAS, "bos_token_id": 510, "eos_token_id": 511}


def setting(key: str) -> int:
    """A setting's default (the server's and the validator's limits)."""
    return int(OPTIONS_BY_KEY[key].default)


def pairs() -> list[tuple[int, int]]:
    """(prompt tokens, gen_len) timed: a validator's largest challenge, two between, the server's limits."""
    prompt, gen = setting("inference_max_prompt_len"), setting("inference_max_gen_len")
    challenge = (setting("logits_max_prompt_len"), setting("logits_max_gen_len"))
    return [challenge, (prompt // 4, gen // 4), (prompt // 2, gen // 2), (prompt, gen)]


def parsed_as(key: str, text: str) -> Any:
    """``text`` parsed as setting ``key`` is (DEVICE, REFERENCE_DTYPE); its refusal names the setting."""
    option = OPTIONS_BY_KEY[key]
    try:
        return option.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{option.env} {error}") from None


def write_model(folder: Path, shape: dict[str, object], extras: dict[str, object]) -> Path:
    """A Qwen2 of ``shape`` with random weights, saved with save_pretrained into ``folder``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    values: dict[str, Any] = {key: value for key, value in {**shape, **extras}.items() if key != "model_type"}
    config = Qwen2Config(**values)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    with library_progress_bars(shown=False):
        model.save_pretrained(folder)
    return folder


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_request(model: ReferenceModel, prompt: Sequence[int], gen_len: int) -> float:
    """Seconds of one request, as the server's worker spends them, the logits taken at its last step.

    The wall clock around the whole generation, the device synchronised on both sides: a caller
    waits for that wall, whose host side (Python, kernel launches, a sync per token for its argmax)
    is most of a small model's decoding at batch 1; CUDA events would time only the device's part.
    """
    synchronize(model.device)
    started = time.perf_counter()
    generate_with_logits(model, prompt, gen_len, gen_len)
    synchronize(model.device)
    return time.perf_counter() - started


def measure(model: ReferenceModel, runs: int, warmup: int, rng: random.Random) -> list[dict[str, Any]]:
    """Each pair: ``warmup`` untimed requests (the allocator's growth, cuBLAS's choices for its
    shapes), then ``runs`` timed, each of a fresh random prompt of ordinary ids."""
    rows = []
    for prompt_len, gen_len in pairs():
        seconds = []
        for index in range(warmup + runs):
            prompt = [model.ordinary_tokens.draw(rng) for _ in range(prompt_len)]
            elapsed = time_request(model, prompt, gen_len)
            if index >= warmup:
                seconds.append(elapsed)
        rows.append(
            {
                "prompt_len": prompt_len,
                "gen_len": gen_len,
                "median_s": statistics.median(seconds),
                "min_s": min(seconds),
                "max_s": max(seconds),
                "runs_s": seconds,
            }
        )
    return rows


def verdict(rows: list[dict[str, Any]], timeout: float) -> dict[str, Any]:
    """From one dtype's rows: requests at the limits (the last pair) that fit in ``timeout``, and
    the fewest of them ahead of a largest challenge (the first pair) that make it miss ``timeout``."""
    limit, challenge = rows[-1]["median_s"], rows[0]["median_s"]
    return {
        "limit_median_s": limit,
        "challenge_median_s": challenge,
        "fit_in_timeout": math.floor(timeout / limit),
        "ahead_to_miss": 0 if challenge > timeout else math.floor((timeout - challenge) / limit) + 1,
    }


def main(argv: Sequence[str] | None = None, prog: str = "quasar bench inference") -> int:
    """Time the reference model's requests at the server's limits in each dtype; table and JSON."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="How long one inference server request takes at the server's limits with the "
        "reference model's architecture (random weights), in each REFERENCE_DTYPE, and how many "
        "such requests ahead of a validator's challenge make it miss LOGITS_TIMEOUT.",
    )
    parser.add_argument("--device", type=functools.partial(parsed_as, "device"), default="cuda", help="default: cuda")
    parser.add_argument(
        "--dtypes",
        type=lambda text: [parsed_as("reference_dtype", item) for item in text.split(",")],
        default=list(DTYPES),
        help=f"comma-separated (default: {','.join(DTYPES)})",
    )
    parser.add_argument("--runs", type=int, default=3, help="timed requests per pair (default: 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed requests per pair first (default: 1)")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path(os.environ.get("OUT") or ".") / "bench_inference.json",
        help="JSON of the figures (default: $OUT/bench_inference.json, else in this folder)",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen2 in place of the reference's shape")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.warmup < 0:
        parser.error(f"--runs must be at least 1 and --warmup at least 0, got {args.runs} and {args.warmup}")
    no_gpu = missing_gpu_here(args.device)  # before the model is built: 2 GB written for nothing
    if no_gpu is not None:
        parser.error(f"--device {args.device}: {no_gpu}")
    setup_logging(quiet=True)
    timeout = float(OPTIONS_BY_KEY["logits_timeout"].default)
    shape, extras = (TINY_SHAPE, TINY_EXTRAS) if args.tiny else (REFERENCE_SHAPE, REFERENCE_EXTRAS)
    device = torch.device(args.device)
    rng = random.Random(0)
    results = []
    with tempfile.TemporaryDirectory(prefix="quasar-bench-inference-") as folder:
        write_model(Path(folder), shape, extras)
        for dtype in args.dtypes:
            model = load_reference_model(folder, device, dtype)
            if not args.tiny:  # the model a server on finney would start with, not one of another shape
                check_reference_shape(model, "finney")
            rows = measure(model, args.runs, args.warmup, rng)
            results.append({"dtype": dtype, "pairs": rows, **verdict(rows, timeout)})
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": shape,
        "logits_timeout_s": timeout,
        "runs": args.runs,
        "warmup": args.warmup,
        "dtypes": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1))
    print_report(report)
    return 0


def print_report(report: dict[str, Any]) -> None:
    """The table of every dtype's pairs, then what each dtype's figures mean for a challenge."""
    console = Console(width=80)
    table = Table(title=f"one request on {report['device']} ({report['runs']} runs each)")
    for column in ("dtype", "prompt", "gen_len", "median s", "min–max s", "ms/token"):
        table.add_column(column, justify="left" if column == "dtype" else "right")
    for found in report["dtypes"]:
        for row in found["pairs"]:
            table.add_row(
                found["dtype"],
                f"{row['prompt_len']:,}",
                str(row["gen_len"]),
                f"{row['median_s']:.3f}",
                f"{row['min_s']:.3f}–{row['max_s']:.3f}",
                f"{1000 * row['median_s'] / row['gen_len']:.1f}",
            )
    console.print(table)
    timeout = report["logits_timeout_s"]
    for found in report["dtypes"]:
        limit, challenge = found["pairs"][-1], found["pairs"][0]
        console.print(
            f"{found['dtype']}: {found['fit_in_timeout']} requests at ({limit['prompt_len']:,}, "
            f"{limit['gen_len']}) fit in LOGITS_TIMEOUT ({timeout:g} s); {found['ahead_to_miss']} of them "
            f"ahead of a ({challenge['prompt_len']}, {challenge['gen_len']}) challenge make it miss."
        )
