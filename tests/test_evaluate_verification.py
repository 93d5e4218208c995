"""The checks against the reference (quasar/evaluate/verification.py): fingerprint and block errors
against slow versions, whole lengths verified, the draw of the requests checked and its escape odds."""

from __future__ import annotations

import itertools
import math
import random
import threading

import pytest
import torch

from quasar.evaluate import references, verification, workload
from quasar.evaluate.report import Timings
from quasar.evaluate.verification import (
    FINGERPRINT_TOLERANCE,
    REL_ERROR_THRESHOLD,
    fingerprint_error,
    worst_block_error,
)
from quasar.reference import QuasarAttentionReference
from tests.evaluate_runs import (
    filled,
    honest_run,
    naive_worst_block_error,
    timed_run,
)


def test_fingerprint_error_estimates_the_error_of_each_eighth():
    generator = torch.Generator().manual_seed(11)
    reference = torch.randn(1, 2048, 512, generator=generator)
    norms = workload.segment_norms(reference)
    buffers = filled(5, 2048, 99, 100)
    for trial in range(5):
        basis = (buffers.directions[trial], buffers.token_weights[trial])
        expected = workload.fingerprint(reference, *basis)
        # An honest output with a 1% error: estimated within the chi-square(16) spread.
        honest = reference + 0.01 * torch.randn(reference.shape, generator=generator) * reference.std()
        estimate = fingerprint_error(workload.fingerprint(honest, *basis).tolist(), expected, norms)
        assert 0.004 < estimate < FINGERPRINT_TOLERANCE
        # Zeros on the last eighth only: that eighth's error is 1.
        wrong = reference.clone()
        wrong[:, 1792:] = 0
        assert fingerprint_error(workload.fingerprint(wrong, *basis).tolist(), expected, norms) > 0.4


def test_fingerprint_error_refuses_malformed_claims():
    expected = torch.ones(workload.FINGERPRINT_SHAPE)
    norms = torch.ones(8)
    assert fingerprint_error("not a list", expected, norms) == math.inf
    assert fingerprint_error([[1.0] * 3] * 8, expected, norms) == math.inf
    assert fingerprint_error(torch.ones(8, workload.FINGERPRINT_DIRECTIONS), expected, norms) == math.inf
    assert fingerprint_error(torch.full_like(expected, math.nan), expected, norms) == math.inf
    assert fingerprint_error(expected.tolist(), expected, norms) == 0.0


def test_fingerprint_error_counts_the_projections_of_the_absolute_values_too():
    expected = torch.ones(workload.FINGERPRINT_SHAPE)
    claimed = expected.clone()
    claimed[:, 1] += 0.5  # the output's projections match, its absolute values' do not
    assert fingerprint_error(claimed, expected, torch.ones(8)) > 0.05


def test_against_a_reference_of_zeros_any_other_output_is_infinitely_wrong():
    zeros = torch.zeros(1, 128, 4)
    assert worst_block_error(zeros, zeros) == 0.0 and worst_block_error(zeros + 1e-6, zeros) == math.inf
    # The repeat's fingerprints against the run's: a repeat of another shape or off zeros disagrees.
    difference = verification._relative_difference
    assert difference(torch.zeros(1, 3), torch.zeros(1, 3)) == 0.0
    assert difference(torch.zeros(1, 3), torch.zeros(2, 3)) == math.inf
    assert difference(torch.ones(1, 3), torch.zeros(1, 3)) == math.inf


def test_the_tolerances_are_the_numbers_docs_state():
    # docs/rules.md section 4 step 4, docs/evaluation.md: written here as the docs write them.
    assert verification.REL_ERROR_THRESHOLD == 2e-2
    assert verification.BLOCK_TOKENS == 64 and verification.BLOCK_ERROR_THRESHOLD == 4e-2
    assert verification.FINGERPRINT_TOLERANCE == 2 * 2e-2
    assert verification.REQUEST_TOLERANCE == pytest.approx(1.15 * 2e-2, rel=1e-12)
    assert verification.REPEAT_TOLERANCE == 5e-3
    assert verification.CONSISTENCY_TOLERANCE == 1e-3
    assert verification.ESCAPE_BOUND == 1e-3


