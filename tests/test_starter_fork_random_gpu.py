"""The starter fork's Triton ops (fla/ops/quasar) against the chunked reference (quasar/reference)
on fresh random problems: any batch, lengths and heads, packed sequences at random offsets (one
token, chunk boundaries, long ones), with and without an initial state, in float32 and bfloat16.
tests/test_starter_fork_gpu.py checks fixed lengths; this draws the ones a fork's chunk and
segment bookkeeping could get wrong. The head size stays the benchmark's (64): each other size
compiles every kernel again (about 15 s each on an H100)."""

from __future__ import annotations

import os
import random

import pytest
import torch

from fla_package import imported_starter_fla
from quasar.reference import chunk_quasar_reference, relative_error

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,  # 40 to 110 s on an H100, nearly all of it Triton compiling for the lengths drawn
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = "cuda"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2}  # as tests/test_starter_fork_gpu.py


@pytest.fixture(scope="module")
def fla(tmp_path_factory):
    """The fork's ``fla`` package (copied from the template), removed from the process afterwards."""
    with imported_starter_fla(tmp_path_factory.mktemp("starter-random-gpu") / "fork") as package:
        yield package


def random_offsets(rng: random.Random) -> list[int]:
    """Offsets of 1 to 5 packed sequences: lengths around the 64-token chunk and longer ones."""
    lengths = [rng.choice([1, 2, 63, 64, 65, 127, 128, rng.randint(1, 3000)]) for _ in range(rng.randint(1, 5))]
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return offsets


@pytest.mark.parametrize("op_name", ["chunk_quasar", "fused_recurrent_quasar"])
def test_the_triton_ops_match_the_reference_on_random_shapes(fla, op_name):
    import fla.ops.quasar as ops

    op = getattr(ops, op_name)
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    generator = torch.Generator(device=CUDA).manual_seed(seed)
    for case in range(8):
        heads, d_k, d_v = rng.choice([1, 2, 4, 8]), 64, 64
        dtype = rng.choice([torch.float32, torch.bfloat16])
        packed = rng.random() < 0.5
        offsets = random_offsets(rng) if packed else None
        batch, length = (1, offsets[-1]) if offsets else (rng.randint(1, 3), rng.randint(1, 3000))
        sequences = len(offsets) - 1 if offsets else batch
        q = torch.randn(batch, length, heads, d_k, device=CUDA, generator=generator)
        # Keys of norm about 2 (the benchmark's scale), some near zero.
        k = torch.randn(batch, length, heads, d_k, device=CUDA, generator=generator) * 0.25
        k[:, :: rng.randint(5, 50)] *= 1e-3
        v = torch.randn(batch, length, heads, d_v, device=CUDA, generator=generator)
        beta = torch.rand(heads, device=CUDA, generator=generator) * 4 + 0.1
        h0 = None
        if rng.random() < 0.6:
            h0 = torch.randn(sequences, heads, d_k, d_v, device=CUDA, generator=generator) * 0.1
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        cu_seqlens = None if offsets is None else torch.tensor(offsets, device=CUDA, dtype=torch.int32)
        shape = (op_name, case, batch, length, heads, d_k, d_v, dtype, offsets, h0 is not None)

        o, final = op(q, k, v, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_seqlens)
        outputs: list[torch.Tensor] = []
        states: list[torch.Tensor] = []
        for n in range(sequences):
            a, b = (offsets[n], offsets[n + 1]) if offsets else (0, length)
            rows = slice(0, 1) if offsets else slice(n, n + 1)
            start = None if h0 is None else h0[n : n + 1]
            expected_o, expected_s = chunk_quasar_reference(
                q[rows, a:b], k[rows, a:b], v[rows, a:b], beta, start, output_final_state=True
            )
            assert expected_s is not None
            outputs.append(expected_o)
            states.append(expected_s)
        expected_o = torch.cat(outputs, 1 if offsets else 0)
        expected_final = torch.cat(states)
        assert o.shape == expected_o.shape and o.dtype == dtype, (seed, shape)
        assert relative_error(o, expected_o) < TOLERANCE[dtype], (seed, shape, relative_error(o, expected_o))
        assert relative_error(final, expected_final) < TOLERANCE[dtype], (seed, shape)
