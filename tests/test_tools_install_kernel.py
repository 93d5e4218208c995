"""``quasar step1`` (quasar/tools/install_kernel.py): the project's kernel files written into a
miner's fork, the fork checked, only the kernel files committed; on the CPU."""

from __future__ import annotations

import pytest

from quasar.starter_fork import (
    KERNEL_DIR,
    LAYER_FILE,
    copy_starter_tree,
    write_starter_fork,
)
from quasar.tools import install_kernel as step1
from tests.gitrepo import git, set_identity

FAST_EVAL = ["--device", "cpu", "--warmup", "1", "--repeats", "3"]


def test_step1_writes_only_kernel_files_and_checks_the_fork_can_take_them(tmp_path):
    files = step1.kernel_files()
    assert LAYER_FILE in files and all(p == LAYER_FILE or KERNEL_DIR in p.parents for p in files)
    assert {"chunk.py", "tuning.py", "quasar_recurrent.cu"} <= {p.name for p in files}

    fork = tmp_path / "fork"
    copy_starter_tree(fork)
    assert step1.missing_support(fork) == []
    (fork / "fla" / "utils.py").write_text("IS_AMD = False\n")
    (fork / "fla" / "ops" / "utils" / "index.py").unlink()
    problems = step1.missing_support(fork)
    assert any(p.startswith("fla/utils.py does not define") and "input_guard" in p for p in problems), problems
    assert any(p.startswith("fla/ops/utils/index.py is missing") for p in problems), problems
    before = (fork / "fla" / "ops" / "quasar" / "chunk.py").read_bytes()
    (fork / "fla" / "ops" / "quasar" / "chunk.py").write_text("# old kernel\n")
    with pytest.raises(step1.Step1Error, match="fla/utils.py does not define"):
        step1.write_kernel(fork)
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text() == "# old kernel\n"

    copy_starter_tree(tmp_path / "fresh")
    fork = tmp_path / "fresh"
    (fork / "fla" / "ops" / "quasar" / "tuning.py").unlink()
    (fork / "fla" / "ops" / "quasar" / "chunk.py").write_text("# old kernel\n")
    written = step1.write_kernel(fork)
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_bytes() == before
    assert written.previous[KERNEL_DIR / "tuning.py"] is None
    step1.restore(fork, written)
    assert not (fork / "fla" / "ops" / "quasar" / "tuning.py").exists()
    assert (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text() == "# old kernel\n"


@pytest.mark.slow
def test_step1_validates_and_commits_only_the_kernel_files(tmp_path):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    set_identity(fork)
    chunk = fork / "fla" / "ops" / "quasar" / "chunk.py"
    chunk.write_text(chunk.read_text() + "\n# an older kernel\n")
    (fork / "notes.txt").write_text("the miner's own file\n")
    git(fork, "add", "fla/ops/quasar/chunk.py")
    git(fork, "commit", "-q", "-m", "older kernel")
    before = git(fork, "rev-parse", "HEAD")

    code = step1.main(["--repo-path", str(fork), "--skip-setup", "--seq-len", "1024", *FAST_EVAL])
    assert code == 0
    assert git(fork, "rev-parse", "HEAD~1") == before
    assert git(fork, "log", "-1", "--format=%s") == step1.COMMIT_MESSAGE
    assert git(fork, "show", "--name-only", "--format=", "HEAD").splitlines() == ["fla/ops/quasar/chunk.py"]
    assert "an older kernel" not in (fork / "fla" / "ops" / "quasar" / "chunk.py").read_text()
    assert git(fork, "status", "--porcelain") == "?? notes.txt"
    # The kernel is there now: writing it again leaves nothing to commit.
    assert step1.commit(fork, step1.write_kernel(fork)) is None


def test_step1_refuses_a_fork_that_cannot_take_the_kernel(tmp_path, capsys):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    (fork / "fla" / "utils.py").write_text("IS_AMD = False\n")
    assert step1.main(["--repo-path", str(fork), "--skip-setup", "--seq-len", "1024", *FAST_EVAL]) == 2
    assert "does not define" in capsys.readouterr().out
    assert step1.main(["--repo-path", str(fork), "--device", "cpu", "--seq-len", "1024"]) == 2  # no git identity here
    with pytest.raises(SystemExit):
        step1.main(["--repo-path", str(tmp_path / "absent"), "--skip-setup"])


def test_step1_refuses_a_length_the_device_cannot_run_before_touching_the_fork(tmp_path, capsys):
    fork = tmp_path / "fork"
    write_starter_fork(fork)
    set_identity(fork)
    chunk = fork / "fla" / "ops" / "quasar" / "chunk.py"
    chunk.write_text(chunk.read_text() + "\n# the miner's own change, not committed\n")
    before = chunk.read_text()
    with pytest.raises(SystemExit) as refused:
        step1.main(["--repo-path", str(fork), "--skip-setup", *FAST_EVAL])  # the default target: 1M tokens
    assert refused.value.code == 2
    printed = capsys.readouterr()
    assert "CPU runs are limited to 65536 tokens" in " ".join(printed.err.split()) and "wrote" not in printed.out
    assert chunk.read_text() == before
