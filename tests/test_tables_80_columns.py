"""The tables miners read over SSH stay legible in 80 columns: no line wider than the terminal,
every figure whole on its line (not wrapped or cut), and the wide layout where there is room."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator

from rich.console import Console

from quasar.evaluate.report import (
    NEEDS_GPU,
    OK,
    WIDE_REPORT_COLUMNS,
    EvaluationReport,
    ImportCheck,
    LengthResult,
    render_report,
)
from quasar.tools import tune_kernel as step2

LENGTHS = (512, 1024, 2048, 1_000_000)


def shows(line: str, rate: float) -> bool:
    """Whether ``line`` shows ``rate`` as a whole figure in millions ("26.71 M" is not in "226.71 M")."""
    return re.search(rf"(?<![\d.,]){re.escape(f'{rate / 1e6:.2f}')} M", line) is not None


def distinct_rates(rng: random.Random, count: int) -> Iterator[float]:
    """``count`` random rates from 1 M to 300 M tokens/s that no two show alike ("85.33 M"), so a
    table's row is found by any one of its figures."""
    return iter(hundredths * 1e4 for hundredths in rng.sample(range(100, 30_001), count))


def random_report(rng: random.Random) -> EvaluationReport:
    report = EvaluationReport(
        verdict="fail",
        reasons=["T=2,048: the output differs from the reference"],
        repo="/home/miner/work/flash-linear-attention",
        target_seq_len=1_000_000,
        seq_lens=list(LENGTHS),
        device="cuda",
        device_name="NVIDIA H100 80GB HBM3",
        import_check=ImportCheck(True, "core"),
        lengths={},
        league="1M",
        multiplier=3.0,
        measured_tokens_per_sec=rng.uniform(1e7, 2e8),
    )
    for length in LENGTHS:
        rate = rng.uniform(1e5, 3e8)
        report.lengths[str(length)] = LengthResult(
            seq_len=length,
            status=rng.choice([OK, OK, NEEDS_GPU]),
            tokens_per_sec=rate,
            tokens_per_sec_min=rate * 0.97,
            tokens_per_sec_max=rate * 1.02,
            cv=rng.uniform(0, 0.05),
            timing="cuda-graph",
            peak_vram_mb=rng.uniform(10, 80_000),
            rel_error=rng.uniform(1e-3, 1e-1),
            rel_error_eighths=[rng.uniform(1e-3, 1e-1)] * 8,
            finite=True,
            repeat_agree=rng.random() > 0.2,
            correct=rng.random() > 0.2,
        )
    return report


def rendered(width: int, draw) -> list[str]:
    console = Console(width=width, record=True, force_terminal=False, color_system=None)
    draw(console)
    return console.export_text().splitlines()


def test_the_evaluation_report_fits_80_columns_with_every_figure_whole():
    rng = random.Random()
    for _ in range(20):
        report = random_report(rng)
        lines = rendered(80, lambda console, report=report: render_report(report, console))
        assert max(len(line) for line in lines) <= 80
        rows = {
            line.split()[0]: line
            for line in lines
            if line.strip() and line.split()[0] in {f"{length:,}" for length in LENGTHS}
        }
        assert len(rows) == len(LENGTHS), lines
        for length in LENGTHS:
            item = report.lengths[str(length)]
            row = rows[f"{length:,}"]
            assert f"{item.tokens_per_sec / 1e6:.2f} M" in row or f"{item.tokens_per_sec / 1e3:.1f} k" in row, row
            assert f"{item.rel_error:.2e}" in row and f"{item.peak_vram_mb:,.0f}" in row, row
            assert item.status in row
            assert ("wrong" in row) == (item.correct is False)
            assert ("repeat" in row) == (item.repeat_agree is False)


def test_a_wide_terminal_gets_every_column():
    report = random_report(random.Random(3))
    lines = rendered(WIDE_REPORT_COLUMNS, lambda console: render_report(report, console))
    header = "\n".join(lines[:4])
    for column in ("slowest", "fastest", "1/8 max", "finite", "repeat", "correct"):
        assert column in header, header
    item = report.lengths["512"]
    assert any(f"{item.tokens_per_sec_min:,.0f}" in line for line in lines)


