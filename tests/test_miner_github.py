"""The miner's fork and push path: GitHub's fork endpoint (a stand-in on 127.0.0.1), clones and
pushes over git's smart HTTP with the token given per command, per-hotkey workspaces and their lock.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest

from quasar import config
from quasar.localnet.github_standin import GitHubStandIn
from quasar.miner.github import Git, GitError, GitHubClient, GitHubError, Repository, write_askpass
from quasar.miner.runner import remote_url
from quasar.miner.workspace import ForkClone, Workspace, WorkspaceError, WorkspaceLocked
from servers import QuietHandler, ThreadedServers
from test_miner_standins import (
    CHUNK_FILE,
    TOKEN,
    UPSTREAM,
    bare_has,
    bare_head,
    github_with_upstream,
)
from tests.gitrepo import git, git_environment

HOTKEY_A = "5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
HOTKEY_B = "5FHneW46xGXgs5mUiveU4sbTyGBzmstUspZC92UhjJM694ty"
OTHER_TOKEN = "ghp_otherAccountToken9876543210zyxwvu"


def make_clone(
    tmp_path: Path, base: str, full_name: str, token: str = TOKEN, hotkey: str = HOTKEY_A, username: str = "alice"
) -> tuple[Workspace, ForkClone]:
    workspace = Workspace(tmp_path / "workspaces", hotkey)
    workspace.acquire()
    git_runner = Git(write_askpass(workspace.askpass), username, token, "Alice", "alice@example.invalid")
    return workspace, ForkClone(workspace.fork, git_runner, remote_url(base, full_name), "main")


class SyncedFork(NamedTuple):
    github: GitHubStandIn
    fork: Repository
    workspace: Workspace
    clone: ForkClone
    start: str


@contextmanager
def synced_fork(tmp_path: Path, over_http: bool) -> Iterator[SyncedFork]:
    """Alice's fork of the upstream on a GitHub stand-in, cloned into her hotkey's workspace over
    the stand-in's smart HTTP (or its file:// remote) and synced; the workspace released after."""
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=0) as github:
        fork = GitHubClient(github.api_url, TOKEN).ensure_fork("alice", UPSTREAM).repository
        workspace, clone = make_clone(tmp_path, github.git_base if over_http else github.file_base, fork.full_name)
        try:
            yield SyncedFork(github, fork, workspace, clone, clone.sync())
        finally:
            workspace.release()


def files_containing(root: Path, needle: bytes) -> list[Path]:
    return [
        path for path in root.rglob("*") if path.is_file() and not path.is_symlink() and needle in path.read_bytes()
    ]


def test_fork_is_created_when_missing_and_reused_when_present(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=2) as github:
        client = GitHubClient(github.api_url, TOKEN, sleep=lambda seconds: None)
        first = client.ensure_fork("alice", UPSTREAM, wait_s=5, poll_s=0.01)
        assert first.created
        assert first.repository.full_name == "alice/flash-linear-attention"
        assert first.repository.is_fork and first.repository.parent == UPSTREAM
        assert bare_head(github.bare("alice/flash-linear-attention")) == bare_head(github.bare(UPSTREAM))
        posts = [call for call in github.calls if call[0] == "POST"]
        assert posts == [("POST", f"/api/repos/{UPSTREAM}/forks")]
        polls = [call for call in github.calls if call == ("GET", "/api/repos/alice/flash-linear-attention")]
        assert len(polls) == 1 + 2 + 1  # exists? no; then hidden twice while "GitHub" creates it; then ready

        second = client.ensure_fork("alice", UPSTREAM)
        assert not second.created and second.repository == first.repository
        assert [call for call in github.calls if call[0] == "POST"] == posts
        client.close()


def test_a_fork_that_never_appears_is_a_bounded_wait(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=10**6) as github:
        client = GitHubClient(github.api_url, TOKEN, sleep=lambda seconds: None)
        with pytest.raises(GitHubError, match="did not finish creating the fork alice/flash-linear-attention"):
            client.ensure_fork("alice", UPSTREAM, wait_s=0.2, poll_s=0.01)


def test_a_wrong_token_is_a_clear_error_that_does_not_show_it(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}) as github:
        wrong = "ghp_wrongTokenWrongToken0000000000000"
        with pytest.raises(GitHubError) as error:
            GitHubClient(github.api_url, wrong).ensure_fork("alice", UPSTREAM)
    assert "GitHub rejected GITHUB_TOKEN (401 Bad credentials)" in str(error.value)
    assert wrong not in str(error.value)
    with pytest.raises(GitHubError, match="GITHUB_TOKEN is not set"):
        GitHubClient("https://api.github.com", "")


class NestedJson(QuietHandler):
    """A GitHub API stand-in answering JSON nested past the parser's depth, with ``status``."""

    status = 200

    def do_GET(self) -> None:
        body = b"[" * 100_000 + b"]" * 100_000
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("status", [200, 500])
def test_attack_json_nested_past_the_parsers_depth_is_a_github_error(status):
    """An answer of the GitHub API (GITHUB_API_URL) nested 100,000 deep raised RecursionError out of
    the client, which the miner's start does not catch: it ended in a traceback, and under pm2 again
    at each restart. It is a GitHubError saying the answer is no repository, as other bad answers."""
    NestedJson.status = status
    with ThreadedServers(NestedJson) as github, pytest.raises(GitHubError) as raised:
        GitHubClient(github.server_url(), TOKEN).repository("alice/flash-linear-attention")
    assert "GET /repos/alice/flash-linear-attention" in str(raised.value)


