"""Fork URL and commit rules, and clones at an exact commit, against real local git repositories."""

from __future__ import annotations

import errno
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from quasar import fork_tree, git_failures
from quasar.forks import (
    MAX_FORK_URL_LENGTH,
    Checkout,
    CloneUnavailable,
    ForkError,
    _key_lock,
    _Limits,
    clone_at_commit,
    clone_dir_for,
    normalize_fork_url,
    validate_commit_hash,
)
from tests.github_network import CUT, REFUSE, SERVE, GitHubProxy, make_github_certificate
from tests.gitrepo import git, git_environment

SHA = "0123456789abcdef0123456789abcdef01234567"


# --- helpers: local repositories standing in for GitHub ----------------------------------------


def make_source(tmp_path: Path, commits: list[dict[str, bytes | str]], name: str = "fork") -> tuple[Path, list[str]]:
    """A bare repository with one commit per dict of {path: content}; returns its path and the commit ids.

    A content starting with "->" makes a symlink to the rest of the string.
    """
    work = tmp_path / f"{name}-work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    shas = []
    for files in commits:
        for path, content in files.items():
            target = work / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, str) and content.startswith("->"):
                target.unlink(missing_ok=True)
                target.symlink_to(content[2:])
            else:
                target.write_bytes(content.encode() if isinstance(content, str) else content)
        git(work, "add", "-A")
        git(work, "commit", "-q", "--allow-empty", "-m", f"commit {len(shas)}")
        shas.append(git(work, "rev-parse", "HEAD"))
    bare = tmp_path / f"{name}.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    return bare, shas


def leftovers(cache: Path) -> list[str]:
    """Everything in the cache, lock files included (a clone removes its own when it is done)."""
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def block_fetches(bare: Path) -> Path:
    """Make the repository's upload-pack hang: it opens objects/info/alternates, here a FIFO nobody writes."""
    fifo = bare / "objects" / "info" / "alternates"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(fifo)
    return fifo


