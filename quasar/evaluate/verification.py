"""Every check of a fork's outputs against the float32 reference: the timed requests drawn after
the child's last reply, each forward and each request as a whole, and the correctness request's
whole output and repeat (docs/evaluation.md, "Timed forwards are as exact as the checked one",
"Correctness"; the thresholds: docs/rules.md, section 4).
"""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
import time

import torch

from quasar.evaluate import workload
from quasar.evaluate.options import ProgressCallback, ProgressEvent
from quasar.evaluate.references import ReferenceWork, reference_batch_size, reference_outputs, request_buffers
from quasar.evaluate.report import Timings
from quasar.evaluate.session import Request, output_tensor
from quasar.evaluate.timing import LengthRun

# Correctness (see the module docstring).
REL_ERROR_THRESHOLD = 2e-2

BLOCK_TOKENS = 64

BLOCK_ERROR_THRESHOLD = 2 * REL_ERROR_THRESHOLD

# A timed forward's fingerprint estimates the error of each eighth with the noise of a mean square
# of workload.FINGERPRINT_DIRECTIONS samples: twice the threshold there catches a forward that
# skipped or spoiled part of the sequence, and never an honest one. The same holds for the
# projections of the output's absolute values, without a tolerance of their own: ||a| - |b|| <=
# |a - b| for every value and |||r||| = ||r||, so their relative error is at most the output's,
# and their estimate, a mean square of as many samples of the same spread, exceeds a tolerance no
# more often than the output's (workload.fingerprint).
FINGERPRINT_TOLERANCE = 2 * REL_ERROR_THRESHOLD

# A checked request's error, estimated from every projection of every forward in it, for the output
# and for its absolute values each (at least 8 x FINGERPRINT_DIRECTIONS = 256 samples, one standard
# deviation about 4% of the estimate): timed requests are held to the correctness threshold plus
# that noise's margin, so a fork that is exact where it is checked in full and sloppier where it is
# timed gains at most this much slack.
REQUEST_TOLERANCE = 1.15 * REL_ERROR_THRESHOLD

# Two runs on the same input (deterministic kernels agree exactly).
REPEAT_TOLERANCE = REL_ERROR_THRESHOLD / 4

# The output sent for the check against the run's own fingerprint: the same tensor, up to rounding.
CONSISTENCY_TOLERANCE = 1e-3

# Which timed requests are checked against the reference, every forward of each (see the docstring).
VERIFY_ALL_UP_TO = 16384

MAX_VERIFIED = 32

VERIFY_SAMPLE = 4

# A length whose float32 reference the checking process cannot hold: this machine's limit, not the
# fork's fault (the validator's error: quasar/validator/evaluator.py, result_from_report).
REFERENCE_DOES_NOT_FIT = "the float32 reference does not fit in the memory of"

# At the target length, as many requests are checked as make the chance that a fork degrading just
# over half of the timed requests (enough to move the median) escapes every check at most this.
ESCAPE_BOUND = 1e-3


def fingerprint_errors(
    claimed: torch.Tensor | list, expected: torch.Tensor, reference_norms: torch.Tensor
) -> tuple[float, float]:
    """Largest per-eighth error estimates of a reported fingerprint ``[8, 2, K]`` against the
    reference's: of the output's projections and of its absolute values' projections.

    ``||claimed_e,p - expected_e,p|| / (sqrt(K) · ||reference_e||)`` (the output and its absolute
    values have the same norm); ``inf`` for a malformed or non-finite fingerprint.
    """
    values = _as_double(claimed)
    if values is None or values.shape != expected.shape or not torch.isfinite(values).all():
        return math.inf, math.inf
    difference = torch.linalg.vector_norm(values - expected.double().cpu(), dim=-1)
    scale = math.sqrt(expected.shape[-1]) * reference_norms.double().cpu()[:, None].expand_as(difference)
    errors = torch.where(scale > 0, difference / scale, torch.where(difference == 0, 0.0, math.inf))
    linear, absolute = errors.amax(0).tolist()
    return linear, absolute


def fingerprint_error(claimed: torch.Tensor | list, expected: torch.Tensor, reference_norms: torch.Tensor) -> float:
    """The larger of :func:`fingerprint_errors`."""
    return max(fingerprint_errors(claimed, expected, reference_norms))


