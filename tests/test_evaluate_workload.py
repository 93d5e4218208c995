"""What both sides of the sandbox make from seeds (quasar/evaluate/workload.py): weights, request buffers,
the chained inputs and the fingerprints, each fast path against a slow, obviously correct version."""

from __future__ import annotations

import itertools
import random
import struct
import textwrap

import pytest
import torch

from quasar.evaluate import references, session, workload
from quasar.evaluate.verification import (
    FINGERPRINT_TOLERANCE,
    fingerprint_error,
)
from quasar.reference import QuasarAttentionReference, relative_error
from tests.evaluate_runs import (
    RecordingLayer,
    filled,
    naive_fingerprint,
    naive_noise,
    naive_signs,
)
from tests.processes import script_results


def test_weights_are_deterministic_and_fit_the_reference_layer():
    first, again, other = workload.make_weights(7), workload.make_weights(7), workload.make_weights(8)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["q_proj.weight"], other["q_proj.weight"])
    assert {name: tuple(t.shape) for name, t in first.items()} == workload.PARAMETER_SHAPES
    assert sum(t.numel() for t in first.values()) == 1_120_840
    layer = QuasarAttentionReference(**workload.LAYER_KWARGS)
    layer.load_state_dict(first, strict=True)
    beta = torch.nn.functional.softplus(first["beta_log"])
    assert bool(((beta > 1) & (beta < 16.1)).all())


def test_request_buffers_come_from_their_seeds_alone():
    rng = random.Random()
    seeds = [rng.randrange(1 << 63) for _ in range(3)]
    count, length = rng.randint(1, 4), rng.randint(8, 300)
    first = filled(count, length, seeds[0], seeds[1])
    again = workload.RequestBuffers.allocate(count, length, "cpu")
    workload.fill_request(again, seeds[2], seeds[2])
    workload.fill_request(again, seeds[0], seeds[1])
    for name in ("noise", "directions", "token_weights"):
        assert torch.equal(getattr(first, name), getattr(again, name)), name
    # The noise is torch.randn from the input seed; the bases do not depend on it.
    assert torch.equal(first.noise, naive_noise(seeds[0], count, length))
    other_input = filled(count, length, seeds[2], seeds[1])
    assert not torch.equal(other_input.noise, first.noise)
    assert torch.equal(other_input.directions, first.directions)
    assert torch.equal(other_input.token_weights, first.token_weights)
    other_basis = filled(count, length, seeds[0], seeds[2])
    assert torch.equal(other_basis.noise, first.noise) and not torch.equal(other_basis.directions, first.directions)


@pytest.mark.parametrize("length", [8, 77, 512])
def test_token_weights_are_a_random_sign_on_each_eighth_and_zero_elsewhere(length):
    buffers = filled(3, length, random.randrange(1 << 63), random.randrange(1 << 63))
    assert set(buffers.directions.unique().tolist()) == {-1.0, 1.0}
    for index in range(3):
        weights = buffers.token_weights[index]
        for row, (start, stop) in enumerate(workload.segment_bounds(length)):
            inside = weights[row, start:stop]
            assert set(inside.unique().tolist()) <= {-1.0, 1.0}
            assert float(weights[row].abs().sum()) == stop - start
        # One sign per token, whichever row holds it.
        assert set(weights.sum(0).abs().unique().tolist()) == {1.0}
    if length >= 77:
        assert not torch.equal(buffers.token_weights[0], buffers.token_weights[1])


@pytest.mark.parametrize("length", [8, 64, 100, 1000, 100_000])
def test_segment_bounds_cover_the_sequence_in_eight_nearly_equal_parts(length):
    bounds = workload.segment_bounds(length)
    assert len(bounds) == 8 and bounds[0][0] == 0 and bounds[-1][1] == length
    assert all(stop == next_start for (_, stop), (next_start, _) in itertools.pairwise(bounds))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("seed", range(3))
