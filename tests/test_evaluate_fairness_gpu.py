"""A fork that breaks its GPU fails alone, on CUDA: a kernel that never ends, or one that faults
the GPU (an illegal address), fails that fork, and the next fork evaluated on the GPU, an honest one,
passes and is timed as before."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quasar.evaluate import evaluate
from quasar.starter_fork import copy_starter_tree
from tests.evaluate_runs import FAST_CUDA

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


# Appended to the starter fork's fla/layers/quasar.py: a forward whose first call never lets its
# GPU go (a kernel of about an hour), or that writes far outside its memory (an illegal address).
_NEVER_ENDING_KERNEL = """
_HonestQuasarAttention = QuasarAttention


class QuasarAttention(_HonestQuasarAttention):
    def forward(self, hidden_states, *args, **kwargs):
        torch.cuda._sleep(10**13)
        torch.cuda.synchronize()
        return super().forward(hidden_states, *args, **kwargs)
"""
_ILLEGAL_ADDRESS = """
import triton
import triton.language as tl


@triton.jit
def _write_far_away(pointer):
    tl.store(pointer + (1 << 40), 1.0)


_HonestQuasarAttention = QuasarAttention


class QuasarAttention(_HonestQuasarAttention):
    def forward(self, hidden_states, *args, **kwargs):
        _write_far_away[(1,)](hidden_states)
        torch.cuda.synchronize()
        return super().forward(hidden_states, *args, **kwargs)
"""


@pytest.mark.parametrize(("patch", "said"), [(_NEVER_ENDING_KERNEL, "timed out"), (_ILLEGAL_ADDRESS, "illegal")])
def test_a_fork_that_breaks_its_gpu_fails_alone_and_the_next_fork_is_timed_as_before(tmp_path, patch, said):
    """A fork's kernel that never ends (killed at its length's limit) or that faults the GPU fails
    that fork; the GPU it leaves must time the next fork, an honest one, as before, or that next
    miner would pay for the first one's fault."""
    options = replace(FAST_CUDA, seq_lens=(), timeout_s=600)
    copy_starter_tree(tmp_path / "honest")
    before = evaluate(tmp_path / "honest", 4096, None, options)
    assert before.passed, before.reasons
    copy_starter_tree(tmp_path / "broken")
    layer = tmp_path / "broken" / "fla" / "layers" / "quasar.py"
    layer.write_text(layer.read_text() + patch)
    broken = evaluate(tmp_path / "broken", 4096, None, replace(options, length_timeout_s=30))
    assert not broken.passed and any(said in reason.lower() for reason in broken.reasons), broken.reasons
    after = evaluate(tmp_path / "honest", 4096, None, options)
    assert after.passed, f"the honest fork failed after the broken one: {after.reasons}"
    assert after.measured_tokens_per_sec >= 0.8 * before.measured_tokens_per_sec, (
        before.measured_tokens_per_sec,
        after.measured_tokens_per_sec,
    )
