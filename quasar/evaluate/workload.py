"""What is benchmarked, made the same way on both sides of the sandbox.

The parent (validator) and the sandboxed child build the layer weights, every forward's input
and the fingerprint bases from seeds with this one module, so the parent can recompute on its
own what an honest fork must have produced. It imports only ``torch``, Triton (its two kernels run
on CUDA; where Triton is missing torch does the same work) and the standard library: the child
loads it from the harness's own copy before any fork code runs.

A request of ``count`` forwards at length ``T`` (see :class:`RequestBuffers`): the child fills
static buffers from the request's two seeds (:func:`fill_request`: the noise ``[count, T, 512]``,
the directions ``[count, 512, 32]`` and token weights ``[count, 8, T]``), then
:func:`run_forwards` runs forward ``i`` on ``noise[i]`` times a ±1 vector over the hidden
channels drawn from coarse words of every value of forward ``i - 1``'s fingerprint
(:func:`signs_from_fingerprint`, integer arithmetic only) and writes forward ``i``'s fingerprint
(:func:`fingerprint`: projections of the output and of its absolute values). Nothing in a request
waits on the host, so the child can capture it whole in one CUDA graph; the parent rebuilds input
``i`` from the seeds and the fingerprint reported for forward ``i - 1`` (:func:`forward_input`).

Determinism: weights come from a CPU generator (identical on every machine); noise and
fingerprint bases come from a generator on the evaluation device, which the parent uses too
(the same device and the same torch build give the same numbers).
"""

from __future__ import annotations

import contextlib
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


