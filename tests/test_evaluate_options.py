"""What an evaluation is asked for (quasar/evaluate/options.py and its command line): lengths, forwards
per request, bad arguments; and the report's JSON."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from quasar import config
from quasar.config.values import MAX_SEQ_LEN
from quasar.evaluate.cli import add_evaluation_arguments, options_from, parse_seq_lens
from quasar.evaluate.cli import main as evaluate_main
from quasar.evaluate.harness import evaluate
from quasar.evaluate.options import (
    CPU_MAX_SEQ_LEN,
    EvaluationInputError,
    EvaluationOptions,
    check_lengths,
    output_area_warning,
)
from quasar.evaluate.report import EvaluationReport, ImportCheck, LengthResult, Timings
from quasar.starter_fork import write_starter_fork
from quasar.tools.install_kernel import main as step1_main


def test_lengths_are_checked():
    assert check_lengths((1024, 512), 2048, "cuda") == [512, 1024, 2048]
    assert check_lengths((512,), 512, "cpu") == [512]
    for bad, message in [((32,), "from 64"), ((True,), "from 64"), ((CPU_MAX_SEQ_LEN + 1,), "CPU runs are limited")]:
        with pytest.raises(EvaluationInputError, match=message):
            check_lengths(bad, 512, "cpu")


def test_seq_lens_parse_with_suffixes():
    assert parse_seq_lens("512, 1k,2_048,1M") == (512, 1000, 2048, 1_000_000)
    with pytest.raises(Exception, match="comma-separated"):
        parse_seq_lens("512,abc")


def test_flags_left_out_take_the_settings_and_then_the_options_defaults():
    """--timeout had its own default (3600) and overrode EVAL_TIMEOUT from .env or the environment."""
    parser = argparse.ArgumentParser()
    add_evaluation_arguments(parser)
    timing = {"EVAL_TIMEOUT": "1234", "EVAL_TIMED_SECONDS": "0.5"}
    settings = config.resolve({}, environ={**timing, "DEVICE": "cpu"}, dotenv_path=None)  # a device any host has
    options = options_from(parser.parse_args([]), (512,), settings)
    defaults = EvaluationOptions()
    assert (options.timeout_s, options.timed_seconds) == (1234, 0.5)
    assert (options.length_timeout_s, options.warmup_runs) == (defaults.length_timeout_s, defaults.warmup_runs)
    assert (options.min_timed_runs, options.max_timed_runs) == (defaults.min_timed_runs, defaults.max_timed_runs)
    flags = ["--timeout", "99", "--length-timeout", "7", "--warmup", "5", "--repeats", "4"]
    flagged = options_from(parser.parse_args(flags), (512,), settings)
    assert (flagged.timeout_s, flagged.length_timeout_s, flagged.warmup_runs) == (99, 7, 5)
    assert (flagged.min_timed_runs, flagged.max_timed_runs) == (4, 4)
    help_text = " ".join(parser.format_help().split())
    assert f"(default {defaults.length_timeout_s:g})" in help_text and f"(default {defaults.warmup_runs})" in help_text


def test_quasar_evaluate_runs_the_lengths_eval_seq_lens_names(tmp_path, capsys, monkeypatch):
    """--seq-lens had its own default (512,1024,2048) and overrode EVAL_SEQ_LENS, a setting quasar
    evaluate lists among those it reads (docs/evaluation.md): EVAL_SEQ_LENS=64 still ran up to 2048."""
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    monkeypatch.setenv("EVAL_SEQ_LENS", "64")
    quick = ["--device", "cpu", "--repeats", "1", "--warmup", "0", "--allow-unsandboxed", "--json"]
    assert evaluate_main([str(fork), "--target", "128", *quick]) == 0
    assert sorted(json.loads(capsys.readouterr().out)["lengths"], key=int) == ["64", "128"]
    with pytest.raises(SystemExit):
        evaluate_main(["--help"])
    said = " ".join(capsys.readouterr().out.split())
    assert f"(default: the EVAL_SEQ_LENS setting, {config.OPTIONS_BY_KEY['eval_seq_lens'].default})" in said


def test_command_line_refuses_bad_arguments(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([str(tmp_path / "missing"), "--target", "512", "--device", "cpu"])
    assert exit_info.value.code == 2
    assert "is not a directory" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        evaluate_main([str(tmp_path), "--target", "512", "--claimed", "-5"])
    assert exit_info.value.code == 2
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as exit_info:
            evaluate_main([str(tmp_path), "--target", "512", "--device", "cuda"])
        assert exit_info.value.code == 2
        assert "CUDA is not available here" in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda:x", "cuda:", "cudax", "cuda:-1", "cuda:1:2"])
def test_a_device_that_is_not_cpu_cuda_or_cuda_n_is_refused_by_name(tmp_path, capsys, device):
    """--device (quasar evaluate, step1) and an evaluation's options are checked as DEVICE is (cpu, cuda
    or cuda:N), before torch or the GPU count reads them: 'cuda:x' escaped as a ValueError's
    traceback from the check of the GPU it names, 'cuda:-1' as an IndexError's."""
    for main, arguments in [(evaluate_main, [str(tmp_path), "--target", "512"]), (step1_main, ["--repo-path", "."])]:
        with pytest.raises(SystemExit) as exit_info:
            main([*arguments, "--device", device])
        assert exit_info.value.code == 2
        said = " ".join(capsys.readouterr().err.split())  # argparse wraps its line at the terminal's width
        assert f"argument --device: expected cpu, cuda or cuda:N, got {device!r}" in said
    for unchecked in (device, f" {device.partition(':')[0]}"):  # an evaluation's options, as given
        with pytest.raises(EvaluationInputError, match=f"device must be cpu, cuda or cuda:N, got {unchecked!r}"):
            evaluate(str(tmp_path), 512, None, EvaluationOptions(seq_lens=(512,), device=unchecked))


