"""Helpers of the evaluation tests: seeded buffers, slow versions of the fast paths, made-up runs."""

from __future__ import annotations

import dataclasses
import math
import struct
import time
from pathlib import Path

import torch

from quasar.evaluate import workload
from quasar.evaluate.captured_output import KEPT_OUTPUT_BYTES
from quasar.evaluate.options import EvaluationOptions
from quasar.starter_fork import write_starter_fork
from quasar.validator.devices import Device
from quasar.validator.evaluator import EvaluationOutcome, SubprocessEvaluator
from quasar.validator.records import EvaluationKey

# Tiny CPU evaluations for the tests: one warm-up, three timed runs, T=64 (one 64-token chunk)
# unless a test says otherwise.
FAST_CPU = EvaluationOptions(
    seq_lens=(),
    device="cpu",
    warmup_runs=1,
    min_timed_runs=3,
    max_timed_runs=3,
    timed_seconds=0.1,
    length_timeout_s=120,
    timeout_s=300,
)
# The GPU tests' CUDA evaluations: two warm-ups, 10 to 30 timed runs within half a second a length.
FAST_CUDA = dataclasses.replace(
    FAST_CPU, device="cuda", warmup_runs=2, min_timed_runs=10, max_timed_runs=30, timed_seconds=0.5
)


def worker_evaluation_of_the_starter_fork(folder: Path) -> EvaluationOutcome:
    """The validator's worker process evaluating the starter fork (written into ``folder``/fork) at
    T=64 on the CPU, as the validator starts it; its outcome, checked to be a correct result."""
    commit = write_starter_fork(folder / "fork")
    evaluator = SubprocessEvaluator(folder / "work", FAST_CPU, allow_local=True)
    running = evaluator.start(EvaluationKey(str(folder / "fork"), commit, 64), Device("cpu", ""))
    deadline = time.monotonic() + 240
    while (outcome := running.poll()) is None:
        assert time.monotonic() < deadline, "the worker did not finish"
        time.sleep(0.1)
    assert outcome.error is None and outcome.result.correct, outcome
    return outcome


def naive_noise(seed: int, count: int, length: int) -> torch.Tensor:
    return torch.randn(count, length, 512, generator=torch.Generator().manual_seed(seed))


def filled(count: int, length: int, input_seed: int, basis_seed: int) -> workload.RequestBuffers:
    buffers = workload.RequestBuffers.allocate(count, length, "cpu")
    workload.fill_request(buffers, input_seed, basis_seed)
    return buffers


def naive_fingerprint(output: torch.Tensor, directions: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """[e, 0, j]: the sum over eighth e's tokens of w_t <out_t, R_j>; [e, 1, j]: the same of |out_t|."""
    directions, weights = directions.double(), token_weights.double()
    flat = output.reshape(-1, output.shape[-1]).double()
    rows = []
    for row, (start, stop) in enumerate(workload.segment_bounds(flat.shape[0])):
        rows.append(
            [
                [
                    sum(float(weights[row, t]) * float(part(flat[t]) @ directions[:, j]) for t in range(start, stop))
                    for j in range(directions.shape[1])
                ]
                for part in (lambda token: token, torch.abs)
            ]
        )
    return torch.tensor(rows, dtype=torch.float64)


def naive_mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) % (1 << 32)
    x ^= x >> 15
    x = (x * 0x3243F6A9) % (1 << 32)
    return x ^ (x >> 16)


def naive_coarse_word(bits: int, largest_exponent: int) -> int:
    """A value's signed magnitude in steps of a quarter of its row's largest power of two, mod 2^32."""
    exponent = (bits >> 23) & 0xFF
    magnitude = ((bits & 0x7FFFFF) | 0x800000) >> min(largest_exponent - exponent + 21, 31)
    return (-magnitude if bits >> 31 else magnitude) % (1 << 32)


def naive_signs(values: list) -> list[int]:
    """signs_from_fingerprint in plain Python from the reported floats [8, 2, K], as the rule says."""
    rows = [
        [struct.unpack("<I", struct.pack("<f", value))[0] for value in part] for eighth in values for part in eighth
    ]
    words = []
    for row in rows:
        largest = max((bits >> 23) & 0xFF for bits in row)
        words += [naive_coarse_word(bits, largest) for bits in row]
    hashed = [naive_mix32((word + place * 0x2545F491) % (1 << 32)) for place, word in enumerate(words)]
    signs = []
    for lane in range(16):
        key = ((lane + 1) * 0x5BD1E995) % (1 << 32)
        state = naive_mix32(sum(naive_mix32(value ^ key) for value in hashed) % (1 << 32))
        signs += [-1 if (state >> bit) & 1 else 1 for bit in range(32)]
    return signs


