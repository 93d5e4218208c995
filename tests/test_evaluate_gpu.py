"""The evaluation harness on CUDA: the honest starter fork passes, hostile forks do not gain, OOM is a verdict."""

from __future__ import annotations

import pytest
import torch

from quasar.evaluate import EvaluationOptions, evaluate
from quasar.evaluate.harness import REL_ERROR_THRESHOLD
from quasar.starter_fork import copy_starter_tree
from tests.hostile_forks import write_hostile_fork

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GPU = EvaluationOptions(seq_lens=(512, 1024), device="cuda", warmup_runs=2, min_timed_runs=10, max_timed_runs=30,
                        timed_seconds=0.5, length_timeout_s=120, timeout_s=240)


def test_honest_starter_fork_passes_on_cuda(tmp_path):
    copy_starter_tree(tmp_path / "fork")
    report = evaluate(tmp_path / "fork", 2048, None, GPU)
    assert report.verdict == "pass", report.reasons
    for item in report.lengths.values():
        assert item.correct and item.finite and item.repeat_agree
        assert item.rel_error < REL_ERROR_THRESHOLD and max(item.rel_error_eighths) < REL_ERROR_THRESHOLD
        assert item.peak_vram_mb > 0 and item.tokens_per_sec > 0
    assert report.recommended_claim <= report.measured_tokens_per_sec


def test_zeros_fail_and_frozen_timers_gain_nothing_on_cuda(tmp_path):
    zeros = evaluate(write_hostile_fork(tmp_path / "zeros", "zeros"), 1024, None, GPU)
    assert zeros.verdict == "fail" and zeros.lengths["1024"].correct is False
    timers = evaluate(write_hostile_fork(tmp_path / "timers", "timers", sleep_seconds=0.05), 1024, None,
                      EvaluationOptions(seq_lens=(), device="cuda", warmup_runs=1, min_timed_runs=5, max_timed_runs=5,
                                        length_timeout_s=120, timeout_s=240))
    assert timers.verdict == "pass", timers.reasons
    item = timers.lengths["1024"]
    # No run faster than its real sleep, less what the harness subtracts from each round trip.
    assert item.tokens_per_sec_max <= 1024 / (0.05 - item.subtracted_us / 1e6)


def test_real_out_of_memory_is_a_verdict(tmp_path):
    fork = write_hostile_fork(tmp_path / "hog", "hog", hog_length=1024)
    report = evaluate(fork, 2048, None, EvaluationOptions(
        seq_lens=(512, 1024), device="cuda", warmup_runs=1, min_timed_runs=3, max_timed_runs=3, length_timeout_s=120,
        timeout_s=240))
    assert report.verdict == "fail"
    assert report.lengths["512"].correct is True
    assert report.lengths["1024"].status == "oom" and report.lengths["2048"].status == "skipped"
    assert any(reason.startswith("OOM at T=1024, peak ") and "MiB" in reason for reason in report.reasons), report.reasons
