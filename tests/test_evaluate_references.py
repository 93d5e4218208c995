"""The parent's reference work (quasar/evaluate/references.py): batched references, the correctness
outputs and the checks of timed requests computed ahead, against what the child makes."""

from __future__ import annotations

import functools
import random

import torch

from quasar.evaluate import references, verification, workload
from quasar.evaluate.references import AHEAD_REQUESTS, ReferenceWork, reference_outputs
from quasar.evaluate.report import Timings
from quasar.evaluate.session import Request, parse_fingerprints
from quasar.reference import QuasarAttentionReference, relative_error
from tests.evaluate_runs import (
    child_request,
    filled,
    honest_run,
)


def counted_reference(computed, reference, buffers, request, start, stop):
    """``reference_outputs``, recording each request it computes in ``computed``."""
    computed.append(request)
    return reference_outputs(reference, buffers, request, start, stop)


def test_a_batched_reference_matches_one_forward_at_a_time():
    rng = random.Random()
    count, length = rng.randint(2, 4), rng.randint(64, 200)
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(rng.randrange(1 << 30)), strict=True)
    buffers = filled(count, length, rng.randrange(1 << 63), rng.randrange(1 << 63))
    request = Request(0, 0, torch.randn(count, *workload.FINGERPRINT_SHAPE), 0)
    batched = reference_outputs(reference, buffers, request, 0, count)
    one_at_a_time = torch.cat(
        [reference_outputs(reference, buffers, request, index, index + 1) for index in range(count)]
    )
    assert batched.shape == (count, length, workload.HIDDEN_SIZE)
    assert relative_error(batched, one_at_a_time) < 1e-5


def test_correctness_references_computed_ahead_are_those_of_the_runs_the_child_makes():
    # The parent computes each length's correctness reference on a thread while the child starts,
    # from seeds drawn before the child exists; a run made with those seeds verifies against it
    # as it would against one computed afterwards, and a run with other seeds does not.
    work = ReferenceWork(7, "cpu", [64, 96], {64: 1, 96: 1})
    reference = work.wait()
    assert sorted(work.expected) == [64, 96] and len(set(work.check_seeds.values())) == 2
    for length, seeds in work.check_seeds.items():
        buffers = filled(1, length, *seeds)
        with torch.inference_mode():
            assert torch.equal(work.expected[length], reference(buffers.noise[0:1])[0])
    runs = {length: honest_run(reference, length) for length in (64, 96)}
    for length, run in runs.items():
        seeds = work.check_seeds[length]
        # At 96 the child runs the correctness run on another input than the seeds it was sent.
        used = seeds if length == 64 else (seeds[0] + 1, seeds[1])
        payload, run.output = child_request(reference, length, used, 1)
        run.timed.remove(run.check)
        run.check = Request(*seeds, parse_fingerprints(payload, 1, "test"), 1)
        run.timed.append(run.check)
        run.repeat = run.check
    reasons = verification.verify_all(runs, work, Timings(), lambda event: None, 96)
    assert runs[64].result.correct is True and runs[64].result.rel_error < 5e-3
    assert runs[96].result.correct is False and runs[96].result.rel_error > 0.3
    assert any(reason.startswith("T=96: the output differs from the reference") for reason in reasons)
    assert work.expected == {}


def test_the_rehearsal_checks_a_made_up_batch_as_a_timed_request_is_checked(monkeypatch):
    work = ReferenceWork(3, "cpu", [64], {64: 1})
    work.wait()
    batches = []

    def recording(reference, buffers, request, start, stop):
        batches.append((buffers.seq_len, stop - start, tuple(request.fingerprints.shape)))
        return reference_outputs(reference, buffers, request, start, stop)

    monkeypatch.setattr(references, "reference_outputs", recording)
    monkeypatch.setattr(references, "MAX_FORWARDS_PER_REQUEST", 4)  # a request's most; small for the CPU
    work.rehearse(64)
    assert batches == [(64, 4, (4, *workload.FINGERPRINT_SHAPE))]
    assert sorted(work.expected) == [64]


def test_checks_computed_ahead_are_those_of_the_requests_the_child_makes(monkeypatch):
    # ReferenceWork computes, while the child warms up, the expected fingerprints of timed requests
    # at random places of the seed pool; a request made on those seeds checks against them as it
    # would against a reference computed afterwards.
    work = ReferenceWork(11, "cpu", [64], {64: 1}, pool_size=30, ahead=True)
    work.complete()
    reference = work.wait()
    ahead = work.precomputed[64]
    assert len(ahead) == min(AHEAD_REQUESTS, 30) and set(ahead) <= set(range(30))
    for place, (fingerprints, norms) in ahead.items():
        buffers = filled(1, 64, *work.timed_seeds[64][place])
        with torch.inference_mode():
            output = reference(buffers.noise[0:1])[0]
        assert torch.allclose(
            fingerprints,
            workload.fingerprint(output, buffers.directions[0], buffers.token_weights[0]),
            rtol=1e-4,
            atol=1e-4,
        )
        assert torch.allclose(norms, workload.segment_norms(output), rtol=1e-5)
    # An honest run whose timed requests took the pool's seeds passes; one whose requests were
    # answered on other inputs fails, checked from the values computed ahead alone.
    for honest in (True, False):
        run = honest_run(reference, 64, timed=12)
        regular = [request for request in run.timed if request is not run.check]
        for position, request in enumerate(regular):
            seeds = work.timed_seeds[64][position]
            used = seeds if honest else (seeds[0] + 1, seeds[1])
            payload, _ = child_request(reference, 64, used, 1)
            request.input_seed, request.basis_seed = seeds
            request.fingerprints, request.position = parse_fingerprints(payload, 1, "test"), position
        run.precomputed = ahead
        computed: list = []
        monkeypatch.setattr(verification, "reference_outputs", functools.partial(counted_reference, computed))
        reasons = verification.verify_length(run, reference, "cpu", lambda event: None, target=True)
        assert (reasons == []) is honest, reasons
        # Only the correctness request (and drawn requests not computed ahead) needed a reference now.
        drawn_not_ahead = [r for r in computed if r is not run.check]
        assert all(request.position not in ahead for request in drawn_not_ahead)
