"""``quasar local-validator`` (quasar/tools/local_validator.py) and the other evaluation tools'
refusals, as a miner reads them in an 80-column terminal."""

from __future__ import annotations

import pytest
import torch

from quasar.tools import check_sandbox, local_validator
from quasar.tools import install_kernel as step1
from quasar.tools import tune_kernel as step2
from tests.gitrepo import git, set_identity

CPU_LIMIT = "sequence length 100000: CPU runs are limited to 65536 tokens"


@pytest.mark.parametrize("columns", ["80", "200"])
def test_a_refusal_is_wrapped_at_words_within_80_columns_not_split_mid_flag_by_the_terminal(
    tmp_path, monkeypatch, capsys, columns
):
    """A refusal the harness words on one long line (here `--full` on the CPU, which runs lengths
    up to 1M) came out in one 148-column line that the terminal split inside a word."""
    monkeypatch.setenv("COLUMNS", columns)
    with pytest.raises(SystemExit) as refused:
        local_validator.main(["--repo-path", str(tmp_path), "--device", "cpu", "--full"])
    assert refused.value.code == 2
    error = "quasar local-validator: error:" + capsys.readouterr().err.split("quasar local-validator: error:")[1]
    assert max(len(line) for line in error.splitlines()) <= 80, error  # the usage above follows the terminal
    assert " ".join(error.split()).startswith(f"quasar local-validator: error: {CPU_LIMIT}"), error


@pytest.mark.parametrize(
    "tool, argv",
    [
        (step2, ["--device", "cpu", "--seq-lens", "512,100000"]),
        pytest.param(
            check_sandbox,
            ["--device", "cuda"],
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA"),
        ),
    ],
)
def test_the_other_evaluation_tools_wrap_their_refusals_too(tmp_path, monkeypatch, capsys, tool, argv):
    monkeypatch.setenv("COLUMNS", "80")
    fork = tmp_path / "fork" / "fla" / "ops" / "quasar"
    fork.mkdir(parents=True)
    (fork / "tuning.py").write_text("")
    if tool is step2:
        argv = ["--repo-path", str(tmp_path / "fork"), *argv]
    with pytest.raises(SystemExit):
        tool.main(argv)
    error = capsys.readouterr().err
    assert "error:" in error and max(len(line) for line in error.splitlines()) <= 80, error


@pytest.mark.parametrize(
    "tool, argv, cure",
    [
        (step1, ["--skip-setup"], "give --seq-len N of 65536 or less"),
        (local_validator, ["--full"], "run --seq-len N of 65536 or less instead of --full"),
        (local_validator, ["--seq-len", "100000"], "give --seq-len N of 65536 or less"),
        (step2, [], "give --seq-lens LIST of 65536 or less"),
    ],
)
def test_a_length_past_the_cpus_limit_is_refused_naming_the_flag_that_cures_it(
    tmp_path, monkeypatch, capsys, tool, argv, cure
):
    """The README's commands run on the CPU (`quasar step1 --repo-path FORK --device cpu`, and
    local-validator --full, step2 alike) were refused for a length the miner never gave, their
    defaults' (1M, 100k, 262,144), saying only that CPU runs are limited to 65536 tokens."""
    monkeypatch.setenv("COLUMNS", "80")
    fork = tmp_path / "fork" / "fla" / "ops" / "quasar"
    fork.mkdir(parents=True)
    (fork / "tuning.py").write_text("")
    with pytest.raises(SystemExit) as refused:
        tool.main(["--repo-path", str(tmp_path / "fork"), "--device", "cpu", *argv])
    assert refused.value.code == 2
    error = capsys.readouterr().err.split("error:", 1)[1]
    assert max(len(line) for line in error.splitlines()) <= 80, error
    said = " ".join(error.split())
    assert "CPU runs are limited to 65536 tokens" in said and said.endswith(cure), said


def test_a_flag_stays_on_the_line_of_its_value_wherever_the_line_breaks(monkeypatch, capsys):
    """Wrapped at any word, "--device cpu" read "--device" at a line's end and "cpu" on the next."""
    monkeypatch.setenv("COLUMNS", "80")
    parser = local_validator.WrappingParser(prog="quasar local-validator")
    for filler in range(0, 90):
        with pytest.raises(SystemExit):
            parser.error(f"{'x' * filler} CUDA is not available here (--device cpu runs small lengths)")
        lines = capsys.readouterr().err.split("error:", 1)[1].splitlines()
        assert any("--device cpu" in line for line in lines), (filler, lines)
        assert max(len(line) for line in lines) <= 80 or filler > 60, (filler, lines)


@pytest.mark.parametrize("source", ["command line", "environment", ".env"])
@pytest.mark.parametrize(
    "tool, prog", [(step1, "quasar step1"), (step2, "quasar step2"), (local_validator, "quasar local-validator")]
)
def test_a_device_this_host_lacks_is_refused_naming_the_setting_it_came_from(
    tmp_path, monkeypatch, capsys, source, tool, prog
):
    """step1's setup check said `--device cuda: CUDA is not available here...` of a DEVICE from the
    .env, given by no flag; local-validator and step2 said `device cuda:`. The three name it as a
    bad setting is named: the flag or the variable, and where the value came from."""
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.delenv("DEVICE", raising=False)
    monkeypatch.setenv("QUASAR_DOTENV", "")
    argv = ["--repo-path", str(tmp_path / "fork"), "--seq-len", "1024"] if tool is not step2 else []
    named = "--device (from command line)"
    if source == "command line":
        argv.append("--device=cuda:99")
    elif source == "environment":
        monkeypatch.setenv("DEVICE", "cuda:99")
        named = "DEVICE (from environment)"
    else:
        (tmp_path / "quasar.env").write_text("DEVICE=cuda:99\n")
        monkeypatch.setenv("QUASAR_DOTENV", str(tmp_path / "quasar.env"))
        named = f"DEVICE (from {tmp_path / 'quasar.env'})"
    fork = tmp_path / "fork" / "fla" / "ops" / "quasar"
    fork.mkdir(parents=True)
    (fork / "tuning.py").write_text("")
    git(tmp_path / "fork", "init", "-q")
    set_identity(tmp_path / "fork")
    try:
        status = tool.main([*argv, "--repo-path", str(tmp_path / "fork")] if tool is step2 else argv)
    except SystemExit as exited:
        status = exited.code
    printed = capsys.readouterr()
    said = " ".join((printed.out + printed.err).split())
    assert status == 2, said
    assert f"{prog}: error: {named}: cuda:99, but " in said, said
    assert said.endswith("(--device cpu runs small lengths, for tests only: not a benchmark)"), said
    assert (tmp_path / "fork" / "fla" / "ops" / "quasar" / "tuning.py").read_text() == ""  # the fork untouched