def segment_bounds(seq_len: int) -> list[tuple[int, int]]:
    """:data:`SEGMENTS` contiguous, nearly equal ``[start, stop)`` token ranges covering the sequence."""
    cuts = [(i * seq_len) // SEGMENTS for i in range(SEGMENTS + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(SEGMENTS)]


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


# signs_from_fingerprint. A fork may report any values within the tolerances (verification.py), so
# a value's low bits are its to choose: the signs come only from coarse words of the values, which a
# legal nudge seldom moves, each sign from all of them. A value's word is its magnitude in steps of
# 2^-COARSE_BITS of its row's largest power of two (the largest exponent among the 32 values of its
# eighth and part), signed, and 0 inside the first step: steps of 0.3 to 0.6 of the values' RMS, where
# FINGERPRINT_TOLERANCE is 0.04 of it. Each word is mixed with its place, then each of SIGN_LANES
# sums adds every mixed word again under the lane's key (mod 2^32), and the 32 bits of each mixed sum
# are 32 signs: a state of 512 bits over all the words, which the words a fork can move within the
# tolerances (about 150) cannot steer to a pattern chosen beforehand (docs/evaluation.md). Integer
# operations only, on int64 values below 2^63 (words and keys below 2^32, multipliers below 2^31):
# exact on every device.
COARSE_BITS = 2
SIGN_LANES = HIDDEN_SIZE // 32
_LOW_32 = 0xFFFFFFFF
_MIX = (0x7FEB352D, 0x3243F6A9)
_POSITION_KEY = 0x2545F491
_LANE_KEY = 0x5BD1E995


def _mix32(x, first, second):
    """A bijection of 32-bit words held in int64 (below 2^32): xor-shifts and odd multipliers below
    2^31. Plain operators and literals only: it runs on torch tensors, and jitted inside the Triton
    kernel (which reads no module globals)."""
    x = x ^ (x >> 16)
    x = (x * first) & 0xFFFFFFFF
    x = x ^ (x >> 15)
    x = (x * second) & 0xFFFFFFFF
    return x ^ (x >> 16)


def _coarse_words(rows: torch.Tensor) -> torch.Tensor:
    """The coarse words (int64, below 2^32) of float32 fingerprint values ``[..., 16, 32]``."""
    bits = rows.contiguous().view(torch.int32).to(torch.int64)
    exponent = (bits >> 23) & 0xFF
    shift = torch.clamp(exponent.amax(-1, keepdim=True) - exponent + 23 - COARSE_BITS, max=31)
    magnitude = ((bits & 0x7FFFFF) | 0x800000) >> shift
    return torch.where(bits < 0, -magnitude, magnitude) & _LOW_32


def _signs_torch(rows: torch.Tensor) -> torch.Tensor:
    """:func:`signs_from_fingerprint` of fingerprints ``[n, 16, 32]`` with torch: float32 ``[n, 512]``."""
    device = rows.device
    words = _coarse_words(rows)
    positions = torch.arange(words.shape[-2] * words.shape[-1], device=device).reshape(words.shape[-2:])
    hashed = _mix32((words + positions * _POSITION_KEY) & _LOW_32, *_MIX).flatten(-2)
    lanes = ((torch.arange(SIGN_LANES, device=device) + 1) * _LANE_KEY) & _LOW_32
    mixed = _mix32(hashed[..., None, :] ^ lanes[:, None], *_MIX)
    state = _mix32(mixed.sum(-1) & _LOW_32, *_MIX)
    bits = (state[..., None] >> torch.arange(32, device=device)) & 1
    return (1 - 2 * bits).flatten(-2).to(torch.float32)


def signs_from_fingerprint(fingerprint_values: torch.Tensor) -> torch.Tensor:
    """A ±1 float32 vector ``[512]`` from the coarse words of a float32 fingerprint ``[8, 2, K]``
    (see above), on its device (``[..., 512]`` from fingerprints ``[..., 8, 2, K]``, each on its own).

    Integer arithmetic only, so the parent gets exactly the child's signs from the float values the
    child reported: on CUDA one Triton kernel (no host synchronisation: a CUDA graph captures it),
    elsewhere torch, the same operations."""
    leading = fingerprint_values.shape[:-3]
    rows = fingerprint_values.reshape(-1, SEGMENTS * FINGERPRINT_PARTS, FINGERPRINT_DIRECTIONS).contiguous()
    signs = _signs_triton(rows) if rows.is_cuda and triton is not None else _signs_torch(rows)
    return signs.reshape(*leading, HIDDEN_SIZE)


def _launching_on(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """Triton launches on the current CUDA device, not its tensors': make it ``tensor``'s (a
    parent evaluating on cuda:1 failed otherwise). Nothing for the interpreter's CPU tensors."""
    return torch.cuda.device(tensor.device) if tensor.is_cuda else contextlib.nullcontext()


def _signs_triton(rows: torch.Tensor) -> torch.Tensor:
    signs = torch.empty(rows.shape[0], HIDDEN_SIZE, device=rows.device)
    with _launching_on(rows):
        _signs_kernel[(rows.shape[0],)](
            rows, signs, rows.shape[1], rows.shape[2], SIGN_LANES, COARSE_BITS, _POSITION_KEY, _LANE_KEY, *_MIX
        )
    return signs


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
    with _launching_on(outputs):
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


# The Triton kernels of signed_sums and signs_from_fingerprint (CUDA). signed_sums: tiles of
# _SUM_TOKENS tokens by _SUM_CHANNELS channels; each eighth split among programs of _SPLIT_TOKENS
# tokens or more, at most _MAX_SPLITS (a million tokens: 4,096 programs on an H100's 132
# multiprocessors; the output read at 2.6 TB/s, 415 µs, against 387 µs for the one matrix product
# of the linear part alone).
_SUM_TOKENS = 128
_SUM_CHANNELS = 64
_SPLIT_TOKENS = 2048
_MAX_SPLITS = 64

if triton is not None:
    _mix32_kernel = triton.jit(_mix32)

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

    @triton.jit
    def _signs_kernel(
        values_ptr,
        signs_ptr,
        ROWS: tl.constexpr,
        COLUMNS: tl.constexpr,
        LANES: tl.constexpr,
        COARSE_BITS: tl.constexpr,
        POSITION_KEY: tl.constexpr,
        LANE_KEY: tl.constexpr,
        MIX_FIRST: tl.constexpr,
        MIX_SECOND: tl.constexpr,
    ):
        # _signs_torch, operation for operation (one fingerprint a program).
        fingerprint = tl.program_id(0).to(tl.int64)
        positions = tl.arange(0, ROWS)[:, None] * COLUMNS + tl.arange(0, COLUMNS)[None, :]
        raw = tl.load(values_ptr + fingerprint * ROWS * COLUMNS + positions)
        bits = raw.to(tl.int32, bitcast=True).to(tl.int64)
        exponent = (bits >> 23) & 0xFF
        shift = tl.minimum(tl.max(exponent, axis=1)[:, None] - exponent + 23 - COARSE_BITS, 31)
        magnitude = ((bits & 0x7FFFFF) | 0x800000) >> shift
        words = tl.where(bits < 0, -magnitude, magnitude) & 0xFFFFFFFF
        keyed = (words + positions.to(tl.int64) * POSITION_KEY) & 0xFFFFFFFF
        hashed = tl.reshape(_mix32_kernel(keyed, MIX_FIRST, MIX_SECOND), [ROWS * COLUMNS])
        lanes = ((tl.arange(0, LANES).to(tl.int64) + 1) * LANE_KEY) & 0xFFFFFFFF
        mixed = _mix32_kernel(hashed[None, :] ^ lanes[:, None], MIX_FIRST, MIX_SECOND)
        state = _mix32_kernel(tl.sum(mixed, axis=1) & 0xFFFFFFFF, MIX_FIRST, MIX_SECOND)
        bit = (state[:, None] >> tl.arange(0, 32)[None, :].to(tl.int64)) & 1
        places = tl.arange(0, LANES)[:, None] * 32 + tl.arange(0, 32)[None, :]
        tl.store(signs_ptr + fingerprint * LANES * 32 + places, 1.0 - 2.0 * bit.to(tl.float32))