def worst_block_error(output: torch.Tensor, reference: torch.Tensor, block: int = BLOCK_TOKENS) -> float:
    """Largest error over ``block``-token blocks, relative to the reference's RMS per token."""
    out = output.reshape(-1, output.shape[-1])
    ref = reference.reshape(-1, reference.shape[-1])
    error_sq = torch.cat(
        [(out[a:b].double() - ref[a:b].double()).square().sum(-1) for a, b in workload.segment_bounds(out.shape[0])]
    )
    mean_ref_sq = float(ref.double().square().sum()) / ref.shape[0]
    if not math.isfinite(float(error_sq.sum())):
        return math.inf
    if mean_ref_sq == 0:
        return 0.0 if float(error_sq.sum()) == 0 else math.inf
    padded = torch.nn.functional.pad(error_sq, (0, (-error_sq.shape[0]) % block))
    sums = padded.reshape(-1, block).sum(1)
    counts = torch.full_like(sums, block)
    counts[-1] = error_sq.shape[0] - block * (sums.shape[0] - 1)
    return float(torch.sqrt(sums / (counts * mean_ref_sq)).max())


def _as_double(values: torch.Tensor | list) -> torch.Tensor | None:
    """Reported values as a float64 CPU tensor (a tensor, or nested lists of numbers); None if they are not numbers."""
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.float64)
    try:
        return torch.tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def _relative_difference(a: torch.Tensor | list, b: torch.Tensor | list) -> float:
    left, right = _as_double(a), _as_double(b)
    if (
        left is None
        or right is None
        or left.shape != right.shape
        or not (torch.isfinite(left).all() and torch.isfinite(right).all())
    ):
        return math.inf
    scale = float(torch.linalg.vector_norm(right))
    difference = float(torch.linalg.vector_norm(left - right))
    return difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)


def escape_probability(timed: int, verified: int, degraded: int) -> float:
    """The chance that none of ``verified`` requests drawn at random (without replacement) from
    ``timed`` is one of the ``degraded`` ones: ``C(timed - degraded, verified) / C(timed, verified)``."""
    if not 0 <= degraded <= timed or not 0 <= verified <= timed:
        raise ValueError(f"escape_probability({timed}, {verified}, {degraded}): counts out of range")
    return math.comb(timed - degraded, verified) / math.comb(timed, verified)


def degraded_to_move_median(timed: int) -> int:
    """How many of ``timed`` requests a fork must speed up to move their median: just over half."""
    return timed // 2 + 1