@pytest.mark.parametrize("length,block", [(64, 64), (200, 64), (1000, 16), (77, 10)])
def test_worst_block_error_matches_the_naive_loop(length, block):
    generator = torch.Generator().manual_seed(length)
    reference = torch.randn(1, length, 32, generator=generator)
    output = reference + 0.05 * torch.randn(reference.shape, generator=generator)
    output[0, length // 3] += 3.0
    assert worst_block_error(output, reference, block) == pytest.approx(
        naive_worst_block_error(output, reference, block), rel=1e-9
    )


def test_a_wrong_tail_that_an_eighth_would_dilute_is_caught_by_blocks():
    # 2M tokens: the last 64 wrong is 1/4096 of an eighth, an eighth's error of only 0.0156.
    reference = torch.randn(1, 2_000_000, 2, generator=torch.Generator().manual_seed(0))
    output = reference.clone()
    output[:, -64:] = 0
    last = workload.segment_bounds(2_000_000)[-1]
    eighth = float((output[:, last[0] :] - reference[:, last[0] :]).norm() / reference[:, last[0] :].norm())
    assert eighth < REL_ERROR_THRESHOLD
    assert worst_block_error(output, reference) == pytest.approx(1.0, rel=0.05)


def test_verification_passes_an_honest_run_and_reports_an_unverifiable_length(monkeypatch):

    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(5), strict=True)
    runs = {64: honest_run(reference, 64), 128: honest_run(reference, 128)}
    real_reference_outputs = references.reference_outputs

    def out_of_memory_at_128(reference, buffers, request, start, stop):
        if buffers.seq_len == 128:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_reference_outputs(reference, buffers, request, start, stop)

    monkeypatch.setattr(verification, "reference_outputs", out_of_memory_at_128)
    reasons = verification.verify_all(
        runs, references.ReferenceWork(5, "cpu", [], {}), Timings(), lambda event: None, 128
    )
    assert runs[64].result.correct is True and runs[64].result.runs_verified == 4
    assert runs[64].result.rel_error < 5e-3 and runs[64].result.repeat_agree
    assert runs[128].result.correct is False
    assert reasons == [
        (
            "T=128: the float32 reference does not fit in the memory of cpu here, so this length "
            "cannot be verified on this machine"
        )
    ]


def test_the_longest_length_checked_beside_the_others_gets_the_same_verdicts(monkeypatch):

    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(6), strict=True)

    def make_runs() -> dict:
        # 96 tokens: a fork that skips every forward of a request but the first.
        return {
            64: honest_run(reference, 64),
            96: honest_run(reference, 96, count=2, fake_after_first=True),
            128: honest_run(reference, 128),
        }

    serial_runs, beside_runs = make_runs(), make_runs()
    serial = verification.verify_all(
        serial_runs,
        references.ReferenceWork(6, "cpu", [], {}),
        Timings(),
        lambda event: None,
        128,
        longest_beside=False,
    )
    # The longest runs out of memory beside the others once; it is checked again alone.
    real_verify_length = verification.verify_length
    threads, failed_once = [], []

    def verify_length(run, *args, **kwargs):
        threads.append((run.result.seq_len, threading.current_thread().name))
        if run.result.seq_len == 128 and not failed_once:
            failed_once.append(True)
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_verify_length(run, *args, **kwargs)

    monkeypatch.setattr(verification, "verify_length", verify_length)
    beside = verification.verify_all(
        beside_runs, references.ReferenceWork(6, "cpu", [], {}), Timings(), lambda event: None, 128, longest_beside=True
    )
    # 96's forwards after the first of each request are zeros, its correctness request's too.
    assert serial == beside and serial and all(reason.startswith("T=96: ") for reason in serial)
    for length in (64, 96, 128):
        serial_result, beside_result = serial_runs[length].result, beside_runs[length].result
        # Which timed requests were drawn differs between the two; all were checked, so no figure does.
        assert serial_result == beside_result, length
        assert beside_runs[length].output is None
    assert beside_runs[128].result.correct is True and beside_runs[96].result.correct is False
    # First on a thread of its own, then again alone on the evaluation's thread, after the others.
    assert [name for length, name in threads if length == 128] == [
        "quasar-verify-longest",
        threading.current_thread().name,
    ]
    assert threads[-1][0] == 128


