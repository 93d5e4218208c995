"""The sandbox's parent side (quasar/evaluate/sandbox.py, sandbox_contents.py): the output it keeps,
the environment, the fork's copy, the stragglers, the folders it binds and hides."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from quasar.evaluate.captured_output import CapturedOutput
from quasar.evaluate.sandbox import SandboxError, SandboxPolicy
from quasar.evaluate.sandbox_contents import copy_tree, scrubbed_environment
from quasar.evaluate.sandbox_layout import python_installation, site_folders
from quasar.evaluate.stragglers import MARKER_VARIABLE, kill_marked_processes
from tests.evaluate_runs import (
    naive_capture_text,
)


@pytest.mark.parametrize("seed", range(4))
def test_captured_output_keeps_head_and_tail_like_the_naive_version(seed):
    generator = torch.Generator().manual_seed(seed)
    chunks = []
    for _ in range(int(torch.randint(1, 40, (1,), generator=generator))):
        size = int(torch.randint(0, 9000, (1,), generator=generator))
        chunks.append(bytes(torch.randint(97, 123, (size,), generator=generator, dtype=torch.uint8).tolist()))
    captured = CapturedOutput()
    for chunk in chunks:
        captured.add(chunk)
    assert captured.total_bytes == sum(map(len, chunks))
    assert captured.text() == naive_capture_text(chunks)


def test_scrubbed_environment_keeps_no_secret(monkeypatch):
    monkeypatch.setenv("GITHUB_TOKEN", "ghp_secret")
    monkeypatch.setenv("WALLET_PATH", "/root/.bittensor/wallets")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/usr/local/nvidia/lib64")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    env = scrubbed_environment("/sandbox/home", "cuda:1", SandboxPolicy(), "abc")
    assert not any("secret" in value.lower() or "bittensor" in value for value in env.values())
    assert "GITHUB_TOKEN" not in env and "WALLET_PATH" not in env
    assert env["HOME"] == "/sandbox/home" and env["TMPDIR"] == "/sandbox/home/tmp"
    assert env["CUDA_VISIBLE_DEVICES"] == "3"
    assert env["LD_LIBRARY_PATH"] == "/usr/local/nvidia/lib64"
    assert env[MARKER_VARIABLE] == "abc"
    assert scrubbed_environment("/h", "cpu", SandboxPolicy(), "m")["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(SandboxError, match="has no device 2"):
        scrubbed_environment("/h", "cuda:2", SandboxPolicy(), "m")


def test_copying_a_fork_skips_git_and_links_leaving_it(tmp_path, monkeypatch):
    source = tmp_path / "fork"
    (source / ".git").mkdir(parents=True)
    (source / ".git" / "config").write_text("[credential] token")
    (source / "fla").mkdir()
    (source / "fla" / "a.py").write_text("x = 1")
    os.chmod(source / "fla" / "a.py", 0o600)
    (source / "fla" / "inside.py").symlink_to(source / "fla" / "a.py")
    (source / "fla" / "escape").symlink_to("/etc/passwd")
    copy_tree(source, tmp_path / "copy")
    copied = tmp_path / "copy"
    assert not (copied / ".git").exists()
    assert (copied / "fla" / "a.py").read_text() == "x = 1"
    assert oct((copied / "fla" / "a.py").stat().st_mode & 0o777) == "0o644"
    assert (copied / "fla" / "inside.py").is_symlink() and not (copied / "fla" / "escape").exists()
    monkeypatch.setattr("quasar.evaluate.sandbox_contents.MAX_FORK_BYTES", 2)
    with pytest.raises(SandboxError, match="larger than"):
        copy_tree(source, tmp_path / "copy2")


def test_processes_carrying_the_marker_are_killed():
    marker = f"unit-{os.getpid()}"
    env = dict(os.environ, **{MARKER_VARIABLE: marker})
    escaped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    try:
        time.sleep(0.2)
        assert kill_marked_processes(marker, grace_seconds=0.1) == 1
        assert escaped.wait(timeout=5) == -signal.SIGKILL
        assert kill_marked_processes(marker, grace_seconds=0.1) == 0
    finally:
        escaped.kill()


def test_the_sandbox_hides_site_folders_lent_by_a_pth_file_and_binds_no_checkout(tmp_path, monkeypatch):
    lent = tmp_path / "image" / "lib" / "site-packages"
    checkout = tmp_path / "checkout"
    lent.mkdir(parents=True)
    checkout.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(lent), str(checkout)])
    # A folder of packages is hidden inside the sandbox wherever it lies in what is bound;
    # the child's Python is the installation, not this process's virtual environment.
    assert str(lent) in site_folders()
    assert str(checkout) not in site_folders()
    installation = python_installation()
    assert all(not folder.startswith(str(checkout)) for folder in installation)
    if sys.prefix != sys.base_prefix:
        assert sys.prefix not in installation