class RecordingLayer:
    """A deterministic non-linear stand-in for the layer (bf16 output) that keeps every input it saw."""

    def __init__(self, seed: int):
        self.weight = torch.randn(512, 512, generator=torch.Generator().manual_seed(seed)) / 512**0.5
        self.inputs: list[torch.Tensor] = []

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        self.inputs.append(hidden.clone())
        return torch.tanh(hidden @ self.weight).bfloat16()


def naive_worst_block_error(output: torch.Tensor, reference: torch.Tensor, block: int) -> float:
    out = output.reshape(-1, output.shape[-1]).double()
    ref = reference.reshape(-1, reference.shape[-1]).double()
    mean_square = float((ref**2).sum()) / ref.shape[0]
    worst = 0.0
    for start in range(0, out.shape[0], block):
        part = slice(start, min(start + block, out.shape[0]))
        tokens = part.stop - part.start
        worst = max(worst, math.sqrt(float(((out[part] - ref[part]) ** 2).sum()) / (tokens * mean_square)))
    return worst


def naive_capture_text(chunks: list[bytes]) -> str:
    data = b"".join(chunks)
    head, rest = data[:KEPT_OUTPUT_BYTES], data[KEPT_OUTPUT_BYTES:]
    tail = rest[-KEPT_OUTPUT_BYTES:]
    skipped = len(rest) - len(tail)
    middle = f"\n[... {skipped} bytes left out ...]\n".encode() if skipped > 0 else b""
    return (head + middle + tail).decode("utf-8", errors="replace")


def sums_on_a_few_tokens(output: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """An output ``[1, T, C]`` whose every eighth is zeros but for its first token, which holds the
    eighth's tokens weighted by ``token_weights [8, T]`` and summed (times its own weight): the same
    signed sums, from eight vectors (a fork could get them from o_proj's summed inputs alone)."""
    flat = output[0].float()
    summed = torch.zeros_like(flat)
    for row, (start, stop) in enumerate(workload.segment_bounds(flat.shape[0])):
        weights = token_weights[row, start:stop]
        summed[start] = weights[0] * (weights @ flat[start:stop])
    return summed.to(output.dtype)[None]


def child_request(
    reference: torch.nn.Module,
    length: int,
    seeds: tuple[int, int],
    count: int,
    fake_after_first=False,
    sums_only=False,
):
    """What the child sends for a ``run`` request (the chained forwards of workload.run_forwards
    through the reference layer, bf16 outputs: the fingerprints' bytes), and the last output.
    ``fake_after_first``: forwards after the first return zeros, as a fork skipping them would;
    ``sums_only``: every forward returns :func:`sums_on_a_few_tokens` of its output (the last
    output returned is the real one, as such a fork would send it when asked)."""
    buffers = filled(count, length, *seeds)
    calls = []
    real = []

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        calls.append(len(calls))
        if fake_after_first and len(calls) > 1:
            return torch.zeros(1, length, 512, dtype=torch.bfloat16)
        with torch.inference_mode():
            output = reference(hidden)[0].bfloat16()
        real.append(output)
        return sums_on_a_few_tokens(output, buffers.token_weights[len(calls) - 1]) if sums_only else output

    output = workload.run_forwards(forward, buffers)
    return bytearray(memoryview(buffers.fingerprints.numpy()).cast("B")), real[-1] if sums_only else output


def honest_run(
    reference: torch.nn.Module, length: int, timed: int = 3, count: int = 1, fake_after_first=False, sums_only=False
):
    """A LengthRun as the parent builds it from an honest (or first-only, or sums-only) fork's replies."""
    from quasar.evaluate.report import LengthResult
    from quasar.evaluate.session import Request, parse_fingerprints
    from quasar.evaluate.timing import LengthRun

    def request(seeds: tuple[int, int], count: int, fake=False):
        payload, output = child_request(reference, length, seeds, count, fake, sums_only)
        return Request(*seeds, parse_fingerprints(payload, count, "test"), 1_000_000 * count, 1_000_000), output

    run = LengthRun(LengthResult(seq_len=length, status="ok", forwards_per_request=count))
    run.timed = [request((10 + i, 20 + i), count, fake_after_first)[0] for i in range(timed)]
    # The correctness request is a timed request like the others, its output the last forward's.
    run.check, run.output = request((1, 2), count, fake_after_first)
    run.timed.insert(timed // 2, run.check)
    run.repeat = request((1, 2), count, fake_after_first)[0]
    return run


def timed_run(length: int, count: int, timed: int):
    from quasar.evaluate.report import LengthResult
    from quasar.evaluate.session import Request
    from quasar.evaluate.timing import LengthRun

    run = LengthRun(LengthResult(seq_len=length, forwards_per_request=count))
    run.timed = [Request(index, index, torch.zeros(count, *workload.FINGERPRINT_SHAPE), 1) for index in range(timed)]
    run.check = run.timed[timed // 3]
    return run