def test_verification_checks_every_forward_of_the_requests_it_picks(monkeypatch):

    # Batches of two forwards at 64 tokens and of one above: a request of three is checked in pieces.
    monkeypatch.setattr(references, "REFERENCE_BATCH_TOKENS", 128)
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(9), strict=True)
    runs = {
        64: honest_run(reference, 64, timed=2, count=3),
        128: honest_run(reference, 128, timed=2, count=3, fake_after_first=True),
    }
    # A reply whose middle fingerprint is replaced by NaNs: that forward fails, and so does the
    # next, whose input the parent rebuilds from the NaNs' bits, not from what the child used.
    runs[96] = honest_run(reference, 96, timed=1, count=3)
    assert runs[96].timed[-1] is not runs[96].check
    runs[96].timed[-1].fingerprints[1] = math.nan
    reasons = verification.verify_all(
        runs, references.ReferenceWork(9, "cpu", [], {}), Timings(), lambda event: None, 128
    )
    honest, faked = runs[64].result, runs[128].result
    # Two timed requests and the correctness request, every forward of each.
    assert honest.correct is True and honest.runs_verified == 9 and honest.requests_verified == 3
    assert faked.correct is False and faked.runs_verified == 9
    assert runs[96].result.correct is False and runs[96].result.runs_verified == 6
    # The reasons come shortest length first, whatever the order of the runs.
    assert reasons[0] == (
        f"T=96: 2 of 6 timed forwards checked do not match the reference (largest error inf > "
        f"{verification.FINGERPRINT_TOLERANCE:g}): the output was not computed from that run's input"
    )
    assert len([reason for reason in reasons if reason.startswith("T=96")]) == 1
    assert (
        f"T=128: 6 of 9 timed forwards checked do not match the reference (largest error "
        f"{faked.fingerprint_error:.3g} > {verification.FINGERPRINT_TOLERANCE:g}): the output was not "
        "computed from that run's input"
    ) in reasons
    # Its correctness request skipped the same forwards: its last output is zeros.
    assert "T=128: the output differs from the reference: relative error 1 > 0.02 over the whole sequence" in reasons


def test_an_eighth_or_a_repeat_off_by_3_percent_fails_with_its_reason():
    # docs/rules.md section 4 step 4: 3% is over the 2e-2 of an eighth and the 5e-3 of a repeat,
    # and under the 4e-2 of a block.
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(14), strict=True)

    def verified(tamper) -> list[str]:
        run = honest_run(reference, 128, timed=2, count=2)
        tamper(run)
        reasons = verification.verify_all(
            {128: run}, references.ReferenceWork(14, "cpu", [], {}), Timings(), lambda e: None, 128
        )
        assert run.result.correct is False and run.result.worst_block_error < 4e-2
        return reasons

    def eighth(run):
        run.output = run.output.clone()
        run.output[:, 112:] *= 1.03

    reasons = verified(eighth)
    assert any(reason.startswith("T=128: eighths 8 (0.03) of the sequence differ") for reason in reasons), reasons
    assert any("is not the output its run fingerprinted" in reason for reason in reasons), reasons

    def repeat(run):
        run.repeat.fingerprints = run.repeat.fingerprints.clone()
        run.repeat.fingerprints[0] *= 1.03  # the first forward of two

    reasons = verified(repeat)
    assert [reason.split(" (")[0] for reason in reasons] == ["T=128: two runs on the same input disagree"]


def test_an_output_right_only_in_its_signed_sums_fails_the_timed_check():
    # Attack: the fingerprint's first part is linear in the output and the child knows the token
    # weights before each forward, so a fork can put each eighth's weighted sum on one token (from
    # o_proj's summed inputs, skipping o_proj over the sequence) and leave the rest zeros; asked for
    # the whole output after the request, it sends the real one. The projections of the absolute
    # values need every value of every token.
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(13), strict=True)
    run = honest_run(reference, 128, timed=2, count=2, sums_only=True)
    reasons = verification.verify_all(
        {128: run}, references.ReferenceWork(13, "cpu", [], {}), Timings(), lambda e: None, 128
    )
    assert run.result.correct is False and run.result.rel_error < 5e-3
    absolute_only = [reason for reason in reasons if "but not in their absolute values" in reason]
    assert absolute_only == [
        f"T=128: 6 of 6 timed forwards checked match the reference in their signed sums but not in "
        f"their absolute values (largest error {run.result.fingerprint_error:.3g} > {FINGERPRINT_TOLERANCE:g}): "
        "the output was not computed token by token (sums put on a few tokens)"
    ], reasons
    assert not any("do not match the reference" in reason for reason in reasons), reasons
    assert run.result.fingerprint_error > 0.5