def test_fingerprint_matches_the_naive_sum(seed):
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(8, 40, (1,), generator=generator))
    output = torch.randn(1, length, 512, generator=generator)
    buffers = filled(2, length, seed, seed + 100)
    for index in range(2):
        directions, weights = buffers.directions[index], buffers.token_weights[index]
        fast = workload.fingerprint(output, directions, weights).double()
        assert fast.shape == workload.FINGERPRINT_SHAPE
        assert torch.allclose(fast, naive_fingerprint(output, directions, weights), rtol=1e-4, atol=1e-3)


def test_signs_are_the_rule_recomputed_from_the_reported_floats():
    rng = random.Random()
    special = [0.0, -0.0, 1.0, -1.0, 1e-45, -3e-39, 3.4e38, float("inf"), float("-inf")]
    for trial in range(20):
        values = torch.randn(workload.FINGERPRINT_SHAPE) * 10 ** rng.uniform(-6, 6)
        if trial % 4 == 0:
            values.view(-1)[: len(special)] = torch.tensor(special)
        signs = workload.signs_from_fingerprint(values)
        assert signs.shape == (512,) and signs.tolist() == naive_signs(values.tolist())
        # What the parent rebuilds from the reply's bytes is what the child computed from its tensor.
        received = torch.frombuffer(bytearray(memoryview(values.numpy()).cast("B")), dtype=torch.float32)
        assert torch.equal(workload.signs_from_fingerprint(received.reshape(values.shape)), signs)