def wait_for_hanging_fetch(fifo: Path, timeout_s: float = 10.0) -> int:
    """Wait until an upload-pack is stuck opening ``fifo``; return a write end (closing it releases the fetch)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            if error.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def release_fetches(fifo: Path, write_end: int) -> None:
    # Unlink first: git opens alternates again later (pack-objects), and must find no file then.
    fifo.unlink()
    os.close(write_end)  # the reader already holding the FIFO sees an empty alternates file


def fetch_is_hanging(fifo: Path) -> bool:
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        return True
    except OSError as error:
        if error.errno == errno.ENXIO:
            return False
        raise


def _clone_in_child(url: str, sha: str, cache: str, results) -> None:
    try:
        results.put(clone_at_commit(url, sha, cache, allow_local=True, timeout_s=30))
    except Exception as error:  # reported to the parent, which fails the test with it
        results.put(repr(error))


# --- URL rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "https://github.com/owner/repo",
        "https://github.com/owner/repo.git",
        "https://github.com/owner/repo/",
        "https://github.com/owner/repo.git/",
        "https://github.com/Owner/Repo",
        "HTTPS://GitHub.com/OWNER/REPO.git",
    ],
)
def test_github_urls_normalize_to_one_key(url):
    assert normalize_fork_url(url) == "https://github.com/owner/repo"


@pytest.mark.parametrize(
    "url, canonical",
    [
        ("https://github.com/a/b", "https://github.com/a/b"),
        ("https://github.com/a-b-c/flash-linear-attention", "https://github.com/a-b-c/flash-linear-attention"),
        ("https://github.com/" + "x" * 39 + "/r", "https://github.com/" + "x" * 39 + "/r"),
        ("https://github.com/o/" + "r" * 100, "https://github.com/o/" + "r" * 100),
        ("https://github.com/o/my_repo.v2", "https://github.com/o/my_repo.v2"),
        ("https://github.com/o/.hidden", "https://github.com/o/.hidden"),
    ],
)
def test_github_names_as_github_allows_them(url, canonical):
    assert normalize_fork_url(url) == canonical


@pytest.mark.parametrize(
    "url, problem",
    [
        ("", "empty"),
        ("https://gitlab.com/owner/repo", "host must be github.com"),
        ("https://github.com.evil.io/owner/repo", "host must be github.com"),
        ("https://api.github.com/owner/repo", "host must be github.com"),
        # A lying API's work item aimed at the validator's own host or network, or its cloud's metadata.
        ("https://127.0.0.1/owner/repo", "host must be github.com"),
        ("https://2130706433/owner/repo", "host must be github.com"),
        ("https://localhost/owner/repo", "host must be github.com"),
        ("https://169.254.169.254/latest/meta-data", "host must be github.com"),
        ("https://metadata.google.internal/owner/repo", "host must be github.com"),
        ("https://[::1]/owner/repo", "port"),
        ("http://127.0.0.1:8080/owner/repo", "https"),
        ("http://github.com/owner/repo", "https"),
        ("ftp://github.com/owner/repo", "scheme 'ftp'"),
        ("ssh://git@github.com/owner/repo.git", "SSH"),
        ("git@github.com:owner/repo.git", "SSH"),
        ("github.com/owner/repo", "must start with https://github.com/"),
        ("https://github.com:443/owner/repo", "port"),
        ("https://github.com/owner/repo?ref=main", "query string"),
        ("https://github.com/owner/repo?", "query string"),
        ("https://github.com/owner/repo#main", "fragment"),
        ("https://github.com/owner/../etc/passwd", "'..'"),
        ("https://github.com/owner/repo/..", "'..'"),
        ("https://github.com/owner/%2e%2e", "repository name"),
        ("https://github.com/owner", "/OWNER/REPO"),
        ("https://github.com/owner/repo/tree/main", "/OWNER/REPO"),
        ("https://github.com//owner/repo", "/OWNER/REPO"),
        ("https://github.com/owner/repo//", "/OWNER/REPO"),
        ("https://github.com/-owner/repo", "GitHub owner"),
        ("https://github.com/owner-/repo", "GitHub owner"),
        ("https://github.com/own--er/repo", "GitHub owner"),
        ("https://github.com/own_er/repo", "GitHub owner"),
        ("https://github.com/" + "x" * 40 + "/repo", "GitHub owner"),
        ("https://github.com/owner/" + "r" * 101, "repository name"),
        ("https://github.com/owner/.", "repository name"),
        ("https://github.com/owner/.git", "repository name"),
        ("https://github.com/owner/re$po", "repository name"),
        ("https://github.com/owner/re\\po", "repository name"),
        ("-upload-pack=touch /tmp/pwned", "whitespace"),
        ("--upload-pack=evil", "command-line option"),
        ("-ohttps://github.com/owner/repo", "command-line option"),
        (" https://github.com/owner/repo", "whitespace"),
        ("https://github.com/owner/repo\n", "whitespace"),
        ("https://github.com/owner/re po", "whitespace"),
        ("https://github.com/owner/repo\x00", "control"),
        ("https://github.com/owner/r\u00e9po", "non-ASCII"),
        ("https://github.com/" + "a" * MAX_FORK_URL_LENGTH, "limit"),
        ("file:///srv/repo.git", "local source"),
        ("/srv/repo.git", "local source"),
        ("ext::sh -c touch% /tmp/pwned", "whitespace"),
        ("ext::sh", "must start with https://github.com/"),
    ],
)
def test_bad_urls_are_refused_with_the_reason(url, problem):
    with pytest.raises(ForkError, match=re.escape(problem)):
        normalize_fork_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://miner:ghp_secret123@github.com/owner/repo",
        "https://ghp_secret123@github.com/owner/repo",
        "https://github.com@evil.io/ghp_secret123",
    ],
)
def test_credentials_are_refused_and_not_repeated(url):
    with pytest.raises(ForkError, match="credentials") as refused:
        normalize_fork_url(url)
    assert "ghp_secret123" not in str(refused.value)


def test_credentials_are_masked_in_other_messages():
    with pytest.raises(ForkError) as refused:
        normalize_fork_url("https://miner:ghp_secret123@github.com/owner/repo ")
    assert "whitespace" in str(refused.value) and "ghp_secret123" not in str(refused.value)


@pytest.mark.parametrize("value", [None, 42, b"https://github.com/o/r"])
def test_url_must_be_a_string(value):
    with pytest.raises(ForkError, match="must be a string"):
        normalize_fork_url(value)


def test_local_sources_only_when_allowed():
    assert normalize_fork_url("/srv/forks/repo.git", allow_local=True) == "file:///srv/forks/repo.git"
    assert normalize_fork_url("file:///srv/forks/repo.git", allow_local=True) == "file:///srv/forks/repo.git"
    assert normalize_fork_url("/srv/forks/./repo.git/", allow_local=True) == "file:///srv/forks/repo.git"
    assert normalize_fork_url("https://github.com/o/r.git", allow_local=True) == "https://github.com/o/r"
    for bad, problem in [
        ("relative/repo.git", "https://github.com/"),
        ("file://host/srv/repo", "no host"),
        ("file:/srv/repo", "no host"),
        ("/srv/../etc", "'..'"),
        ("/srv/re:po", "may use only"),
        ("/srv/re%20po", "may use only"),
        ("file:///srv/repo?x", "may use only"),
    ]:
        with pytest.raises(ForkError, match=problem):
            normalize_fork_url(bad, allow_local=True)


# --- commit rule -------------------------------------------------------------------------------


def test_full_commit_ids_are_accepted_in_lowercase():
    assert validate_commit_hash(SHA) == SHA
    assert validate_commit_hash(SHA.upper()) == SHA


@pytest.mark.parametrize(
    "commit",
    [
        "",
        "main",
        "HEAD",
        "v1.0",
        SHA[:7],
        SHA[:39],
        SHA + "0",
        SHA[:-1] + "g",
        " " + SHA,
        SHA + "\n",
        "refs/heads/main",
        "-" + SHA[1:],
    ],
)
def test_branch_names_and_short_ids_are_refused(commit):
    with pytest.raises(ForkError, match="40 hexadecimal characters"):
        validate_commit_hash(commit)


def test_null_and_non_string_commits_are_refused():
    with pytest.raises(ForkError, match="null"):
        validate_commit_hash("0" * 40)
    with pytest.raises(ForkError, match="must be a string"):
        validate_commit_hash(None)


# --- clone directory names ---------------------------------------------------------------------


def test_clone_dir_is_a_hash_of_url_and_commit(tmp_path):
    one = clone_dir_for(tmp_path, "https://github.com/Owner/Repo.git", SHA)
    assert one == clone_dir_for(tmp_path, "https://github.com/owner/repo", SHA.upper())
    assert one.parent == tmp_path
    assert set(one.name) <= set("0123456789abcdef") and "owner" not in one.name and SHA not in one.name
    assert one != clone_dir_for(tmp_path, "https://github.com/owner/repo", "f" * 40)
    assert one != clone_dir_for(tmp_path, "https://github.com/owner/other", SHA)
    with pytest.raises(ForkError):
        clone_dir_for(tmp_path, "https://github.com/owner/../../etc", SHA)


# --- cloning -----------------------------------------------------------------------------------


@pytest.fixture
def source(tmp_path):
    """A fork with two commits touching the same file; the tip is the second."""
    return make_source(
        tmp_path,
        [
            {"fla/ops/quasar/chunk.py": "VERSION = 1\n", "README.md": "first\n"},
            {"fla/ops/quasar/chunk.py": "VERSION = 2\n"},
        ],
    )


def test_clone_checks_out_the_exact_commit_not_the_tip(tmp_path, source):
    bare, (first, second) = source
    cache = tmp_path / "cache"
    checkout = clone_at_commit(str(bare), first, cache, allow_local=True)
    assert checkout == Checkout(
        clone_dir_for(cache, str(bare), first, allow_local=True), f"file://{bare}", first, reused=False
    )
    assert (checkout.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert (checkout.path / ".git" / "HEAD").read_text().strip() == first  # detached at the commit
    assert git(checkout.path, "rev-list", "--count", "HEAD") == "1"  # shallow: only that commit
    assert git(checkout.path, "tag") == ""
    assert git(checkout.path, "status", "--porcelain", "--untracked-files=all") == ""

    tip = clone_at_commit(str(bare), second.upper(), cache, allow_local=True)
    assert tip.path != checkout.path and tip.commit_hash == second
    assert (tip.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 2\n"
    assert (checkout.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert leftovers(cache) == sorted([checkout.path.name, tip.path.name])


def test_complete_clone_is_reused_without_fetching(tmp_path, source):
    bare, (first, _) = source
    cache = tmp_path / "cache"
    built = clone_at_commit(str(bare), first, cache, allow_local=True)
    os.rename(bare, tmp_path / "gone.git")  # a fetch now would fail
    again = clone_at_commit(f"file://{bare}/", first, cache, allow_local=True)
    assert again == Checkout(built.path, built.fork_url, first, reused=True)
    assert (again.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"


def test_modified_checkout_is_rebuilt_not_reused(tmp_path, source):
    bare, (first, _) = source
    cache = tmp_path / "cache"
    built = clone_at_commit(str(bare), first, cache, allow_local=True)
    (built.path / "fla/ops/quasar/chunk.py").write_text("VERSION = 999\n")
    (built.path / "fla/ops/quasar/extra.py").write_text("import os\n")
    rebuilt = clone_at_commit(str(bare), first, cache, allow_local=True)
    assert rebuilt.path == built.path and not rebuilt.reused
    assert (rebuilt.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert not (rebuilt.path / "fla/ops/quasar/extra.py").exists()
    assert clone_at_commit(str(bare), first, cache, allow_local=True).reused


def test_directory_without_completion_marker_is_rebuilt(tmp_path, source):
    bare, (first, _) = source
    cache = tmp_path / "cache"
    final = clone_dir_for(cache, str(bare), first, allow_local=True)
    (final / ".git").mkdir(parents=True)
    (final / ".git" / "HEAD").write_text(first + "\n")
    (final / "half-written.py").write_text("VERS")
    checkout = clone_at_commit(str(bare), first, cache, allow_local=True)
    assert checkout.path == final and not checkout.reused
    assert not (final / "half-written.py").exists()
    assert (final / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"


def test_commit_that_does_not_exist_is_a_clear_error(tmp_path, source):
    bare, _ = source
    cache = tmp_path / "cache"
    with pytest.raises(ForkError, match=f"commit {SHA} not found in file://{bare}") as raised:
        clone_at_commit(str(bare), SHA, cache, allow_local=True)
    assert not isinstance(raised.value, CloneUnavailable)  # the fork's fault, not this host's
    assert leftovers(cache) == []


def test_object_that_is_not_a_commit_is_refused(tmp_path, source):
    bare, (first, _) = source
    blob = git(bare, "rev-parse", f"{first}:README.md")
    with pytest.raises(ForkError, match=f"object {blob} in file://{bare} is not a commit"):
        clone_at_commit(str(bare), blob, tmp_path / "cache", allow_local=True)
    assert leftovers(tmp_path / "cache") == []


def test_missing_repository_is_a_clear_error(tmp_path):
    with pytest.raises(ForkError, match="repository file:///nowhere/repo.git not found") as raised:
        clone_at_commit("/nowhere/repo.git", SHA, tmp_path / "cache", allow_local=True)
    assert not isinstance(raised.value, CloneUnavailable)
    assert leftovers(tmp_path / "cache") == []


@pytest.fixture(scope="module")
def github_certificate(tmp_path_factory) -> tuple[Path, Path, Path]:
    return make_github_certificate(tmp_path_factory.mktemp("certificates"))


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (REFUSE, "CONNECT tunnel failed, response 502"),
        (CUT, "unable to access"),
        (500, "returned error: 500"),
        (503, "returned error: 503"),
        (429, "returned error: 429"),
    ],
)
def test_a_network_failure_on_the_way_to_github_is_this_hosts_not_the_forks(tmp_path, github_certificate, mode, said):
    ca, certificate, key = github_certificate
    with GitHubProxy(mode, certificate, key) as proxy:
        env = {"https_proxy": proxy.url, "GIT_SSL_CAINFO": str(ca)}
        with pytest.raises(CloneUnavailable, match=f"could not reach https://github.com/alice/fork .*{said}"):
            clone_at_commit("https://github.com/alice/fork", SHA, tmp_path / "cache", env=env, timeout_s=30)
    assert leftovers(tmp_path / "cache") == []


def test_a_repository_github_says_is_missing_is_still_the_forks_fault(tmp_path, github_certificate):
    ca, certificate, key = github_certificate
    with GitHubProxy(404, certificate, key) as proxy:
        env = {"https_proxy": proxy.url, "GIT_SSL_CAINFO": str(ca)}
        with pytest.raises(ForkError, match="repository https://github.com/alice/fork not found") as raised:
            clone_at_commit("https://github.com/alice/fork", SHA, tmp_path / "cache", env=env, timeout_s=30)
    assert not isinstance(raised.value, CloneUnavailable)


def test_a_clone_cut_mid_transfer_is_this_hosts_and_a_commit_github_lacks_is_the_forks(tmp_path, github_certificate):
    ca, certificate, key = github_certificate
    work, (commit,) = make_source(tmp_path, [{"weights.bin": os.urandom(1 << 20)}])
    (tmp_path / "github" / "alice").mkdir(parents=True)
    shutil.copytree(work, tmp_path / "github" / "alice" / "fork")

    def clone(cut_after: int | None, wanted: str, cache: str) -> Checkout:
        with GitHubProxy(SERVE, certificate, key, root=tmp_path / "github", cut_after=cut_after) as proxy:
            env = {"https_proxy": proxy.url, "GIT_SSL_CAINFO": str(ca)}
            return clone_at_commit("https://github.com/alice/fork", wanted, tmp_path / cache, env=env, timeout_s=30)

    assert (clone(None, commit, "whole").path / "weights.bin").stat().st_size == 1 << 20
    with pytest.raises(CloneUnavailable, match="could not reach https://github.com/alice/fork"):
        clone(300_000, commit, "cut")  # the connection cut a third of the way through the pack
    assert leftovers(tmp_path / "cut") == []
    with pytest.raises(ForkError, match=f"commit {SHA} not found in https://github.com/alice/fork") as raised:
        clone(None, SHA, "absent")
    assert not isinstance(raised.value, CloneUnavailable)


@pytest.mark.parametrize(
    ("stderr", "kind"),
    [
        ("error: unable to write file fla/x.py: No space left on device\nfatal: cannot checkout", git_failures.HOST),
        ("fatal: Out of memory, malloc failed (tried to allocate 4096 bytes)", git_failures.HOST),
        ("error: cannot fork() for index-pack: Resource temporarily unavailable", git_failures.HOST),
        # A path of the fork's that names a host error is the fork's message, not this host's error.
        ("error: invalid path 'fla/No space left on device'\nfatal: cannot checkout", None),
        ("error: unable to create file no space left on device: Permission denied", None),
        ("error: invalid path 'fla/unable to access'\nfatal: cannot checkout", None),
    ],
)
def test_only_the_systems_own_error_at_the_end_of_a_line_is_a_host_fault(stderr, kind):
    assert git_failures.classify("checkout", stderr).kind == kind


_CLONE_ON_A_SMALL_DISK = """
import json, subprocess, sys
from quasar.forks import clone_at_commit
url, commit, cache = sys.argv[1:]
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", cache], check=True)
try:
    clone_at_commit(url, commit, cache, allow_local=True)