def test_requests_to_verify_cover_max_verified_forwards_at_short_lengths_and_the_bound_at_the_target():
    from quasar.evaluate.verification import (
        ESCAPE_BOUND,
        MAX_VERIFIED,
        VERIFY_SAMPLE,
        degraded_to_move_median,
        escape_probability,
        requests_to_verify,
    )

    assert requests_to_verify(timed_run(512, 1, 200), target=False) == MAX_VERIFIED
    # docs/evaluation.md: 4, or enough for 32 forwards up to 16,384 tokens.
    assert requests_to_verify(timed_run(16_384, 1, 200), target=False) == 32
    assert requests_to_verify(timed_run(16_385, 1, 200), target=False) == 4
    assert requests_to_verify(timed_run(512, 4, 200), target=False) == MAX_VERIFIED // 4
    assert requests_to_verify(timed_run(512, 25, 200), target=False) == VERIFY_SAMPLE
    assert requests_to_verify(timed_run(100_000, 1, 200), target=False) == VERIFY_SAMPLE
    assert requests_to_verify(timed_run(100_000, 8, 200), target=False) == VERIFY_SAMPLE
    # Never more than were timed.
    assert requests_to_verify(timed_run(512, 1, 5), target=False) == 5
    for timed in (3, 10, 11, 20, 57, 100, 150, 200):
        run = timed_run(1_000_000, 1, timed)
        wanted = requests_to_verify(run, target=True)
        degraded = degraded_to_move_median(timed)
        # The least that meets the bound (or every request when none fewer does).
        assert escape_probability(timed, wanted, degraded) <= ESCAPE_BOUND or wanted == timed
        assert wanted == min(VERIFY_SAMPLE, timed) or escape_probability(timed, wanted - 1, degraded) > ESCAPE_BOUND
    assert requests_to_verify(timed_run(1_000_000, 1, 150), target=True) == 10


def test_moving_the_median_takes_just_over_half_and_counts_out_of_range_are_refused():
    from quasar.evaluate.verification import degraded_to_move_median, escape_probability

    assert [degraded_to_move_median(timed) for timed in (1, 4, 5, 100)] == [1, 3, 3, 51]
    for timed, verified, degraded in ((10, 11, 3), (10, 3, 11), (10, -1, 3), (10, 3, -1)):
        with pytest.raises(ValueError, match="counts out of range"):
            escape_probability(timed, verified, degraded)


@pytest.mark.parametrize("trial", range(3))
def test_escape_probability_is_the_chance_of_drawing_no_degraded_request(trial):
    # The formula against every subset (small sizes), and against the harness's own draw.
    from quasar.evaluate.verification import checked_requests, escape_probability

    rng = random.Random()
    timed, verified = rng.randint(4, 9), rng.randint(1, 4)
    degraded = rng.randint(0, timed - 1)
    subsets = list(itertools.combinations(range(timed), verified))
    missed = sum(all(index >= degraded for index in subset) for subset in subsets)
    assert escape_probability(timed, verified, degraded) == pytest.approx(missed / len(subsets))

    # The check's place is drawn before the requests run; the others after. Degrade a random
    # half plus one: the draw misses all of them about as often as the formula says.
    run = timed_run(1_000_000, 1, 40)
    bad = set(rng.sample(range(40), 21))
    draws = 4000
    escaped = 0
    for _ in range(draws):
        run.check = run.timed[rng.randrange(40)]
        chosen = checked_requests(run, target=False)
        assert len(chosen) == len(set(map(id, chosen))) == 4 and chosen[0] is run.check
        escaped += not any(request.input_seed in bad for request in chosen)
    expected = escape_probability(40, 4, 21)
    assert abs(escaped / draws - expected) < 4 * math.sqrt(expected * (1 - expected) / draws) + 1e-3


@pytest.mark.parametrize("trial", range(2))
def test_the_draw_takes_checks_computed_ahead_and_stays_uniform(trial):
    # Places computed ahead: a uniformly random set of the pool; the timed requests took the first
    # places. Over many evaluations, each timed request is checked equally often, and the draw
    # takes requests computed ahead first.
    from quasar.evaluate.verification import checked_requests, requests_to_verify

    rng = random.Random()
    pool, timed = 200, rng.randint(40, 150)
    inclusion = [0] * timed
    draws, ahead_used = 3000, 0
    for _ in range(draws):
        run = timed_run(1_000_000, 1, timed + 1)
        run.check = run.timed.pop(rng.randrange(len(run.timed) + 0) if run.timed else 0)
        for position, request in enumerate(run.timed):
            request.position = position
        run.timed.insert(rng.randrange(len(run.timed) + 1), run.check)
        run.precomputed = {place: None for place in rng.sample(range(pool), 24)}
        chosen = checked_requests(run, target=True)
        wanted = requests_to_verify(run, True)
        assert len(chosen) == wanted and chosen[0] is run.check
        timed_ahead = [request for request in run.timed if request.position in run.precomputed]
        ahead_used += sum(request.position in run.precomputed for request in chosen[1:])
        assert sum(request.position in run.precomputed for request in chosen[1:]) == min(len(timed_ahead), wanted - 1)
        for request in chosen[1:]:
            inclusion[request.position] += 1
    expected = draws * (requests_to_verify(timed_run(1_000_000, 1, timed + 1), True) - 1) / timed
    # Each request's count is binomial around the same mean: none far from it.
    assert max(abs(count - expected) for count in inclusion) < 5 * math.sqrt(expected) + 2
    assert ahead_used > 0
