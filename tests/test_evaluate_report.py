"""The evaluation report as people read it: what the weighted score and the recommended claim mean
for a submission, and timings too noisy to trust flagged where they are shown."""

from __future__ import annotations

import json
import random

from rich.console import Console

from quasar.evaluate.report import HIGH_CV, OK, EvaluationReport, LengthResult, noise_warnings, render_report


def report_with(rng: random.Random, cvs: dict[int, float], multiplier: float = 0.5) -> EvaluationReport:
    target = max(cvs)
    report = EvaluationReport(
        verdict="pass",
        reasons=[],
        repo="/fork",
        target_seq_len=target,
        seq_lens=sorted(cvs),
        device="cuda",
        device_name="H100",
        import_check=None,
        lengths={},
        league="x",
        multiplier=multiplier,
    )
    for length, cv in cvs.items():
        rate = rng.uniform(1e3, 1e8)
        report.lengths[str(length)] = LengthResult(
            seq_len=length, status=OK, tokens_per_sec=rate, cv=cv, correct=True, finite=True, repeat_agree=True
        )
    measured = report.lengths[str(target)].tokens_per_sec
    report.measured_tokens_per_sec = measured
    report.weighted_score = measured * multiplier
    report.recommended_claim = measured * rng.uniform(0.3, 1.0)
    return report


def shown(report: EvaluationReport) -> str:
    console = Console(width=200, record=True, color_system=None)
    render_report(report, console)
    return console.export_text()


def test_noise_on_the_cpu_names_the_cpu_not_a_gpu():
    """`quasar step1 --device cpu` on a busy machine told the miner to measure again on an idle GPU
    (nvidia-smi shows other processes), of a run no GPU took part in."""
    report = report_with(random.Random(1), {128: 0.5})
    assert noise_warnings(report)[0].endswith("measure again on an idle GPU (nvidia-smi shows other processes)")
    report.device, report.device_name = "cpu", ""
    said = noise_warnings(report)[0]
    assert "GPU" not in said and said.endswith("measure again while nothing else keeps this machine's CPUs busy")


def test_only_lengths_over_the_cv_limit_are_flagged():
    rng = random.Random()
    for _ in range(20):
        cvs = {
            length: rng.choice([rng.uniform(0, HIGH_CV), rng.uniform(HIGH_CV * 1.01, 2.0)])
            for length in (512, 2048, 16_384)
        }
        report = report_with(rng, cvs)
        warnings = noise_warnings(report)
        noisy = [length for length, cv in sorted(cvs.items()) if cv > HIGH_CV]
        assert [w.split(":")[0] for w in warnings] == [f"T={length:,}" for length in noisy]
        text = shown(report)
        assert text.count("noisy:") == len(noisy)
        for length in noisy:
            assert f"{cvs[length]:.3f}!" in text


def test_a_non_finite_figure_is_null_in_the_json_report():
    report = report_with(random.Random(4), {512: 0.01})
    report.lengths["512"].rel_error = float("nan")
    report.lengths["512"].rel_error_eighths = [0.0, float("inf")]
    data = json.loads(report.to_json())
    assert data["lengths"]["512"]["rel_error"] is None and data["lengths"]["512"]["rel_error_eighths"] == [0.0, None]


def test_a_cv_of_exactly_the_limit_is_not_flagged():
    report = report_with(random.Random(2), {512: HIGH_CV, 1024: HIGH_CV * 1.001})
    assert [warning.split(":")[0] for warning in noise_warnings(report)] == ["T=1,024"]


def test_a_failed_forks_recommended_claim_scores_nothing():
    report = report_with(random.Random(3), {512: 0.01}, multiplier=0.5)
    report.verdict, report.measured_tokens_per_sec, report.recommended_claim = "fail", 1184.0, 580.0
    assert "580 tokens/s (a submission claiming it scores 0: min(claimed, measured) × 0.5)" in shown(report)


def test_the_recommended_claim_says_what_a_submission_claiming_it_scores():
    """A fork measured at 1,184 tokens/s in a ×0.5 league with a noisy target: the weighted score
    (592) is for claiming the measured speed; claiming the recommended 580 scores 290."""
    report = report_with(random.Random(1), {512: 1.112}, multiplier=0.5)
    report.measured_tokens_per_sec, report.weighted_score, report.recommended_claim = 1184.0, 592.0, 580.0
    text = shown(report)
    assert "592 (scored at the measured speed × 0.5)" in text
    assert "580 tokens/s (a submission claiming it scores 290: min(claimed, measured) × 0.5)" in text
    assert "recommended claim sits far under the median" in text
