"""The verification's vectorised error estimates (quasar/evaluate/verification.py) against plain
Python loops over each eighth, projection and block, on fresh random shapes and values: honest and
wrong fingerprints, zero norms, malformed and non-finite claims, blocks that do not divide the
length."""

from __future__ import annotations

import math
import random

import torch

from evaluate_runs import naive_worst_block_error
from quasar.evaluate import workload
from quasar.evaluate.verification import fingerprint_errors, worst_block_error


def naive_fingerprint_errors(claimed: list, expected: list, norms: list[float]) -> tuple[float, float]:
    """Per eighth e and part p: ||claimed[e][p] - expected[e][p]|| / (sqrt(K) * norms[e]); the
    largest over the eighths of each part. A zero norm: 0 if the claim is exact, else inf."""
    worst = [0.0, 0.0]
    for e, (claimed_e, expected_e) in enumerate(zip(claimed, expected, strict=True)):
        for p, (c, x) in enumerate(zip(claimed_e, expected_e, strict=True)):
            if not all(math.isfinite(value) for value in c):
                return math.inf, math.inf
            difference = math.sqrt(sum((a - b) ** 2 for a, b in zip(c, x, strict=True)))
            scale = math.sqrt(len(x)) * norms[e]
            error = difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)
            worst[p] = max(worst[p], error)
    return worst[0], worst[1]


def test_fingerprint_errors_match_the_loop_over_each_eighth_and_part():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    for trial in range(60):
        expected = torch.randn(workload.FINGERPRINT_SHAPE, generator=generator, dtype=torch.float64)
        norms = torch.rand(workload.SEGMENTS, generator=generator, dtype=torch.float64) * 10
        if trial % 5 == 0:
            norms[rng.randrange(workload.SEGMENTS)] = 0.0
        kind = rng.random()
        claimed = expected + torch.randn(expected.shape, generator=generator, dtype=torch.float64) * rng.choice(
            [0.0, 1e-3, 1.0]
        )
        if kind < 0.1:
            claimed.view(-1)[rng.randrange(claimed.numel())] = rng.choice([math.nan, math.inf, -math.inf])
        elif kind < 0.2:
            exact = rng.randrange(workload.SEGMENTS)  # an eighth of zero norm, claimed exactly
            norms[exact], claimed[exact] = 0.0, expected[exact]
        fast = fingerprint_errors(claimed.tolist(), expected, norms)
        slow = naive_fingerprint_errors(claimed.tolist(), expected.tolist(), norms.tolist())
        for got, want in zip(fast, slow, strict=True):
            assert got == want or math.isclose(got, want, rel_tol=1e-9), (seed, trial, fast, slow)
    wrong_shape = torch.zeros(workload.SEGMENTS, workload.FINGERPRINT_DIRECTIONS).tolist()
    assert fingerprint_errors(wrong_shape, expected, norms) == (math.inf, math.inf)


def test_worst_block_error_matches_the_loop_over_blocks_on_random_lengths():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    for trial in range(40):
        length, block = rng.randint(8, 700), rng.choice([1, 3, 16, 64, 100, 1000])
        reference = torch.randn(1, length, rng.choice([4, 32]), generator=generator)
        output = reference + rng.choice([0.0, 1e-3, 0.1]) * torch.randn(reference.shape, generator=generator)
        if rng.random() < 0.5:
            start = rng.randrange(length)
            output[0, start : start + rng.randint(1, 40)] += rng.uniform(0.1, 5.0)
        fast = worst_block_error(output, reference, block)
        slow = naive_worst_block_error(output, reference, block)
        assert math.isclose(fast, slow, rel_tol=1e-9, abs_tol=1e-15), (seed, trial, length, block, fast, slow)