def test_report_round_trips_through_json_and_drops_non_finite_numbers():
    report = EvaluationReport(
        verdict="fail",
        reasons=["T=64: the output has NaN or infinite values"],
        repo="/r",
        target_seq_len=64,
        seq_lens=[64],
        device="cpu",
        device_name="cpu",
        import_check=ImportCheck(ok=True, profile="core"),
        lengths={
            "64": LengthResult(
                seq_len=64,
                status="ok",
                rel_error=math.inf,
                rel_error_eighths=[math.nan] * 8,
                finite=False,
                correct=False,
            )
        },
        timings=Timings(total_s=3.0, timed_s=1.0),
    )
    import json

    data = json.loads(report.to_json())
    assert data["lengths"]["64"]["rel_error"] is None and data["lengths"]["64"]["rel_error_eighths"] == [None] * 8
    assert data["timings"]["overhead_s"] == 2.0
    again = EvaluationReport.from_dict(data)
    assert again.reasons == report.reasons and again.lengths["64"].finite is False
    assert again.import_check == report.import_check and again.timings.total_s == 3.0


@pytest.mark.parametrize(
    ("length", "tokens", "cap", "expected"),
    [
        (512, 1 << 18, 64, 64),
        (1024, 1 << 18, 64, 64),
        (2048, 1 << 18, 64, 64),
        (8192, 1 << 18, 64, 32),
        (100_000, 1 << 18, 64, 3),
        (1_000_000, 1 << 18, 64, 1),
        (512, 1 << 18, 256, 256),
        (1 << 20, 1 << 22, 64, 2),
        (512, 0, 64, 1),
        (512, 5000, 64, 10),
    ],
)
def test_forwards_per_request_depend_on_the_length_alone(length, tokens, cap, expected):
    from quasar.evaluate.options import MAX_TOKENS_PER_REQUEST, forwards_per_request

    count = forwards_per_request(length, tokens, cap)
    assert count == expected
    assert 1 <= count <= cap and (count == 1 or count * length <= MAX_TOKENS_PER_REQUEST)
    if 1 < count < min(cap, MAX_TOKENS_PER_REQUEST // length):
        assert count * length >= tokens > (count - 1) * length


def test_tokens_per_request_default_by_device():
    from dataclasses import replace

    from quasar.evaluate.options import DEFAULT_TOKENS_PER_REQUEST, EvaluationOptions, tokens_per_request

    assert tokens_per_request(EvaluationOptions(device="cuda")) == DEFAULT_TOKENS_PER_REQUEST
    assert tokens_per_request(EvaluationOptions(device="cuda:3")) == DEFAULT_TOKENS_PER_REQUEST
    assert tokens_per_request(EvaluationOptions(device="cpu")) == 0
    assert tokens_per_request(replace(EvaluationOptions(device="cpu"), tokens_per_request=4096)) == 4096


def test_bad_tokens_per_request_is_refused(tmp_path):
    from quasar.evaluate.harness import evaluate
    from quasar.evaluate.options import EvaluationInputError, EvaluationOptions

    for bad in (-1, 1 << 30, 1.5):
        with pytest.raises(EvaluationInputError, match="tokens_per_request"):
            evaluate(tmp_path, 64, None, EvaluationOptions(device="cpu", tokens_per_request=bad))


def test_a_validator_whose_lengths_cannot_take_the_largest_target_is_warned_at_start():
    """EVAL_SEQ_LENS with 1M (its help said allowed) under the default SANDBOX_MEMORY_MB makes the
    output area of an 8,000,000 target 17.2 GiB: every submission at the largest targets then fails
    on that validator as cannot evaluate, and nothing said so until it did."""
    memory = 16384 << 20
    assert output_area_warning((512, 1024, 2048), memory, "cuda") is None
    assert output_area_warning((512, 1024, 2048, 1_000_000), memory, "cpu") is None  # CPU runs stop at 65,536
    warning = output_area_warning((512, 1024, 2048, 1_000_000), memory, "cuda")
    assert warning is not None and "17.2 GiB" in warning and "SANDBOX_MEMORY_MB" in warning, warning
    needed = int(warning.split("SANDBOX_MEMORY_MB of at least ")[1].split()[0].replace(",", ""))
    check_lengths((512, 1024, 2048, 1_000_000), MAX_SEQ_LEN, "cuda", needed << 20)
    with pytest.raises(EvaluationInputError):
        check_lengths((512, 1024, 2048, 1_000_000), MAX_SEQ_LEN, "cuda", (needed - 1) << 20)
