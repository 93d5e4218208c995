"""quasar/gitenv.py: git run by the suite reads none of the user's configuration and commits as
the author it is given, whatever the user's git setup and environment say."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from quasar.gitenv import committing_environment, identity, run_git

DATE = "2025-01-01T00:00:00+00:00"


@pytest.fixture
def hostile_home(tmp_path, monkeypatch) -> Path:
    """A user whose global configuration refuses every commit (a hook that fails, signing with a
    key that does not exist) and whose environment names another repository and author."""
    home = tmp_path / "home"
    hooks = home / "hooks"
    hooks.mkdir(parents=True)
    (hooks / "pre-commit").write_text("#!/bin/sh\necho 'refused by the user hook' >&2\nexit 1\n")
    (hooks / "pre-commit").chmod(0o755)
    (home / ".gitconfig").write_text(
        f"[core]\n\thooksPath = {hooks}\n[commit]\n\tgpgsign = true\n[user]\n\tsigningkey = NO-SUCH-KEY\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    monkeypatch.setenv("GIT_AUTHOR_NAME", "Someone Else")
    return home


def _commit(repo: Path, env: dict[str, str] | None) -> subprocess.CompletedProcess:
    repo.mkdir(exist_ok=True)
    (repo / "file.txt").write_text("content\n")
    for args in (["init", "-q", "-b", "main"], ["add", "file.txt"]):
        subprocess.run(["git", *args], cwd=repo, env=env, capture_output=True, check=False)
    return subprocess.run(["git", "commit", "-q", "-m", "one"], cwd=repo, env=env, capture_output=True, text=True)


def test_the_users_configuration_does_refuse_a_plain_commit(hostile_home, tmp_path):
    """The control: the hostile configuration is real (without it the next test proves nothing)."""
    env = {"HOME": str(hostile_home), "PATH": "/usr/bin:/bin", "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@y"}
    env |= {"GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@y"}
    done = _commit(tmp_path / "plain", env)
    assert done.returncode != 0 and "refused by the user hook" in done.stderr


def test_a_commit_ignores_the_users_configuration_and_names_the_given_author(hostile_home, tmp_path):
    repo = tmp_path / "repo"
    done = _commit(repo, committing_environment("QUASAR test", "test@quasar.invalid", DATE))
    assert done.returncode == 0, done.stderr
    log = subprocess.run(
        ["git", "log", "-1", "--format=%an|%ae|%cn|%ce|%aI|%cI|%G?"],
        cwd=repo,
        env=committing_environment("unused", "unused@quasar.invalid"),
        capture_output=True,
        text=True,
        check=True,
    )
    name, email = "QUASAR test", "test@quasar.invalid"
    assert log.stdout.strip() == f"{name}|{email}|{name}|{email}|{DATE}|{DATE}|N"
    assert (repo / ".git").is_dir() and not (tmp_path / "elsewhere.git").exists()


def test_the_same_files_and_date_give_the_same_commit(hostile_home, tmp_path):
    ids = []
    for name in ("one", "two"):
        env = committing_environment("QUASAR test", "test@quasar.invalid", DATE)
        assert _commit(tmp_path / name, env).returncode == 0
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=tmp_path / name, env=env, capture_output=True, text=True
        )
        ids.append(head.stdout.strip())
    assert ids[0] == ids[1] and len(ids[0]) == 40


def test_identity_names_both_roles_and_a_date_only_when_given():
    assert identity("A", "a@b") == {
        "GIT_AUTHOR_NAME": "A",
        "GIT_AUTHOR_EMAIL": "a@b",
        "GIT_COMMITTER_NAME": "A",
        "GIT_COMMITTER_EMAIL": "a@b",
    }
    assert identity("A", "a@b", DATE)["GIT_COMMITTER_DATE"] == DATE


class _Refused(Exception):
    pass


def test_run_git_returns_the_output_and_raises_the_callers_error_with_gits_reason(tmp_path, monkeypatch):
    env = committing_environment("QUASAR test", "test@quasar.invalid")
    assert run_git(tmp_path, "init", "-q", "-b", "main", env=env, error=_Refused) == ""
    assert run_git(tmp_path, "symbolic-ref", "--short", "HEAD", env=env, error=_Refused) == "main"
    with pytest.raises(_Refused, match=r"git checkout failed in .*pathspec 'no-such-branch'"):
        run_git(tmp_path, "checkout", "no-such-branch", env=env, error=_Refused)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(_Refused, match="git is not installed"):
        run_git(tmp_path, "status", env=env, error=_Refused)