def default_sweep(rng: random.Random, current_rate: float | None = None) -> list[step2.SweepResult]:
    """step 2's default sweep: the current tuning and 18 configurations at its three lengths, the
    third failing; ``current_rate`` fixes the current tuning's rate at the target."""
    lengths = step2.DEFAULT_SEQ_LENS
    tunings = [{}, *step2.DEFAULT_GRID]
    rates = distinct_rates(rng, len(tunings) * len(lengths))
    results = [
        step2.SweepResult(
            tuning=tuning,
            passed=index != 2,
            reasons=[],
            current=index == 0,
            tokens_per_sec={length: next(rates) for length in lengths},
        )
        for index, tuning in enumerate(tunings)
    ]
    if current_rate is not None:
        results[0].tokens_per_sec[max(lengths)] = current_rate
    return results


def check_default_sweep_table(results: list[step2.SweepResult]) -> list[str]:
    """The table of ``results`` at 80 columns, one line a configuration with its figures whole,
    its tunables and its verdict; those lines, in the order of ``results``."""
    choice = step2.choose(results)
    lines = rendered(80, lambda console: console.print(step2.render_table(results, choice)))
    assert max(len(line) for line in lines) <= 80
    rows = []
    for result in results:
        row = next(line for line in lines if shows(line, result.tokens_per_sec[65_536]))
        values = {"wy_inverse": "product", "wy_maxnreg": 168, **result.tuning}
        assert all(shows(row, rate) for rate in result.tokens_per_sec.values()), row
        assert f" {values['wy_inverse']} " in row and f" {values['wy_maxnreg']} " in row, row
        assert row.split()[-1] == step2.verdict_of(result, choice), row
        rows.append(row)
    assert "current" in rows[0]
    return rows


def test_the_tuning_table_fits_80_columns_with_every_figure_whole():
    rng = random.Random()
    check_default_sweep_table(default_sweep(rng))
    # More lengths than fit beside the tunables: a tunable's value may wrap, never a figure.
    results = []
    rates = distinct_rates(rng, 6 * len(LENGTHS))
    for index in range(6):
        tuning = {
            "segment_chunks": rng.choice([8, 16, 32]),
            "wy_warps": rng.choice([2, 4, 8]),
            "wy_inverse": ("substitution", "product")[index % 2],
            "layer_tile_tokens": 65536 * (index + 1),
        }
        figures = {length: next(rates) for length in LENGTHS}
        results.append(step2.SweepResult(tuning=tuning, passed=index != 2, tokens_per_sec=figures, reasons=[]))
    lines = rendered(80, lambda console: console.print(step2.render_table(results, step2.choose(results))))
    assert max(len(line) for line in lines) <= 80
    for result in results:
        row = next(line for line in lines if shows(line, result.tokens_per_sec[512]))
        assert all(shows(row, rate) for rate in result.tokens_per_sec.values()), row


def test_a_gain_of_hundreds_of_times_keeps_the_table_in_80_columns():
    """A current tuning near 1 M tokens/s and configurations up to 300 M: the gain reads "259x",
    not "+25806.0%", which widened its column until "substitution" wrapped (about one run in 150
    of the test above)."""
    rng = random.Random()
    results = default_sweep(rng, current_rate=rng.uniform(1.0e6, 1.2e6))
    rows = check_default_sweep_table(results)
    current = results[0].target_rate
    for result, row in zip(results[1:], rows[1:], strict=True):
        assert step2.gain_label(result.target_rate, current) in row.split(), row


def test_the_gain_label_fits_the_column_and_reads_back_as_the_ratio():
    rng = random.Random()
    for _ in range(2000):
        current = 10 ** rng.uniform(0, 9)
        rate = current * 10 ** rng.uniform(-3, 8)
        label = step2.gain_label(rate, current)
        ratio = rate / current
        assert len(label) <= len("current"), (label, ratio)
        assert label.endswith("x") == (ratio >= 10), (label, ratio)
        # The slow reading: a percentage of the current rate added to it, or a multiple of it.
        shown = float(label[:-1]) if label.endswith("x") else 1 + float(label[:-1]) / 100
        allowed = 0.0005 if ratio < 10 else 0.5 if ratio < 1e6 else ratio / 2
        assert abs(shown - ratio) <= allowed, (label, ratio)
