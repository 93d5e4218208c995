"""What is benchmarked, made the same way on both sides of the sandbox.

The parent (validator) and the sandboxed child build the layer weights, every forward's input
and the fingerprint bases from seeds with this one module, so the parent can recompute on its
own what an honest fork must have produced. It imports only ``torch``, Triton (its kernel runs on
CUDA; where Triton is missing torch does the same work) and the standard library: the child
loads it from the harness's own copy before any fork code runs.

A request of ``count`` forwards at length ``T`` (see :class:`RequestBuffers`): the child fills
static buffers from the request's two seeds (:func:`fill_request`: the noise ``[count, T, 512]``,
the directions ``[count, 512, 32]`` and token weights ``[count, 8, T]``), then
:func:`run_forwards` runs forward ``i`` on ``noise[i]`` times a ±1 vector over the hidden
channels drawn from the bits of forward ``i - 1``'s fingerprint
(:func:`signs_from_fingerprint`, integer arithmetic only) and writes forward ``i``'s fingerprint
(:func:`fingerprint`: projections of the output and of its absolute values). Nothing in a request
waits on the host, so the child can capture it whole in one CUDA graph; the parent rebuilds input
``i`` from the seeds and the fingerprint reported for forward ``i - 1`` (:func:`forward_input`).

Determinism: weights come from a CPU generator (identical on every machine); noise and
fingerprint bases come from a generator on the evaluation device, which the parent uses too
(the same device and the same torch build give the same numbers).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # Triton is a Linux dependency; elsewhere torch computes the same on any device
    triton = None

HIDDEN_SIZE = 512
HEAD_DIM = 64
NUM_HEADS = 8
MODE = "chunk"
# The benchmark layer of docs/rules.md section 4 step 3.
LAYER_KWARGS: dict[str, Any] = {"hidden_size": HIDDEN_SIZE, "head_dim": HEAD_DIM, "num_heads": NUM_HEADS, "mode": MODE}
AUTOCAST_DTYPE = torch.bfloat16

WIDTH = NUM_HEADS * HEAD_DIM
CONV_SIZE = 4
# Parameter names and shapes of docs/rules.md section 6 (1,120,840 parameters).
PARAMETER_SHAPES: dict[str, tuple[int, ...]] = {
    "q_proj.weight": (WIDTH, HIDDEN_SIZE),
    "k_proj.weight": (WIDTH, HIDDEN_SIZE),
    "v_proj.weight": (WIDTH, HIDDEN_SIZE),
    "q_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "k_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "v_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "beta_log": (NUM_HEADS,),
    "g_proj.0.weight": (HEAD_DIM, HIDDEN_SIZE),
    "g_proj.1.weight": (WIDTH, HEAD_DIM),
    "g_proj.1.bias": (WIDTH,),
    "o_norm.weight": (HEAD_DIM,),
    "o_proj.weight": (HIDDEN_SIZE, WIDTH),
}

# The output is checked on each eighth of the sequence separately (docs/rules.md section 4 step 4).
SEGMENTS = 8
# Random +-1 directions per segment in a fingerprint; see ``fingerprint``. Each direction adds one
# sample to the mean square that estimates an eighth's error: 32 of them per eighth, 256 per
# forward, put the estimate of a forward's whole error within about 4% (one standard deviation),
# so the timed forwards can be held close to the correctness threshold (verification.py).
FINGERPRINT_DIRECTIONS = 32
# Each eighth is projected twice, the output and its absolute values (see ``fingerprint``): a
# fingerprint is float32 FINGERPRINT_SHAPE.
FINGERPRINT_PARTS = 2
FINGERPRINT_SHAPE = (SEGMENTS, FINGERPRINT_PARTS, FINGERPRINT_DIRECTIONS)
# Off CUDA, signed_sums takes an eighth's tokens this many values at a time (64 MiB in float32).
SUM_CHUNK_VALUES = 1 << 24


def make_weights(seed: int) -> dict[str, torch.Tensor]:
    """The layer's parameters for ``seed``: float32 CPU tensors keyed by fla's parameter names.

    Distributions follow PyTorch's default initialisation (uniform ±1/sqrt(fan_in)), with
    ``beta_log = log U(1, 16)`` as fla initialises it and a norm weight and gate bias away from
    their trivial values, so every parameter influences the output.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        return torch.empty(shape).uniform_(low, high, generator=generator)

    weights: dict[str, torch.Tensor] = {}
    for name, shape in PARAMETER_SHAPES.items():
        if name == "beta_log":
            weights[name] = uniform(shape, 1.0, 16.0).log()
        elif name == "o_norm.weight":
            weights[name] = uniform(shape, 0.5, 1.5)
        elif name == "g_proj.1.bias":
            weights[name] = uniform(shape, -1.0, 1.0)
        else:
            fan_in = math.prod(shape[1:])
            bound = 1.0 / math.sqrt(fan_in)
            weights[name] = uniform(shape, -bound, bound)
    return weights


