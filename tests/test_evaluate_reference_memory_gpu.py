"""A validator's own GPU trouble is never the fork's failure, on CUDA: a length whose float32
reference this evaluating process cannot hold on its GPU (another process holding the rest of its
memory: the validator's logit check, a neighbour) is the validator's error, not a failed fork."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quasar.evaluate import evaluate, workload
from quasar.evaluate.references import reference_outputs
from quasar.evaluate.session import Request
from quasar.reference import QuasarAttentionReference
from quasar.starter_fork import copy_starter_tree
from quasar.validator.evaluator import result_from_report
from tests.evaluate_runs import FAST_CUDA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

LENGTH = 65536


def _reference_peak_and_buffers(length: int) -> tuple[int, int]:
    """Bytes this process holds for one request's buffers at ``length``, and its peak while the
    float32 reference of that request runs."""
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
    reference.load_state_dict(workload.make_weights(1), strict=True)
    reference = reference.cuda().eval()
    buffers = workload.RequestBuffers.allocate(1, length, "cuda")
    workload.fill_request(buffers, 1, 2)
    held = torch.cuda.memory_allocated() - before
    torch.cuda.reset_peak_memory_stats()
    reference_outputs(reference, buffers, Request(1, 2, buffers.fingerprints, 0), 0, 1)
    peak = torch.cuda.max_memory_allocated() - before
    del reference, buffers
    torch.cuda.empty_cache()
    return held, peak


def test_a_reference_this_gpu_cannot_hold_is_the_validators_error_not_the_forks_failure(tmp_path):
    """The fork runs in its sandboxed child (another process, its memory its own); this process,
    which checks it, may use only a share of the GPU between a request's buffers and the float32
    reference's peak. The length was failed as 'the float32 reference does not fit in the memory
    of cuda here, so this length cannot be verified on this machine', recorded and reported
    against the miner for this machine's memory."""
    held, peak = _reference_peak_and_buffers(LENGTH)
    # Room for the buffers, the fork's output copied back and the expected output of a forward,
    # not for the reference's float32 work.
    output = LENGTH * workload.HIDDEN_SIZE * 4
    cap = held + 3 * output
    if cap >= peak:
        pytest.skip(f"the reference at T={LENGTH} peaks at {peak} bytes, no more than the {cap} bytes it needs")
    copy_starter_tree(tmp_path / "fork")
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved() + cap) / total, 0)
    try:
        report = evaluate(tmp_path / "fork", LENGTH, None, replace(FAST_CUDA, seq_lens=(), timeout_s=600))
    except torch.OutOfMemoryError:
        return  # ended without a report: a validator's worker then records its own error
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        torch.cuda.empty_cache()
    outcome = result_from_report(report)
    assert outcome.result is None, (
        f"a length this GPU could not verify failed the fork: {outcome.result.reasons if outcome.result else ''}"
    )
    assert "reference does not fit" in (outcome.error or ""), outcome