def requests_to_verify(run: LengthRun, target: bool) -> int:
    """How many timed requests to check, every forward of each, the correctness request among them.

    At least :data:`VERIFY_SAMPLE` (up to :data:`VERIFY_ALL_UP_TO` tokens, enough requests for
    :data:`MAX_VERIFIED` forwards if that is more); at the ``target`` length, enough that a fork
    degrading just over half of the timed requests escapes with probability at most
    :data:`ESCAPE_BOUND` (10 of 100 or more requests); never more than were timed.
    """
    timed = len(run.timed)
    count = run.result.forwards_per_request or 1
    wanted = max(VERIFY_SAMPLE, MAX_VERIFIED // count) if run.result.seq_len <= VERIFY_ALL_UP_TO else VERIFY_SAMPLE
    if target:
        degraded = degraded_to_move_median(timed)
        while wanted < timed and escape_probability(timed, wanted, degraded) > ESCAPE_BOUND:
            wanted += 1
    return min(wanted, timed)


def checked_requests(run: LengthRun, target: bool) -> list[Request]:
    """The requests to check: the correctness request (its place among the timed ones was drawn
    before they ran) and others drawn at random now, after the child's last reply, uniformly
    among the rest of the timed requests.

    Where the parent computed some timed requests' expected fingerprints ahead (``run.precomputed``:
    a uniformly random set of places in the seed pool, which holds a place for every request a
    length may time), the draw takes as many of those as it can: all of them that were timed, if
    no more than wanted, else a random choice of them; and the rest at random among the others.
    The places computed ahead that were timed are a uniformly random set of the timed requests, of
    a size that does not depend on which they are, so the draw stays uniform among them.
    """
    assert run.check is not None
    wanted = requests_to_verify(run, target) - 1
    others = [request for request in run.timed if request is not run.check]
    chooser = secrets.SystemRandom()
    ahead = [request for request in others if request.position in run.precomputed]
    if len(ahead) >= wanted:
        return [run.check, *chooser.sample(ahead, wanted)]
    rest = [request for request in others if request.position not in run.precomputed]
    return [run.check, *ahead, *chooser.sample(rest, min(wanted - len(ahead), len(rest)))]


def verify_length(
    run: LengthRun,
    reference: torch.nn.Module,
    device: str,
    progress: ProgressCallback,
    expected_check: torch.Tensor | None = None,
    target: bool = False,
) -> list[str]:
    """Check one length's timed requests (every forward of those drawn, each alone and each request
    as a whole), the correctness request's whole output and its repeat against the reference;
    the reasons to fail. ``expected_check``: the reference output of the correctness request's
    last forward if already computed; ``target``: the length is the target (more requests checked)."""
    from quasar.reference import relative_error

    result, length = run.result, run.result.seq_len
    assert run.check is not None and run.output is not None and run.repeat is not None
    chosen = checked_requests(run, target)
    total = sum(len(request.fingerprints) for request in chosen)
    progress(ProgressEvent("reference", length, 0, total + 1))
    worst, done = 0.0, 0
    # Forwards whose output's projections do not match; those whose output's projections match and
    # whose absolute values' do not, and their largest error.
    mismatched, sums_only, worst_sums_only = 0, 0, 0.0
    request_errors: list[float] = []
    batch = reference_batch_size(length)
    last = len(run.check.fingerprints) - 1
    for request in chosen:
        ahead = run.precomputed.get(request.position) if request.position is not None else None
        buffers = request_buffers(request, length, device) if ahead is None else None
        forwards = len(request.fingerprints)
        # Summed squared differences of the output's projections and of its absolute values'.
        difference_sq, reference_sq = [0.0, 0.0], 0.0
        for start in range(0, forwards, batch):
            stop = min(start + batch, forwards)
            if ahead is not None:
                # Computed while the child warmed up (a request of one forward).
                fingerprints, norms = ahead[0][None], ahead[1][None]
            else:
                assert buffers is not None
                expected = reference_outputs(reference, buffers, request, start, stop)
                if request is run.check and expected_check is None and start <= last < stop:
                    expected_check = expected[last - start : last - start + 1].clone()
                # The batch's fingerprints and norms in a few launches and one copy to the host,
                # then each forward compared on its own and summed into the request's estimate.
                fingerprints = workload.fingerprints_of(
                    expected, buffers.directions[start:stop], buffers.token_weights[start:stop]
                ).cpu()
                norms = workload.segment_norms_of(expected).cpu()
                del expected
            for offset, index in enumerate(range(start, stop)):
                linear, absolute = fingerprint_errors(request.fingerprints[index], fingerprints[offset], norms[offset])
                worst = max(worst, linear, absolute)
                if linear > FINGERPRINT_TOLERANCE:
                    mismatched += 1
                elif absolute > FINGERPRINT_TOLERANCE:
                    sums_only += 1
                    worst_sums_only = max(worst_sums_only, absolute)
                squares = (request.fingerprints[index].double() - fingerprints[offset].double()).square()
                difference_sq = [before + float(part) for before, part in zip(difference_sq, squares.sum((0, 2)))]
                reference_sq += workload.FINGERPRINT_DIRECTIONS * float(norms[offset].double().square().sum())
            done += stop - start
            progress(ProgressEvent("reference", length, done, total + 1))
        request_errors.append(max(_estimated_error(part, reference_sq) for part in difference_sq))
        del buffers
    # The correctness output last: read in place, it waits for the sandbox to be gone.
    buffers = request_buffers(run.check, length, device)
    if expected_check is None:
        expected_check = reference_outputs(reference, buffers, run.check, last, last + 1)
    expected = expected_check
    output = output_tensor(run.output).to(device)
    result.finite = bool(torch.isfinite(output).all())
    result.rel_error = relative_error(output, expected)
    bounds = workload.segment_bounds(length)
    result.rel_error_eighths = [relative_error(output[:, a:b], expected[:, a:b]) for a, b in bounds]
    result.worst_block_error = worst_block_error(output, expected)
    consistency = fingerprint_error(
        run.check.fingerprints[last],
        workload.fingerprint(output, buffers.directions[last], buffers.token_weights[last]),
        workload.segment_norms(expected),
    )
    result.repeat_rel_diff = _relative_difference(run.repeat.fingerprints, run.check.fingerprints)
    result.repeat_agree = result.repeat_rel_diff <= REPEAT_TOLERANCE
    del output, expected, expected_check, buffers

    result.runs_verified = total
    result.requests_verified = len(chosen)
    result.fingerprint_error = worst
    result.request_error = max(request_errors)
    result.requests_checked_ahead = sum(
        request.position in run.precomputed for request in chosen if request.position is not None
    )
    result.escape_probability = escape_probability(len(run.timed), len(chosen), degraded_to_move_median(len(run.timed)))

    where = f"T={length}"
    reasons = []
    if not result.finite:
        reasons.append(f"{where}: the output has NaN or infinite values")
    if not result.rel_error <= REL_ERROR_THRESHOLD:
        reasons.append(
            f"{where}: the output differs from the reference: relative error "
            f"{result.rel_error:.3g} > {REL_ERROR_THRESHOLD:g} over the whole sequence"
        )
    bad = [i + 1 for i, e in enumerate(result.rel_error_eighths) if not e <= REL_ERROR_THRESHOLD]
    if bad:
        shown = ", ".join(f"{i} ({result.rel_error_eighths[i - 1]:.3g})" for i in bad)
        reasons.append(
            f"{where}: eighths {shown} of the sequence differ from the reference "
            f"(relative error > {REL_ERROR_THRESHOLD:g})"
        )
    if not result.worst_block_error <= BLOCK_ERROR_THRESHOLD:
        reasons.append(
            f"{where}: a {BLOCK_TOKENS}-token block differs from the reference (error "
            f"{result.worst_block_error:.3g} of the sequence RMS > {BLOCK_ERROR_THRESHOLD:g})"
        )
    if not consistency <= CONSISTENCY_TOLERANCE:
        reasons.append(
            f"{where}: the output sent for the check is not the output its run fingerprinted "
            f"(difference {consistency:.3g})"
        )
    if mismatched:
        reasons.append(
            f"{where}: {mismatched} of {total} timed forwards checked do not match the reference "
            f"(largest error {worst:.3g} > {FINGERPRINT_TOLERANCE:g}): the output was not "
            "computed from that run's input"
        )
    if sums_only:
        reasons.append(
            f"{where}: {sums_only} of {total} timed forwards checked match the reference in their "
            f"signed sums but not in their absolute values (largest error {worst_sums_only:.3g} > "
            f"{FINGERPRINT_TOLERANCE:g}): the output was not computed token by token (sums put on a few tokens)"
        )
    inexact = [error for error in request_errors if not error <= REQUEST_TOLERANCE]
    if inexact and not (mismatched or sums_only):
        reasons.append(
            f"{where}: {len(inexact)} of {len(chosen)} timed requests checked are less exact than "
            f"the correctness threshold allows (estimated error {max(inexact):.3g} > "
            f"{REQUEST_TOLERANCE:g})"
        )
    if not result.repeat_agree:
        reasons.append(
            f"{where}: two runs on the same input disagree (relative difference "
            f"{result.repeat_rel_diff:.3g} > {REPEAT_TOLERANCE:g})"
        )
    result.correct = not reasons
    return reasons


def _estimated_error(difference_sq: float, reference_sq: float) -> float:
    """A relative error estimated from summed squared fingerprint differences and the reference's
    summed squared norms (each eighth's weighted by the number of directions)."""
    if not math.isfinite(difference_sq):
        return math.inf
    if reference_sq <= 0:
        return 0.0 if difference_sq == 0 else math.inf
    return math.sqrt(difference_sq / reference_sq)


def verify_all(
    runs: dict[int, LengthRun],
    references: ReferenceWork,
    timings: Timings,
    progress: ProgressCallback,
    target: int,
    longest_beside: bool | None = None,
) -> list[str]:
    """Check every run against the reference in this process; the reasons to fail, shortest length
    first. At the ``target`` length more timed requests are checked (:func:`requests_to_verify`).

    With ``longest_beside`` (default: on CUDA) the longest length is checked on a thread (and
    CUDA stream) of its own while the others are checked here: its float32 reference keeps the
    GPU busy while the shorter lengths' checks wait on the host. A length that runs out of memory
    beside the other is checked again alone afterwards; one whose float32 reference does not fit
    in this device's memory even alone cannot be verified: it fails with that reason, and the
    other lengths are still checked.
    """
    started = time.monotonic()
    reference = references.wait()
    device = references.device
    pending = [run for run in runs.values() if run.check is not None and run.output is not None]
    found: dict[int, list[str]] = {}
    again: list[LengthRun] = []

    def check(run: LengthRun, alone: bool) -> None:
        length = run.result.seq_len
        expected = references.expected.pop(length, None)
        try:
            found[length] = verify_length(run, reference, device, progress, expected, target=length == target)
        except torch.OutOfMemoryError:
            if not alone:
                if expected is not None:
                    references.expected[length] = expected
                again.append(run)
                return
            run.result.correct = False
            found[length] = [
                f"T={length}: {REFERENCE_DOES_NOT_FIT} {device} here, so this length cannot be verified on this machine"
            ]
        finally:
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        run.output = None

    if longest_beside is None:
        longest_beside = device.startswith("cuda")
    beside = pending[-1] if longest_beside and len(pending) > 1 else None
    failure: list[BaseException] = []
    worker = None
    if beside is not None:
        stream = torch.cuda.Stream(device) if device.startswith("cuda") else None
        if stream is not None:
            # The correctness references were computed on this thread's stream.
            stream.wait_stream(torch.cuda.current_stream(device))

        def check_beside() -> None:
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    check(beside, alone=False)
                if stream is not None:
                    stream.synchronize()
            except BaseException as error:  # re-raised below, in the evaluation's own thread
                failure.append(error)

        worker = threading.Thread(target=check_beside, name="quasar-verify-longest")
        worker.start()
    try:
        for run in pending:
            if run is not beside:
                check(run, alone=beside is None)
    finally:
        if worker is not None:
            worker.join()
    if failure:
        raise failure[0]
    for run in sorted(again, key=lambda item: item.result.seq_len):
        check(run, alone=True)
    references.expected.clear()
    timings.reference_s += time.monotonic() - started
    return [reason for length in sorted(found) for reason in found[length]]