except Exception as error:
    print(json.dumps([type(error).__name__, str(error)]))
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_full_clone_folder_is_this_hosts_fault_not_the_forks(tmp_path):
    # The clone folder is a 1 MiB tmpfs, in a mount namespace of the clone's process alone.
    bare, (commit,) = make_source(tmp_path, [{"weights.bin": os.urandom(3 << 20)}])
    cache = tmp_path / "cache"
    cache.mkdir()
    command = ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", _CLONE_ON_A_SMALL_DISK]
    done = subprocess.run([*command, str(bare), commit, str(cache)], capture_output=True, text=True, timeout=60)
    kind, message = json.loads(done.stdout)
    assert kind == "CloneUnavailable", (kind, message, done.stderr)
    assert "No space left on device" in message


def test_refused_url_clones_nothing(tmp_path):
    with pytest.raises(ForkError, match="local source"):
        clone_at_commit(str(tmp_path), SHA, tmp_path / "cache")
    with pytest.raises(ForkError, match="40 hexadecimal"):
        clone_at_commit("https://github.com/owner/repo", "main", tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_hooks_never_run(tmp_path, source, monkeypatch):
    bare, (first, second) = source
    trap = tmp_path / "hook-ran"
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "post-checkout").write_text(f"#!/bin/sh\ntouch {trap}\n")
    (hooks / "post-checkout").chmod(0o755)
    template = tmp_path / "template"
    template.mkdir()
    (template / "hooks").symlink_to(hooks)
    hostile = tmp_path / "gitconfig"
    hostile.write_text(f"[core]\n\thooksPath = {hooks}\n[init]\n\ttemplateDir = {template}\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(hostile.read_text())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(hostile))
    monkeypatch.setenv("GIT_TEMPLATE_DIR", str(template))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", f"'core.hookspath'='{hooks}'")

    subprocess.run(["git", "clone", "-q", str(bare), str(tmp_path / "plain")], check=True)
    assert trap.exists(), "the trap must catch a plain git clone, or this test proves nothing"
    trap.unlink()

    clone_at_commit(str(bare), first, tmp_path / "cache", allow_local=True)
    clone_at_commit(
        str(bare),
        second,
        tmp_path / "cache",
        allow_local=True,
        env={"GIT_CONFIG_GLOBAL": str(hostile), "HOME": str(home), "GIT_TEMPLATE_DIR": str(template)},
    )
    assert not trap.exists()


def test_inherited_git_variables_do_not_redirect_the_clone(tmp_path, source, monkeypatch):
    bare, (first, _) = source
    bystander = tmp_path / "bystander"
    bystander.mkdir()
    git(bystander, "init", "-q")
    config_before = (bystander / ".git" / "config").read_text()
    monkeypatch.setenv("GIT_DIR", str(bystander / ".git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(bystander))
    monkeypatch.setenv("GIT_INDEX_FILE", str(bystander / ".git" / "index"))
    checkout = clone_at_commit(str(bare), first, tmp_path / "cache", allow_local=True)
    assert (checkout.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert (bystander / ".git" / "config").read_text() == config_before
    assert sorted(p.name for p in bystander.iterdir()) == [".git"]
    assert not (bystander / ".git" / "index").exists()


def test_extra_environment_reachesgit(tmp_path, source):
    bare, (first, _) = source
    trace = tmp_path / "trace.log"
    clone_at_commit(str(bare), first, tmp_path / "cache", allow_local=True, env={"GIT_TRACE": str(trace)})
    assert "fetch" in trace.read_text()


def test_symlinks_are_checked_out_as_plain_files(tmp_path):
    bare, (commit,) = make_source(tmp_path, [{"fla/ops/quasar/chunk.py": "->/etc/hostname"}])
    checkout = clone_at_commit(str(bare), commit, tmp_path / "cache", allow_local=True)
    chunk = checkout.path / "fla/ops/quasar/chunk.py"
    assert not chunk.is_symlink() and chunk.read_text() == "/etc/hostname"


def test_time_limit_kills_a_hanging_fetch_and_leaves_nothing(tmp_path, source):
    bare, (first, _) = source
    fifo = block_fetches(bare)
    cache = tmp_path / "cache"
    started = time.monotonic()
    with pytest.raises(ForkError, match="exceeded the time limit of 1 s while fetching"):
        clone_at_commit(str(bare), first, cache, allow_local=True, timeout_s=1)
    assert time.monotonic() - started < 5
    assert leftovers(cache) == []
    deadline = time.monotonic() + 5
    while fetch_is_hanging(fifo):  # the server side of the fetch was killed too
        assert time.monotonic() < deadline, "git upload-pack survived the time limit"
        time.sleep(0.02)


def test_size_limit_stops_a_large_fetch_and_leaves_nothing(tmp_path):
    bare, (commit,) = make_source(tmp_path, [{"weights.bin": os.urandom(1024 * 1024)}])
    cache = tmp_path / "cache"
    with pytest.raises(ForkError, match="over the size limit of 262144 bytes"):
        clone_at_commit(str(bare), commit, cache, allow_local=True, max_bytes=256 * 1024)
    assert leftovers(cache) == []


def test_size_limit_counts_checked_out_files(tmp_path):
    # 4 MiB of zeros packs to a few KiB: the fetch is small, the checkout is not.
    bare, (commit,) = make_source(tmp_path, [{"zeros.bin": bytes(4 * 1024 * 1024)}])
    cache = tmp_path / "cache"
    with pytest.raises(ForkError, match="bytes on disk .* once checked out, over the size limit of 1048576 bytes"):
        clone_at_commit(str(bare), commit, cache, allow_local=True, max_bytes=1024 * 1024)
    assert leftovers(cache) == []
    checkout = clone_at_commit(str(bare), commit, cache, allow_local=True, max_bytes=8 * 1024 * 1024)
    assert (checkout.path / "zeros.bin").stat().st_size == 4 * 1024 * 1024


def plumbed_source(tmp_path: Path, build) -> tuple[Path, str]:
    """A bare repository whose one commit's tree ``build(tree, kernel)`` makes: any tree git can
    store, whatever a file system could hold. ``tree(entries)`` writes a tree object of ``(mode,
    object id, name bytes)`` entries as git does (a loose object: thousands a second, where one
    ``git mktree`` each took 3 ms) and returns its id; ``kernel`` is a file's blob."""
    bare = tmp_path / "plumbed.git"
    git(None, "init", "-q", "--bare", str(bare))

    def plumb(*args: str, data: bytes) -> str:
        done = subprocess.run(["git", *args], cwd=bare, env=git_environment(), input=data, capture_output=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.decode().strip()

    def tree(entries: list[tuple[str, str, bytes]]) -> str:
        # git orders a tree's entries by name, a directory's as if it ended with "/".
        ordered = sorted(entries, key=lambda entry: entry[2] + (b"/" if entry[0] == "040000" else b""))
        body = b"".join(
            b"%s %s\0" % (mode.lstrip("0").encode(), name) + bytes.fromhex(oid) for mode, oid, name in ordered
        )
        data = b"tree %d\0" % len(body) + body
        oid = hashlib.sha1(data).hexdigest()
        path = bare / "objects" / oid[:2] / oid[2:]
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(zlib.compress(data))
        return oid

    kernel = plumb("hash-object", "-w", "--stdin", data=b"X = 1\n")
    top = build(tree, kernel)
    return bare, plumb("commit-tree", top, "-m", "plumbed", data=b"")


def nested(tree, leaf: str, mode: str, names: list[bytes]) -> str:
    """``leaf`` (of ``mode``) under the directories ``names``, outermost first: the outermost tree's id."""
    for name in reversed(names):
        leaf, mode = tree([(mode, leaf, name)]), "040000"
    return leaf


def test_a_tree_naming_a_billion_files_in_a_tiny_pack_is_refused_before_it_is_listed(tmp_path):
    """The attack: trees are shared, so three tree objects of 1000 names, each name the same
    subtree, list 10^9 files from a pack of 200 KB; the clone read all of ``git ls-tree``'s
    output into the validator's worker (3 GiB a minute, unbounded within its time limit)."""

    def fan_out(tree, kernel):
        level, mode = kernel, "100644"
        for _ in range(3):
            level, mode = tree([(mode, level, b"n%04d" % index) for index in range(1000)]), "040000"
        return tree(
            [("040000", level, b"junk"), ("040000", nested(tree, kernel, "100644", [b"ops", b"chunk.py"]), b"fla")]
        )

    bare, commit = plumbed_source(tmp_path, fan_out)
    cache = tmp_path / "cache"
    started = time.monotonic()
    with pytest.raises(ForkError, match=f"more than {fork_tree.MAX_TREE_ENTRIES} entries"):
        clone_at_commit(str(bare), commit, cache, allow_local=True, timeout_s=20)
    assert time.monotonic() - started < 5
    assert leftovers(cache) == []


def test_a_billion_empty_directories_are_refused_not_walked_until_the_time_limit(tmp_path):
    """The attack: the same fan-out down to the empty tree lists no file, so the entries were not
    counted while git walked 10^9 directories: the clone held the worker until its time limit."""

    def fan_out(tree, kernel):
        level = tree([])
        for _ in range(3):
            level = tree([("040000", level, b"n%04d" % index) for index in range(1000)])
        return level

    bare, commit = plumbed_source(tmp_path, fan_out)
    started = time.monotonic()
    with pytest.raises(ForkError, match=f"more than {fork_tree.MAX_TREE_ENTRIES} entries"):
        clone_at_commit(str(bare), commit, tmp_path / "cache", allow_local=True, timeout_s=5)
    assert time.monotonic() - started < 2


def test_a_path_nested_past_the_depth_limit_is_refused_not_a_crash_of_the_walks(tmp_path):
    """The attack: ``d/d/.../d/f`` 1,100 directories deep broke the clone's recursive digest of
    the checkout with RecursionError (no ForkError: the worker crashed, counted as the
    validator's own failure) and left the partial checkout in the cache for good."""
    bare, commit = plumbed_source(tmp_path, lambda tree, kernel: nested(tree, kernel, "100644", [b"d"] * 1100 + [b"f"]))
    cache = tmp_path / "cache"
    with pytest.raises(
        ForkError, match=f"is refused: a path is 33 names deep, over the limit of {fork_tree.MAX_PATH_DEPTH}"
    ):
        clone_at_commit(str(bare), commit, cache, allow_local=True)
    assert leftovers(cache) == []
    depth = fork_tree.MAX_PATH_DEPTH
    for names, refused in ((depth, True), (depth - 1, False)):
        bare, commit = plumbed_source(
            tmp_path / str(names), lambda tree, kernel: nested(tree, kernel, "100644", [b"d"] * names + [b"f"])
        )
        if refused:
            with pytest.raises(ForkError, match=f"{depth + 1} names deep, over the limit of {depth}"):
                clone_at_commit(str(bare), commit, cache, allow_local=True)
        else:
            checkout = clone_at_commit(str(bare), commit, cache, allow_local=True)
            assert (checkout.path / Path(*["d"] * names) / "f").read_text() == "X = 1\n"


@pytest.mark.parametrize(
    "name",
    [
        b"bad\xff.py",  # not UTF-8: crashed the worker's content hash (UnicodeEncodeError)
        b"x\n2099-01-01 00:00:00 INFO quasar.validator.loop: evaluation of victim: correct.py",  # a forged log line
        b"\x1b[2Jred.py",  # a terminal escape in the validator's logs
        "chunk\u202eyp.py".encode(),  # a right-to-left override: reads as another file's name
        "a\u2028b.py".encode(),  # a line separator
    ],
)
def test_a_path_that_is_not_plain_text_is_refused_before_it_reaches_reports_and_logs(tmp_path, name):
    """The attack: a kernel file's name reached the import check's reasons as it was, so a newline
    in it wrote a line of the attacker's into the validator's logs (and its report)."""
    bare, commit = plumbed_source(
        tmp_path, lambda tree, kernel: nested(tree, kernel, "100644", [b"fla", b"ops", b"quasar", name])
    )
    cache = tmp_path / "cache"
    with pytest.raises(ForkError, match="is refused: the path .* (is not UTF-8|holds a control)") as refused:
        clone_at_commit(str(bare), commit, cache, allow_local=True)
    assert "\n" not in str(refused.value) and "\x1b" not in str(refused.value)
    assert leftovers(cache) == []


def test_two_processes_cloning_the_same_key_wait_for_each_other(tmp_path, source):
    bare, (first, _) = source
    fifo = block_fetches(bare)
    cache = tmp_path / "cache"
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    children = [context.Process(target=_clone_in_child, args=(str(bare), first, str(cache), results)) for _ in range(2)]
    for child in children:
        child.start()
    try:
        write_end = wait_for_hanging_fetch(fifo)  # one child holds the lock and is fetching
        time.sleep(0.3)
        assert results.empty() and all(child.is_alive() for child in children)
        with pytest.raises(ForkError, match="waiting for another process"):
            clone_at_commit(str(bare), first, cache, allow_local=True, timeout_s=0.5)
        release_fetches(fifo, write_end)
        outcomes = [results.get(timeout=30) for _ in children]
    finally:
        for child in children:
            child.join(timeout=30)
    assert all(isinstance(outcome, Checkout) for outcome in outcomes), outcomes
    assert sorted(outcome.reused for outcome in outcomes) == [False, True]
    assert outcomes[0].path == outcomes[1].path
    assert (outcomes[0].path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert leftovers(cache) == [outcomes[0].path.name]


def test_many_clones_and_deletions_leave_nothing_behind(tmp_path):
    """A validator clones each submission's commit and deletes the checkout after evaluating it: tens
    of thousands of commits a day must not leave a lock file each (every clone lists the folder)."""
    bare, commits = make_source(tmp_path, [{"fla/ops/quasar/chunk.py": f"VERSION = {n}\n"} for n in range(12)])
    cache = tmp_path / "cache"
    for commit in commits:
        checkout = clone_at_commit(str(bare), commit, cache, allow_local=True)
        assert leftovers(cache) == [checkout.path.name]
        shutil.rmtree(checkout.path)  # as the validator's worker does once evaluated
        assert leftovers(cache) == []
    with pytest.raises(ForkError):
        clone_at_commit(str(bare), SHA, cache, allow_local=True)
    assert leftovers(cache) == []


def test_the_key_lock_excludes_while_holders_remove_its_file(tmp_path):
    """Each holder removes the lock file on release, while others wait on it: one that gets the lock
    of the removed file must not work beside one that locked the file created after."""
    path = tmp_path / "key.lock"
    limits = _Limits("file:///fork", SHA, time.monotonic() + 60, 60, 1)
    inside, overlaps, rounds = [], [], 15

    def hold() -> None:
        for _ in range(rounds):
            with _key_lock(path, limits):
                inside.append(threading.get_ident())
                if len(inside) > 1:
                    overlaps.append(tuple(inside))
                time.sleep(0.01)
                inside.remove(threading.get_ident())

    workers = [threading.Thread(target=hold) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert overlaps == [] and not path.exists()


def test_clone_interrupted_by_a_crash_is_redone(tmp_path, source):
    bare, (first, _) = source
    fifo = block_fetches(bare)
    cache = tmp_path / "cache"
    context = multiprocessing.get_context("fork")
    crashing = context.Process(target=_clone_in_child, args=(str(bare), first, str(cache), context.Queue()))
    crashing.start()
    write_end = wait_for_hanging_fetch(fifo)
    os.kill(crashing.pid, signal.SIGKILL)
    crashing.join()
    assert [name for name in leftovers(cache) if ".partial-" in name], "the crash should leave a partial clone"
    # The crashed process's git outlives it; once its fetch ends, the partial clone is abandoned.
    release_fetches(fifo, write_end)
    checkout = clone_at_commit(str(bare), first, cache, allow_local=True, timeout_s=30)
    assert not checkout.reused
    assert (checkout.path / "fla/ops/quasar/chunk.py").read_text() == "VERSION = 1\n"
    assert leftovers(cache) == [checkout.path.name]