def segment_bounds(seq_len: int, segments: int = SEGMENTS) -> list[tuple[int, int]]:
    """``segments`` contiguous, nearly equal ``[start, stop)`` token ranges covering the sequence."""
    cuts = [(i * seq_len) // segments for i in range(segments + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(segments)]


@dataclass
class RequestBuffers:
    """Everything a request of ``count`` forwards at length ``seq_len`` reads and writes, allocated once.

    ``noise [count, T, 512]``: forward ``i``'s input before its signs (``randn``); ``directions
    [count, 512, K]``: ±1; ``token_weights [count, 8, T]``: row ``e`` holds a random ±1 on the
    tokens of eighth ``e`` and 0 elsewhere; ``fingerprints [count, 8, 2, K]``: written by
    :func:`run_forwards`. All float32 on ``device``; the rest is scratch and generators.
    """

    count: int
    seq_len: int
    noise: torch.Tensor
    directions: torch.Tensor
    token_weights: torch.Tensor
    fingerprints: torch.Tensor
    token_signs: torch.Tensor
    segment_mask: torch.Tensor
    input_generator: torch.Generator
    basis_generator: torch.Generator

    @classmethod
    def allocate(cls, count: int, seq_len: int, device: torch.device | str) -> RequestBuffers:
        device = torch.device(device)
        mask = torch.zeros(SEGMENTS, seq_len, device=device)
        for row, (start, stop) in enumerate(segment_bounds(seq_len)):
            mask[row, start:stop] = 1.0
        return cls(
            count=count,
            seq_len=seq_len,
            noise=torch.empty(count, seq_len, HIDDEN_SIZE, device=device),
            directions=torch.empty(count, HIDDEN_SIZE, FINGERPRINT_DIRECTIONS, device=device),
            token_weights=torch.empty(count, SEGMENTS, seq_len, device=device),
            fingerprints=torch.zeros(count, *FINGERPRINT_SHAPE, device=device),
            token_signs=torch.empty(count, seq_len, device=device),
            segment_mask=mask,
            input_generator=torch.Generator(device=device),
            basis_generator=torch.Generator(device=device),
        )


def fill_request(buffers: RequestBuffers, input_seed: int, basis_seed: int) -> None:
    """Fill the noise from ``input_seed`` and the fingerprint bases from ``basis_seed`` (a few launches)."""
    buffers.noise.normal_(generator=buffers.input_generator.manual_seed(input_seed))
    generator = buffers.basis_generator.manual_seed(basis_seed)
    buffers.directions.random_(0, 2, generator=generator).mul_(2).sub_(1)
    buffers.token_signs.random_(0, 2, generator=generator).mul_(2).sub_(1)
    torch.mul(buffers.segment_mask, buffers.token_signs[:, None, :], out=buffers.token_weights)


# signs_from_fingerprint: the values of the first SIGN_DIRECTIONS directions of the output's
# projections of every eighth, each value's 32 bits times an odd constant (mod 2^32); bits 28-31 of
# the product depend on all 32 bits of the value, and one unit in its last place changes them. The
# bits masked to 32 and a multiplier below 2^31 keep every product under 2^63, so int64 arithmetic
# is exact on every device and in the parent's check.
SIGN_DIRECTIONS = 16
SIGN_VALUES = SEGMENTS * SIGN_DIRECTIONS
SIGN_BITS = HIDDEN_SIZE // SIGN_VALUES
_SIGN_MULTIPLIER = 0x2545F491
_LOW_32 = 0xFFFFFFFF


def signs_from_fingerprint(fingerprint_values: torch.Tensor) -> torch.Tensor:
    """A ±1 int64 vector ``[512]`` from the bits of a float32 fingerprint ``[8, 2, K]``, on its device
    (``[..., 512]`` from fingerprints ``[..., 8, 2, K]``, each on its own).

    ``signs[4 p + b]`` is ``-1`` where bit ``28 + b`` of ``(bits of value p) * 0x2545F491`` is set,
    value ``p`` being the fingerprint's ``[p // 16, 0, p % 16]`` (the first 16 projections of the
    output of each eighth). Integer operations only, so the parent gets exactly the child's signs
    from the float values the child reported. Six launches, none reading host memory (a CUDA graph
    captures them).
    """
    device = fingerprint_values.device
    leading = fingerprint_values.shape[:-3]
    used = fingerprint_values[..., 0, :SIGN_DIRECTIONS]
    words = used.reshape(*leading, -1).contiguous().view(torch.int32).to(torch.int64)
    mixed = (words & _LOW_32) * _SIGN_MULTIPLIER
    shifted = mixed[..., None] >> torch.arange(32 - SIGN_BITS, 32, device=device, dtype=torch.int64)
    # (-1)^n is -1 exactly where n's lowest bit, the bit shifted down, is set.
    return torch.pow(-1, shifted.reshape(*leading, -1))


def forward_input(noise: torch.Tensor, previous: torch.Tensor | None) -> torch.Tensor:
    """A forward's input ``[1, T, 512]``: its noise ``[T, 512]``, times the signs from the previous
    forward's fingerprint (``None`` for a request's first forward)."""
    if previous is None:
        return noise.unsqueeze(0)
    return (noise * signs_from_fingerprint(previous)).unsqueeze(0)


def chained_inputs(noise: torch.Tensor, fingerprints: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The inputs ``[stop - start, T, 512]`` of forwards ``start`` to ``stop - 1`` of a request, at
    once: each one's ``noise [count, T, 512]`` times the signs of the fingerprint ``fingerprints
    [count, 8, K]`` holds for the forward before (none for the request's first), as
    :func:`forward_input` makes them one by one."""
    inputs = noise[start:stop].clone()
    signed = max(start, 1)
    if signed < stop:
        signs = signs_from_fingerprint(fingerprints[signed - 1 : stop - 1].to(noise.device))
        inputs[signed - start :] *= signs[:, None, :]
    return inputs


def fingerprint(
    output: torch.Tensor, directions: torch.Tensor, token_weights: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Random projections of a layer output ``[1, T, 512]`` and of its absolute values: float32
    ``[8, 2, K]`` (:data:`FINGERPRINT_SHAPE`), written to ``out`` if given.

    ``[e, 0, j]`` is ``sum over tokens t in eighth e of w_t * <out_t, R_j>`` (``R`` = ``directions
    [512, K]``, ``token_weights [8, T]`` = ``w_t`` on eighth ``e``'s tokens in row ``e``): a
    projection of the eighth onto a random ±1 pattern, so for any error ``E`` the mean square of the
    projections of ``E`` over the ``K`` columns estimates ``||E_e||²`` (pairwise-independent signs).
    ``[e, 1, j]`` is the same of ``|out_t|``, elementwise. The first part is linear in the output:
    the eight sums of ``w_t out_t`` give it, and a fork, knowing the weights before its forward, could
    compute those without the output (o_proj of the weighted sums of its inputs) and leave the tokens
    zeros. The second needs every value of every token. ``||a| - |b|| <= |a - b|`` elementwise and
    ``||out||`` = ``|||out|||``, so the second part's relative error is never above the first's: the
    same tolerances hold for both (verification.py). The output is read once, in its own dtype, into
    float32 sums (:func:`signed_sums`); a NaN or infinity in an eighth makes that eighth's row
    non-finite.
    """
    sums = signed_sums(output.reshape(1, -1, output.shape[-1]), token_weights[None])[0]
    return torch.matmul(sums, directions, out=out)


def signed_sums(outputs: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """For each eighth of each of ``outputs [n, T, C]`` under its token weights ``[n, 8, T]``: the sum of
    ``w_t out_t`` and the sum of ``w_t |out_t|`` over the eighth's tokens, float32 ``[n, 8, 2, C]``.

    On CUDA one Triton kernel reads each output once: float32 partial sums over fixed ranges of
    tokens, added in a fixed order (deterministic, no host synchronisation). Elsewhere torch,
    an eighth's tokens :data:`SUM_CHUNK_VALUES` values at a time (no float32 copy of a whole output).
    """
    if outputs.is_cuda and triton is not None:
        return _signed_sums_triton(outputs, token_weights)
    return _signed_sums_torch(outputs, token_weights)


def _signed_sums_torch(outputs: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    count, length, width = outputs.shape
    sums = torch.zeros(count, SEGMENTS, FINGERPRINT_PARTS, width, device=outputs.device)
    step = max(1, SUM_CHUNK_VALUES // (count * width))
    for row, (start, stop) in enumerate(segment_bounds(length)):
        for begin in range(start, stop, step):
            end = min(begin + step, stop)
            values = outputs[:, begin:end].to(torch.float32)
            weights = token_weights[:, row, None, begin:end].to(torch.float32)
            sums[:, row, 0] += torch.bmm(weights, values)[:, 0]
            sums[:, row, 1] += torch.bmm(weights, values.abs())[:, 0]
    return sums


def _signed_sums_triton(outputs: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    count, length, width = outputs.shape
    splits = min(max(length // SEGMENTS // _SPLIT_TOKENS, 1), _MAX_SPLITS)
    partial = torch.empty(count * SEGMENTS, splits, FINGERPRINT_PARTS, width, device=outputs.device)
    weights = token_weights.contiguous()
    grid = (count * SEGMENTS, splits, width // _SUM_CHANNELS)
    _signed_sums_kernel[grid](
        outputs,
        weights,
        partial,
        length,
        width,
        splits,
        *outputs.stride(),
        weights.stride(0),
        weights.stride(1),
        SEGMENTS,
        _SUM_TOKENS,
        _SUM_CHANNELS,
    )
    return partial.sum(1).view(count, SEGMENTS, FINGERPRINT_PARTS, width)


def run_forwards(
    forward: Callable[[torch.Tensor], torch.Tensor], buffers: RequestBuffers, count: int | None = None
) -> torch.Tensor:
    """The forwards of a filled request, one after another: forward ``i`` runs on
    ``forward_input(noise[i], fingerprints[i - 1])`` and writes ``fingerprints[i]``. Launches
    only (no host synchronisation), so it can be captured in a CUDA graph. ``count``: only the
    first ``count`` forwards (default all). Returns the last output.
    """
    output: torch.Tensor | None = None
    for index in range(buffers.count if count is None else min(count, buffers.count)):
        previous = buffers.fingerprints[index - 1] if index else None
        hidden = forward_input(buffers.noise[index], previous)
        output = None
        output = forward(hidden)
        del hidden
        fingerprint(output, buffers.directions[index], buffers.token_weights[index], out=buffers.fingerprints[index])
    assert output is not None, "a request has at least one forward"
    return output


def fingerprints_of(outputs: torch.Tensor, directions: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """:func:`fingerprint` of each of ``outputs [n, T, 512]`` under its own basis (``directions
    [n, 512, K]``, ``token_weights [n, 8, T]``): float32 ``[n, 8, 2, K]``."""
    sums = signed_sums(outputs, token_weights).flatten(1, 2)
    return torch.bmm(sums, directions).unflatten(1, (SEGMENTS, FINGERPRINT_PARTS))


def segment_norms_of(outputs: torch.Tensor) -> torch.Tensor:
    """:func:`segment_norms` of each of ``outputs [n, T, 512]``: float32 ``[n, 8]``."""
    return torch.stack(
        [
            torch.linalg.vector_norm(outputs[:, start:stop], dim=(1, 2), dtype=torch.float32)
            for start, stop in segment_bounds(outputs.shape[1])
        ],
        1,
    )


def segment_norms(output: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each eighth of an output ``[1, T, 512]``, float32 ``[8]``."""
    flat = output.reshape(-1, output.shape[-1])
    return torch.stack(
        [
            torch.linalg.vector_norm(flat[start:stop], dtype=torch.float32)
            for start, stop in segment_bounds(flat.shape[0])
        ]
    )


# The Triton kernel of signed_sums (CUDA): tiles of _SUM_TOKENS tokens by _SUM_CHANNELS channels;
# each eighth split among programs of _SPLIT_TOKENS tokens or more, at most _MAX_SPLITS (a million
# tokens: 4,096 programs on an H100's 132 multiprocessors; the output read at 2.6 TB/s, 415 µs,
# against 387 µs for the one matrix product of the linear part alone).
_SUM_TOKENS = 128
_SUM_CHANNELS = 64
_SPLIT_TOKENS = 2048
_MAX_SPLITS = 64

if triton is not None:

    @triton.jit
    def _signed_sums_kernel(
        x_ptr,
        w_ptr,
        partial_ptr,
        length,
        width,
        splits,
        stride_xn,
        stride_xt,
        stride_xc,
        stride_wn,
        stride_we,
        SEGMENTS: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        row = tl.program_id(0)
        split = tl.program_id(1)
        forward = row // SEGMENTS
        eighth = row % SEGMENTS
        start = eighth * length // SEGMENTS
        stop = (eighth + 1) * length // SEGMENTS
        share = tl.cdiv(stop - start, splits)
        first = start + split * share
        last = tl.minimum(first + share, stop)
        channels = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
        x_row = x_ptr + forward.to(tl.int64) * stride_xn + channels[None, :] * stride_xc
        w_row = w_ptr + forward.to(tl.int64) * stride_wn + eighth * stride_we
        linear = tl.zeros([BLOCK_C], dtype=tl.float32)
        absolute = tl.zeros([BLOCK_C], dtype=tl.float32)
        for begin in range(first, last, BLOCK_T):
            tokens = begin + tl.arange(0, BLOCK_T)
            inside = tokens < last
            values = tl.load(x_row + tokens[:, None].to(tl.int64) * stride_xt, mask=inside[:, None], other=0.0)
            values = values.to(tl.float32)
            weights = tl.load(w_row + tokens, mask=inside, other=0.0)[:, None]
            linear += tl.sum(values * weights, axis=0)
            absolute += tl.sum(tl.abs(values) * weights, axis=0)
        out = partial_ptr + (row * splits + split).to(tl.int64) * 2 * width + channels
        tl.store(out, linear)
        tl.store(out + width, absolute)