def coarse_move(values: torch.Tensor, position: int) -> torch.Tensor:
    """``values`` with one value moved by half its row's largest magnitude (two coarse steps or more)."""
    moved = values.clone()
    row = moved.view(-1, workload.FINGERPRINT_DIRECTIONS)[position // workload.FINGERPRINT_DIRECTIONS]
    column = position % workload.FINGERPRINT_DIRECTIONS
    row[column] += 0.5 * row.abs().max() * (1 if row[column] >= 0 else -1)
    return moved


def test_every_sign_depends_on_every_value():
    # Each input exists only once every value of the previous fingerprint does: moving any one value
    # by a coarse step draws every sign again (about half of them change).
    values = torch.randn(workload.FINGERPRINT_SHAPE)
    signs = workload.signs_from_fingerprint(values)
    changed = [
        int((workload.signs_from_fingerprint(coarse_move(values, position)) != signs).sum())
        for position in range(values.numel())
    ]
    assert 150 < min(changed) and max(changed) < 362, (min(changed), max(changed))


def old_rule_all_plus(value: float) -> float:
    """The reviewer's steering of the old rule: ``value`` with its low 8 bits chosen so that bits
    28-31 of its bits times 0x2545F491 (mod 2^32), its four signs there, are all clear (+1)."""
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    for low in range(256):
        candidate = (bits & ~0xFF) | low
        if ((candidate * 0x2545F491) % (1 << 32)) >> 28 == 0:
            return struct.unpack("<f", struct.pack("<I", candidate))[0]
    return value


def test_nudges_within_the_tolerance_do_not_steer_the_signs():
    # Attack: signs steered to a pattern known before the previous forward ends (all +1), so every
    # input of a request is its noise and a fork runs them all as one batch. Nudging the low bits of
    # every value (< 3e-5 relative) forced every sign of the old rule to +1; they are not coarse
    # words, so the signs do not move at all.
    patterns = set()
    for _ in range(8):
        values = torch.randn(workload.FINGERPRINT_SHAPE)
        signs = workload.signs_from_fingerprint(values)
        steered = torch.tensor([old_rule_all_plus(value) for value in values.view(-1).tolist()])
        assert float((steered - values.view(-1)).abs().max()) < 3e-5 * float(values.abs().max())
        assert torch.equal(workload.signs_from_fingerprint(steered.view(values.shape)), signs)
        patterns.add(tuple(signs.tolist()))
    assert len(patterns) == 8 and all(sum(pattern) < 128 for pattern in patterns)
    # A search for the most +1 signs, moving each value by up to the tolerance (more than a request
    # may spend in all) and keeping any move that adds +1 signs: each move that changes a word draws
    # every sign again, so it finds no better than the best of the patterns it drew.
    values = torch.randn(workload.FINGERPRINT_SHAPE)
    best = int(workload.signs_from_fingerprint(values).sum())
    drawn = set()
    for position in range(values.numel()):
        for step in (-FINGERPRINT_TOLERANCE, -0.01, 0.01, FINGERPRINT_TOLERANCE):
            moved = values.clone()
            moved.view(-1)[position] += step
            signs = workload.signs_from_fingerprint(moved)
            drawn.add(tuple(signs.tolist()))
            if int(signs.sum()) > best:
                values, best = moved, int(signs.sum())
    assert len(drawn) > 10 and (512 + best) // 2 < 320, (len(drawn), (512 + best) // 2)


def test_run_forwards_matches_a_slow_per_forward_chain_and_the_parents_rebuild():
    from quasar.evaluate.references import reference_outputs
    from quasar.evaluate.session import Request

    rng = random.Random()
    count, length = rng.randint(2, 5), rng.randint(8, 48)
    input_seed, basis_seed = rng.randrange(1 << 63), rng.randrange(1 << 63)
    buffers = filled(count, length, input_seed, basis_seed)
    layer_seed = rng.randrange(1 << 30)
    layer = RecordingLayer(layer_seed)
    last = workload.run_forwards(layer, buffers)
    reported = buffers.fingerprints.tolist()
    assert torch.equal(last, torch.tanh(layer.inputs[-1] @ layer.weight).bfloat16())

    # The slow chain: the noise from torch.randn, the signs in plain Python from the floats sent.
    noise = naive_noise(input_seed, count, length)
    for index in range(count):
        expected_input = noise[index] if index == 0 else noise[index] * torch.tensor(naive_signs(reported[index - 1]))
        assert torch.equal(layer.inputs[index], expected_input.unsqueeze(0)), index
        output = torch.tanh(expected_input @ layer.weight).bfloat16()
        expected = naive_fingerprint(output, buffers.directions[index], buffers.token_weights[index])
        # The fast path rounds each token's projection to the output's bfloat16 (a few 1e-3 of an
        # eighth's scale); a wrong input, basis or row would be off by about 1.
        assert fingerprint_error(reported[index], expected, workload.segment_norms(output)) < 1e-2

    # The parent rebuilds each input from the seeds and the reply's bytes (an identity "reference" returns it).
    payload = bytearray(memoryview(buffers.fingerprints.numpy()).cast("B"))
    request = Request(input_seed, basis_seed, session.parse_fingerprints(payload, count, "test"), 0)
    assert request.fingerprints.tolist() == reported
    rebuilt = references.request_buffers(request, length, "cpu")
    inputs = reference_outputs(lambda batch: (batch,), rebuilt, request, 0, count)
    assert torch.equal(inputs, torch.cat(layer.inputs))

    # count=1 (the capture's eager pass): the first forward alone, with the same fingerprint.
    first_only = RecordingLayer(layer_seed)
    again = filled(count, length, input_seed, basis_seed)
    workload.run_forwards(first_only, again, count=1)
    assert len(first_only.inputs) == 1 and torch.equal(first_only.inputs[0], layer.inputs[0])
    assert again.fingerprints[0].tolist() == reported[0] and not again.fingerprints[1:].any()


def test_the_parents_batched_checks_match_one_forward_at_a_time():
    # The parent's fast path (a batch of forwards' inputs, fingerprints, norms and signs at once)
    # against the per-forward functions the child runs, on fresh random outputs and bases.
    rng = random.Random()
    count, length = rng.randint(2, 6), rng.randint(8, 300)
    buffers = filled(count, length, rng.randrange(1 << 63), rng.randrange(1 << 63))
    reported = torch.randn(count, *workload.FINGERPRINT_SHAPE)
    outputs = torch.randn(count, length, workload.HIDDEN_SIZE)
    singles = torch.stack(
        [
            workload.fingerprint(outputs[i : i + 1], buffers.directions[i], buffers.token_weights[i])
            for i in range(count)
        ]
    )
    assert relative_error(workload.fingerprints_of(outputs, buffers.directions, buffers.token_weights), singles) < 1e-6
    assert (
        relative_error(
            workload.segment_norms_of(outputs),
            torch.stack([workload.segment_norms(outputs[i : i + 1]) for i in range(count)]),
        )
        < 1e-6
    )
    assert torch.equal(
        workload.signs_from_fingerprint(reported),
        torch.stack([workload.signs_from_fingerprint(values) for values in reported]),
    )
    start = rng.randrange(count)
    stop = rng.randint(start + 1, count)
    one_by_one = torch.cat(
        [workload.forward_input(buffers.noise[i], reported[i - 1] if i else None) for i in range(start, stop)]
    )
    assert torch.equal(workload.chained_inputs(buffers.noise, reported, start, stop), one_by_one)


def test_each_input_exists_only_after_the_previous_fingerprint():
    buffers = filled(3, 64, 1, 2)
    workload.run_forwards(lambda hidden: hidden.bfloat16(), buffers)
    first_signs = workload.signs_from_fingerprint(buffers.fingerprints[0])
    for position in (0, 511):
        assert not torch.equal(
            workload.forward_input(buffers.noise[1], coarse_move(buffers.fingerprints[0], position)),
            workload.forward_input(buffers.noise[1], buffers.fingerprints[0]),
        )
    assert torch.equal(
        workload.forward_input(buffers.noise[1], buffers.fingerprints[0])[0], buffers.noise[1] * first_signs
    )
    assert torch.equal(workload.forward_input(buffers.noise[0], None)[0], buffers.noise[0])


def test_fingerprint_of_bfloat16_output_is_close_to_float32():
    output = torch.randn(1, 256, 512)
    buffers = filled(1, 256, 4, 5)
    basis = (buffers.directions[0], buffers.token_weights[0])
    error = fingerprint_error(
        workload.fingerprint(output.bfloat16(), *basis).tolist(),
        workload.fingerprint(output, *basis),
        workload.segment_norms(output),
    )
    # bfloat16 rounding of the output itself (about 2^-9 relative) is all that separates them.
    assert error < 0.01


def test_a_change_in_one_eighth_moves_only_its_row_and_a_nan_poisons_it():
    output = torch.randn(1, 64, 512)
    buffers = filled(1, 64, 1, 2)
    basis = (buffers.directions[0], buffers.token_weights[0])
    changed = output.clone()
    changed[0, 40, 17] += 100.0
    moved = (workload.fingerprint(changed, *basis) != workload.fingerprint(output, *basis)).flatten(1).any(1)
    assert moved.tolist() == [False] * 5 + [True] + [False] * 2
    changed[0, 40, 17] = float("nan")
    finite = torch.isfinite(workload.fingerprint(changed, *basis)).flatten(1).all(1)
    assert finite.tolist() == [True] * 5 + [False] + [True] * 2


# Runs in a child process: TRITON_INTERPRET must be set before triton is imported.
KERNELS_SCRIPT = textwrap.dedent(
    """
    import json
    import torch
    from quasar.evaluate import workload
    torch.manual_seed(0)
    workload._SPLIT_TOKENS = 8  # at 150 tokens each eighth split between two programs
    res = {}
    for length, dtype, count in ((40, torch.float32, 2), (150, torch.bfloat16, 1)):
        weights = torch.randint(0, 2, (count, 8, length)).float() * 2 - 1
        output = torch.randn(count, length, 600).to(dtype)[..., 50:562]
        expected = workload._signed_sums_torch(output, weights)
        difference = workload._signed_sums_triton(output, weights) - expected
        res[f"sums-{length}"] = float(difference.abs().max() / expected.abs().max())
    values = torch.randn(4, 16, 32) * torch.logspace(-6, 6, 4)[:, None, None]
    values.view(-1)[:8] = torch.tensor([0.0, -0.0, 1e-45, -3e-39, 3.4e38, float("inf"), float("-inf"), float("nan")])
    res["signs"] = torch.equal(workload._signs_triton(values), workload._signs_torch(values))
    print(json.dumps(res))
    """
)


def test_the_cuda_kernels_compute_what_torch_does():
    # The Triton kernels of the fingerprint's sums and of the signs, run by Triton's interpreter on
    # the CPU (CI has no GPU; tests/test_evaluate_gpu.py runs them compiled), against torch.
    results = script_results(KERNELS_SCRIPT, [], 120, TRITON_INTERPRET="1")
    assert results.pop("signs") is True
    assert max(results.values()) < 1e-6, results