def test_a_token_of_another_account_is_refused(tmp_path):
    with github_with_upstream(tmp_path, {OTHER_TOKEN: "bob"}, fork_delay_polls=0) as github:
        with pytest.raises(GitHubError, match="forked .* into bob's account, but GITHUB_USERNAME is alice"):
            GitHubClient(github.api_url, OTHER_TOKEN).ensure_fork("alice", UPSTREAM)


def test_missing_upstream_is_a_clear_error(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}) as github:
        with pytest.raises(GitHubError, match="cannot fork nobody/missing: it does not exist"):
            GitHubClient(github.api_url, TOKEN).ensure_fork("alice", "nobody/missing")


def test_clone_and_push_over_http_keep_the_token_out_of_the_workspace_and_logs(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    environment_before = dict(os.environ)
    with synced_fork(tmp_path, over_http=True) as (github, fork, workspace, clone, start):
        assert start == bare_head(github.bare(UPSTREAM))
        assert TOKEN in github.git_passwords  # the askpass helper gave the token to git's basic auth

        chunk = clone.path / CHUNK_FILE
        chunk.write_text(chunk.read_text() + "\n# faster\n")
        commit = clone.commit([CHUNK_FILE], "tuning: faster")
        clone.push(commit)
        assert bare_head(github.bare(fork.full_name)) == commit
        assert bare_head(github.bare(UPSTREAM)) == start  # the upstream is untouched
        author = git(clone.path, "log", "-1", "--format=%an <%ae>")
        assert author == "Alice <alice@example.invalid>"

        assert files_containing(workspace.path, TOKEN.encode()) == []
        assert TOKEN not in (clone.path / ".git" / "config").read_text()
        assert git(clone.path, "remote", "get-url", "origin") == f"{github.git_base}/{fork.full_name}.git"
        assert TOKEN not in caplog.text
        assert dict(os.environ) == environment_before


@pytest.mark.parametrize("base", [f"https://alice:{TOKEN}@github.com", f"https://{TOKEN}@github.com/"])
def test_attack_a_token_in_git_remote_base_is_refused_before_the_api_or_git_config_gets_it(base):
    """A token written into GIT_REMOTE_BASE (as URLs carry credentials for git) was taken: the fork's
    URL is built on it, so the token went into every claim the miner sent the submission API, into
    the clone's .git/config and into the log lines naming the remote (masked only where it is the
    GITHUB_TOKEN). The setting is refused, naming it and not the token."""
    with pytest.raises(config.SettingsError) as raised:
        config.resolve({}, environ={"GIT_REMOTE_BASE": base}, dotenv_path=None)
    assert "GIT_REMOTE_BASE (from environment): must not contain a user name or token" in str(raised.value)
    assert TOKEN not in str(raised.value)


def test_push_with_a_wrong_token_fails_clearly(tmp_path):
    with synced_fork(tmp_path, over_http=True) as (github, fork, _, clone, _):
        wrong = "ghp_revokedTokenRevokedToken00000000"
        _, wrong_clone = make_clone(tmp_path / "other", github.git_base, fork.full_name, token=wrong)
        wrong_clone.path = clone.path
        (clone.path / CHUNK_FILE).write_text("# edited\n")
        commit = clone.commit([CHUNK_FILE], "edit")
        with pytest.raises(GitError) as error:
            wrong_clone.push(commit)
        assert "authentication failed" in str(error.value) and "GITHUB_TOKEN" in str(error.value)
        assert wrong not in str(error.value)
        assert not bare_has(github.bare(fork.full_name), commit)


def test_local_bare_remote_push_lands(tmp_path):
    with synced_fork(tmp_path, over_http=False) as (github, fork, _, clone, _):
        (clone.path / "fla/ops/quasar/tuning.json").write_text('{"format": 1, "values": {}, "choices": {}}\n')
        commit = clone.commit(["fla/ops/quasar/tuning.json"], "add tuning.json")
        assert not clone.remote_has(commit)
        clone.push(commit)
        clone.fetch()
        assert clone.remote_has(commit)
        assert bare_head(github.bare(fork.full_name)) == commit


def test_sync_repairs_a_half_applied_candidate_and_takes_commits_pushed_elsewhere(tmp_path):
    with synced_fork(tmp_path, over_http=False) as (github, fork, _, clone, _):
        committed = (clone.path / CHUNK_FILE).read_text()
        (clone.path / CHUNK_FILE).write_text("# a crash left this here\n")
        (clone.path / "fla/ops/quasar/new_kernel.py").write_text("x = 1\n")
        (clone.path / "notes.txt").write_text("the user's own file\n")

        elsewhere = tmp_path / "elsewhere"
        git(None, "clone", "-q", remote_url(github.file_base, fork.full_name), str(elsewhere))
        (elsewhere / "README.md").write_text("pushed by hand\n")
        git(elsewhere, "commit", "-q", "-am", "by hand")
        git(elsewhere, "push", "-q", "origin", "main")
        pushed = git(elsewhere, "rev-parse", "HEAD")

        assert clone.sync() == pushed
        assert (clone.path / CHUNK_FILE).read_text() == committed
        assert not (clone.path / "fla/ops/quasar/new_kernel.py").exists()
        assert clone.changed_paths() == ["notes.txt"]  # outside fla/ops/quasar: left alone


def test_a_git_command_killed_holding_its_locks_does_not_stop_the_miner_for_good(tmp_path, caplog):
    """A git commit killed while it holds the index lock (pm2's tree kill on stop, the OOM killer;
    here while its pre-commit hook runs), and a fetch killed holding its ref's lock: git refused
    every later write ("index.lock': File exists"), so each start failed at the sync (pm2
    restarting it into the same failure) and no kept candidate could be committed. The sync
    removes the stale locks, the workspace lock guaranteeing that no git command of a miner runs."""
    with synced_fork(tmp_path, over_http=False) as (github, fork, _, clone, start):
        (clone.path / CHUNK_FILE).write_text((clone.path / CHUNK_FILE).read_text() + "# a candidate\n")
        hooks = tmp_path / "hooks"
        hooks.mkdir()
        (hooks / "pre-commit").write_text("#!/bin/sh\nsleep 60\n")
        (hooks / "pre-commit").chmod(0o755)
        committing = subprocess.Popen(
            ["git", "-c", f"core.hooksPath={hooks}", "commit", "-qam", "killed"],
            cwd=clone.path,
            env=git_environment(),
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while not (clone.path / ".git/index.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the hook runs: git holds the lock
        os.killpg(committing.pid, signal.SIGKILL)
        committing.wait()
        assert (clone.path / ".git/index.lock").exists()
        (clone.path / ".git/refs/remotes/origin/main.lock").write_text(start + "\n")  # as a killed fetch leaves it
        elsewhere = tmp_path / "elsewhere"
        git(None, "clone", "-q", remote_url(github.file_base, fork.full_name), str(elsewhere))
        (elsewhere / "README.md").write_text("pushed by hand\n")
        git(elsewhere, "commit", "-q", "-am", "by hand")
        git(elsewhere, "push", "-q", "origin", "main")  # the fetch must now update the locked ref
        pushed = git(elsewhere, "rev-parse", "HEAD")

        with caplog.at_level(logging.WARNING, logger="quasar.miner.workspace"):
            assert clone.sync() == pushed
        assert "removed 2 lock file(s)" in caplog.text
        assert clone.changed_paths() == []
        (clone.path / CHUNK_FILE).write_text((clone.path / CHUNK_FILE).read_text() + "# kept\n")
        assert clone.commit([CHUNK_FILE], "kept") != pushed


def test_workspaces_are_per_hotkey_and_one_hotkey_runs_once(tmp_path):
    first = Workspace(tmp_path, HOTKEY_A)
    first.acquire()
    running = f"another miner with hotkey {HOTKEY_A} is running \\(pid {os.getpid()}\\)"
    with pytest.raises(WorkspaceLocked, match=running):
        Workspace(tmp_path, HOTKEY_A).acquire()
    with Workspace(tmp_path, HOTKEY_B) as other:
        assert other.path != first.path and other.fork.parent == other.path
    first.release()
    with Workspace(tmp_path, HOTKEY_A):
        pass
    for bad in ("../../etc", "not-a-hotkey", HOTKEY_A + "/x"):
        with pytest.raises(WorkspaceError, match="is not an ss58 address"):
            Workspace(tmp_path, bad)


def test_a_rejected_push_is_reported_as_rejected_whatever_its_commit_hash_holds(tmp_path):
    # git names the pushed commit by its full hash; one holding "403" once read as an HTTP 403.
    bare = tmp_path / "fork.git"
    git(None, "init", "-q", "--bare", "-b", "main", str(bare))
    for name in ("elsewhere", "here"):
        git(None, "clone", "-q", f"file://{bare}", str(tmp_path / name))
    git(tmp_path / "elsewhere", "commit", "-q", "--allow-empty", "-m", "pushed from elsewhere")
    git(tmp_path / "elsewhere", "push", "-q", "origin", "HEAD:main")
    commit, attempt = "", 0
    while "403" not in commit:  # about one hash in a hundred
        git(tmp_path / "here", "commit", "-q", "--allow-empty", "-m", f"diverged {attempt}")
        commit, attempt = git(tmp_path / "here", "rev-parse", "HEAD"), attempt + 1
    runner = Git(write_askpass(tmp_path / "askpass"), "alice", "", "Alice", "alice@example.invalid")
    with pytest.raises(GitError) as error:
        runner.run("push", "--quiet", "origin", f"{commit}:refs/heads/main", cwd=tmp_path / "here", network=True)
    assert "git push was rejected" in str(error.value) and "authentication" not in str(error.value)
