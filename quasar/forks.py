"""Miners' forks: URL and commit rules, and safe shallow clones at an exact commit.

A submission names a fork by URL and a full commit id. :func:`normalize_fork_url` and
:func:`validate_commit_hash` are the pure rules (the submission API uses them too);
:func:`clone_at_commit` fetches exactly that commit into a cache directory of its own.

What the clone defends against (docs/rules.md section 8):

- the URL picks the host, never a path: only ``https://github.com/OWNER/REPO`` (local sources only
  when the caller allows them), and the directory name is a hash of (URL, commit), never URL text;
- a moving target: only a full 40-hex commit is fetched and checked out, detached, and ``HEAD`` is
  verified to be exactly that commit;
- a shared scratch folder: each (URL, commit) has its own directory, built in a temporary sibling
  and renamed into place only when complete, under a per-key file lock (its holder removes it on
  release); leftovers of a crashed build are detected and rebuilt;
- git running someone else's code: no hooks, no fsmonitor, no filters, no submodules, symlinks
  checked out as plain files, only the https (and, when allowed, file) transport, and no system or
  user git configuration (git runs with an empty temporary HOME and a scrubbed environment);
- a fork too big or too slow: a size limit on the clone directory and a time limit on the whole
  call, both enforced while git runs by killing its process group; a tree of too many entries, too
  deep or with names that are not plain text (quasar/fork_tree.py), refused before checkout.

A reused checkout is verified against a digest of its files taken when it was built, so a checkout
that something modified afterwards is rebuilt rather than trusted.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import git

from quasar import fork_tree, git_failures
from quasar.errors import QuasarError
from quasar.gitenv import NO_USER_CONFIGURATION
from quasar.lock_files import same_file

logger = logging.getLogger(__name__)

GITHUB_HOST = "github.com"
MAX_FORK_URL_LENGTH = 512
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_MAX_BYTES = 500 * 1024 * 1024

_OWNER = re.compile(r"(?=[A-Za-z0-9-]{1,39}\Z)[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*\Z")
_REPO = re.compile(r"[A-Za-z0-9._-]{1,100}\Z")
_LOCAL_PATH = re.compile(r"/[A-Za-z0-9._/+@,=-]*\Z")
_COMMIT = re.compile(r"[0-9a-fA-F]{40}\Z")
_NULL_COMMIT = "0" * 40

_MARKER = "quasar-checkout.json"  # written inside .git of a complete checkout, last, before the rename
_MARKER_FORMAT = 1
_PARTIAL = ".partial-"
_POLL_S = 0.05

# Inherited variables a git process may keep: how the network is reached and which trust stores
# the operator set up. Every other inherited variable (GIT_DIR, GIT_SSL_NO_VERIFY, GIT_ASKPASS,
# tokens...) is removed. The miner's git (quasar/miner/github.py) keeps these too.
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")  # each also in upper case
_TRUST_STORE_VARIABLES = ("SSL_CERT_FILE", "SSL_CERT_DIR", "GIT_SSL_CAINFO", "GIT_SSL_CAPATH")
GIT_NETWORK_VARIABLES = frozenset({*_PROXY_VARIABLES, *map(str.upper, _PROXY_VARIABLES), *_TRUST_STORE_VARIABLES})
_KEPT_ENVIRONMENT = frozenset({"PATH", "TMPDIR", *GIT_NETWORK_VARIABLES})


class ForkError(QuasarError, ValueError):
    """A fork URL or commit is refused, or cloning it failed; the message says what was wrong."""


class CloneUnavailable(ForkError):
    """The fork could not be fetched for a fault of this host (its disk, its memory, the network to
    the fork's host), not of the fork: a validator tries it again later and blames no one."""


@dataclass(frozen=True)
class Checkout:
    """A fork checked out, detached, at exactly ``commit_hash`` in ``path``."""

    path: Path
    fork_url: str  # normalized, as from normalize_fork_url
    commit_hash: str  # lowercase 40 hex
    reused: bool  # True when an earlier complete clone was verified and returned without fetching


def _shown(value: str, limit: int = 80) -> str:
    """``value`` quoted for a message: credentials masked, long values cut."""
    value = re.sub(r"://[^/@]*@", "://***@", value)
    return repr(value if len(value) <= limit else value[:limit] + "...")


def normalize_fork_url(url: str, allow_local: bool = False) -> str:
    """Return the canonical form of a fork URL, or raise :class:`ForkError` saying what is wrong.

    Accepted: ``https://github.com/OWNER/REPO``, optionally with ``.git`` and/or one trailing
    slash; canonical form ``https://github.com/owner/repo`` (GitHub names are case-insensitive, so
    one fork spelled two ways is one key). With ``allow_local`` (the dev chain, ALLOW_LOCAL_FORKS, tests) also an
    absolute local path or a ``file:///`` URL, canonical form ``file:///abs/path``.
    Refused: other hosts and schemes, ssh, credentials, ports, query strings, fragments, ``..``,
    option-like strings, whitespace, control and non-ASCII characters, over-long URLs.
    """
    if not isinstance(url, str):
        raise ForkError(f"fork URL must be a string, got {type(url).__name__}")
    if not url:
        raise ForkError("fork URL is empty")
    if len(url) > MAX_FORK_URL_LENGTH:
        raise ForkError(f"fork URL is {len(url)} characters long; the limit is {MAX_FORK_URL_LENGTH}")
    if any(ch.isspace() for ch in url):
        raise ForkError(f"fork URL {_shown(url)} contains whitespace")
    if not url.isascii() or not url.isprintable():
        raise ForkError(f"fork URL {_shown(url)} contains a control or non-ASCII character")
    if url.startswith("-"):
        raise ForkError(f"fork URL {_shown(url)} looks like a command-line option")
    if ".." in url:
        raise ForkError(f"fork URL {_shown(url)} contains '..'")
    if url.startswith("/") or url.lower().startswith("file:"):
        return _normalize_local(url, allow_local)
    return _normalize_github(url)


def _normalize_local(url: str, allow_local: bool) -> str:
    if not allow_local:
        raise ForkError(
            f"fork URL {_shown(url)} is a local source (a path or file:// URL); local sources "
            "are allowed only on the dev chain (or with ALLOW_LOCAL_FORKS), otherwise use "
            "https://github.com/OWNER/REPO"
        )
    if url.lower().startswith("file:"):
        if not url.startswith("file:///"):
            raise ForkError(f"local fork URL {_shown(url)} must be file:///ABSOLUTE/PATH (no host)")
        path = url[len("file://") :]
    else:
        path = url
    if not _LOCAL_PATH.match(path):
        raise ForkError(f"local fork path {_shown(path)} may use only letters, digits and . _ / + @ , = -")
    path = os.path.normpath(path)
    if path.startswith("//"):  # POSIX keeps a leading double slash; it means the same directory
        path = "/" + path.lstrip("/")
    return "file://" + path


def _normalize_github(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        if re.match(r"[^/]*@[^/]*:", url):
            raise ForkError(f"fork URL {_shown(url)} is an SSH address; use https://github.com/OWNER/REPO")
        raise ForkError(f"fork URL {_shown(url)} must start with https://github.com/")
    scheme = scheme.lower()
    if scheme == "http":
        raise ForkError(f"fork URL {_shown(url)} must use https://, not http://")
    if scheme != "https":
        kind = "an SSH URL" if scheme in ("ssh", "git+ssh", "ssh+git") else f"scheme {scheme!r}"
        raise ForkError(f"fork URL uses {kind}; use https://github.com/OWNER/REPO")
    host, slash, path = rest.partition("/")
    if "@" in host:
        # The URL is not repeated: it holds a secret.
        raise ForkError("fork URL must not contain credentials (user:password@); use a public https URL")
    if "?" in rest:
        raise ForkError(f"fork URL {_shown(url)} must not have a query string ('?...')")
    if "#" in rest:
        raise ForkError(f"fork URL {_shown(url)} must not have a fragment ('#...')")
    if ":" in host:
        raise ForkError(f"fork URL {_shown(url)} must not name a port")
    if host.lower() != GITHUB_HOST:
        raise ForkError(f"fork URL host must be {GITHUB_HOST}, got {_shown(host)}")
    if path.endswith("/"):
        path = path[:-1]
    parts = path.split("/") if slash else []
    if len(parts) != 2:
        raise ForkError(f"fork URL path must be /OWNER/REPO, got {_shown('/' + path)}")
    owner, repo = parts
    if repo.endswith(".git"):
        repo = repo[: -len(".git")]
    if not _OWNER.match(owner):
        raise ForkError(
            f"GitHub owner {_shown(owner)} is invalid: 1-39 letters, digits or single hyphens, "
            "not starting or ending with a hyphen"
        )
    if not _REPO.match(repo) or repo in (".", ".."):
        raise ForkError(f"GitHub repository name {_shown(repo)} is invalid: 1-100 letters, digits, '.', '_' or '-'")
    return f"https://{GITHUB_HOST}/{owner.lower()}/{repo.lower()}"


def validate_commit_hash(commit: str) -> str:
    """Return the commit id in lowercase, or raise :class:`ForkError`: it must be a full 40-hex id.

    Branch names, tags and short ids are refused: they can point somewhere else tomorrow.
    """
    if not isinstance(commit, str):
        raise ForkError(f"commit hash must be a string, got {type(commit).__name__}")
    if not _COMMIT.match(commit):
        raise ForkError(
            f"commit hash must be a full commit id of 40 hexadecimal characters (not a branch "
            f"name or a short id), got {_shown(commit)}"
        )
    commit = commit.lower()
    if commit == _NULL_COMMIT:
        raise ForkError("commit hash is the null id (all zeros), not a commit")
    return commit


def _cache_key(fork_url: str, commit_hash: str) -> str:
    return hashlib.sha256(f"{fork_url}\n{commit_hash}".encode()).hexdigest()[:40]


def clone_dir_for(
    cache_root: str | os.PathLike[str], fork_url: str, commit_hash: str, *, allow_local: bool = False
) -> Path:
    """The directory under ``cache_root`` that holds ``fork_url`` checked out at ``commit_hash``.

    Its name is a hash of the normalized URL and commit, so two spellings of one fork share it.
    """
    url = normalize_fork_url(fork_url, allow_local)
    return Path(cache_root) / _cache_key(url, validate_commit_hash(commit_hash))


def clone_at_commit(
    fork_url: str,
    commit_hash: str,
    cache_root: str | os.PathLike[str],
    *,
    allow_local: bool = False,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    env: Mapping[str, str] | None = None,
) -> Checkout:
    """Check out ``fork_url`` at exactly ``commit_hash`` under ``cache_root`` and return where.

    Fetches only that commit (depth 1, no tags, no submodules) and checks it out detached; a
    complete earlier checkout of the same (URL, commit) is verified and reused without fetching.
    ``timeout_s`` bounds the whole call, waiting for another process's clone of the same key
    included; ``max_bytes`` bounds the clone directory (git objects plus checked-out files).
    ``env`` adds environment variables for git (a proxy, a CA bundle); it cannot undo the
    isolation settings. Raises :class:`ForkError` on a refused URL or commit, a missing repository
    or commit, a time or size limit, or any git failure; :class:`CloneUnavailable` (a ForkError)
    where git said the fault was this host's (its disk or memory) or the network's, and ``OSError``
    where this process cannot write ``cache_root``. Nothing is left behind on failure.

    The cache is trusted storage: hand untrusted code a copy or a read-only mount, never the path.
    """
    url = normalize_fork_url(fork_url, allow_local)
    commit = validate_commit_hash(commit_hash)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, got {max_bytes}")
    limits = _Limits(url, commit, time.monotonic() + timeout_s, timeout_s, max_bytes)
    root = Path(cache_root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / _cache_key(url, commit)
    with _key_lock(_lock_path(final), limits) as lock_fd:
        if _is_complete(final, url, commit):
            logger.debug("reusing checkout of %s at %s in %s", url, commit, final)
            return Checkout(final, url, commit, reused=True)
        if final.exists() or final.is_symlink():
            logger.warning("discarding incomplete or modified checkout %s of %s at %s", final, url, commit)
            _remove(final)
        for stale in _partials(final):
            logger.warning("removing %s, left by an interrupted clone", stale)
            _remove(stale)
        started = time.monotonic()
        # The checkout and git's empty HOME live in one partial directory, so a crash leaves one
        # thing to clean up, found by name under the lock.
        partial = Path(tempfile.mkdtemp(prefix=final.name + _PARTIAL, dir=root))
        try:
            work, home = partial / "checkout", partial / "home"
            work.mkdir()
            home.mkdir()
            _build(work, home, limits, allow_local, env or {}, lock_fd)
            os.chmod(work, 0o755)
            os.rename(work, final)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    logger.info("cloned %s at %s into %s in %.1f s", url, commit, final, time.monotonic() - started)
    return Checkout(final, url, commit, reused=False)


@dataclass(frozen=True)
class _Limits:
    url: str
    commit: str
    deadline: float  # time.monotonic() value
    timeout_s: float
    max_bytes: int

    def check_time(self, step: str) -> None:
        if time.monotonic() >= self.deadline:
            raise ForkError(
                f"cloning {self.url} at {self.commit} exceeded the time limit of {self.timeout_s:g} s while {step}"
            )

    def size_error(self, size: int, when: str) -> ForkError:
        return ForkError(
            f"{self.url} at {self.commit} takes {size} bytes on disk (git objects and files) "
            f"{when}, over the size limit of {self.max_bytes} bytes"
        )


@contextmanager
def _key_lock(path: Path, limits: _Limits) -> Iterator[int]:
    """Hold an exclusive flock on ``path``; the fd is returned so git children can hold it too.

    The holder removes ``path`` before it lets go, so a busy cache keeps no lock file per commit it
    ever cloned. A process that was waiting meanwhile then holds the lock of a file no longer there:
    it sees that (the inode at ``path`` is not its own) and locks the current file instead, so two
    holders never overlap. A holder that crashes leaves its file, which the next holder removes."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    limits.check_time("waiting for another process cloning the same fork and commit")
                    time.sleep(_POLL_S)
            if same_file(path, fd):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
    try:
        yield fd
    finally:
        path.unlink(missing_ok=True)
        os.close(fd)  # releases the lock once no git child holds the descriptor either


def _build(
    work: Path, home: Path, limits: _Limits, allow_local: bool, extra_env: Mapping[str, str], lock_fd: int
) -> None:
    repo = _IsolatedGit(work, home, limits, allow_local, extra_env, lock_fd)
    repo.run("init", "--quiet", "--template=", step="creating the repository")
    repo.run("remote", "add", "origin", limits.url, step="adding the remote")
    repo.run(
        "fetch",
        "--quiet",
        "--depth=1",
        "--no-tags",
        "--no-recurse-submodules",
        "origin",
        limits.commit,
        step="fetching",
    )
    if (
        repo.run_status("rev-parse", "--verify", "--quiet", f"{limits.commit}^{{commit}}", step="checking the object")[
            0
        ]
        != 0
    ):
        raise ForkError(f"object {limits.commit} in {limits.url} is not a commit")
    needed = _disk_usage(work) + repo.tree_bytes(limits.commit)
    if needed > limits.max_bytes:
        raise limits.size_error(needed, "once checked out")
    repo.run("checkout", "--quiet", "--detach", limits.commit, step="checking out")
    head = (work / ".git" / "HEAD").read_text().strip()
    if head != limits.commit:
        raise ForkError(f"checkout of {limits.url} at {limits.commit} ended at HEAD {_shown(head)}")
    marker = {
        "format": _MARKER_FORMAT,
        "fork_url": limits.url,
        "commit_hash": limits.commit,
        "files_sha256": _files_digest(work),
    }
    with open(work / ".git" / _MARKER, "w") as out:
        json.dump(marker, out)
        out.flush()
        os.fsync(out.fileno())


class _IsolatedGit:
    """Runs git in one new repository: scrubbed environment, no user or system config, time and size limits."""

    def __init__(
        self, work: Path, home: Path, limits: _Limits, allow_local: bool, extra_env: Mapping[str, str], lock_fd: int
    ):
        self._work = work
        self._limits = limits
        self._lock_fd = lock_fd
        self._git = git.Git(work)
        env = {name: value for name, value in os.environ.items() if name in _KEPT_ENVIRONMENT}
        env.update(extra_env)
        env.update(
            {
                "HOME": str(home),
                "XDG_CONFIG_HOME": str(home),
                **NO_USER_CONFIGURATION,
                "GIT_CONFIG_SYSTEM": os.devnull,
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_NO_REPLACE_OBJECTS": "1",
                "GIT_DIR": str(work / ".git"),
                "GIT_WORK_TREE": str(work),
            }
        )
        self._env = env
        # GitPython starts git with os.environ plus our variables; `env -u` removes the rest.
        unset = [arg for name in os.environ if name not in env for arg in ("-u", name)]
        protocols = ["-c", "protocol.allow=never", "-c", "protocol.https.allow=always"]
        if allow_local:
            protocols += ["-c", "protocol.file.allow=always"]
        self._prefix = [
            shutil.which("env") or "/usr/bin/env",
            *unset,
            git.Git.GIT_PYTHON_GIT_EXECUTABLE,
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.symlinks=false",
            "-c",
            "submodule.recurse=false",
            "-c",
            "transfer.fsckObjects=true",
            "-c",
            "credential.helper=",
            "-c",
            "gc.auto=0",
            "-c",
            "maintenance.auto=false",
            "-c",
            "advice.detachedHead=false",
            *protocols,
        ]

    def run(self, *args: str, step: str) -> str:
        """Run ``git ARGS`` and return its stdout; a non-zero exit raises :class:`ForkError`."""
        returncode, out, err = self.run_status(*args, step=step)
        if returncode != 0:
            raise self._failure(args[0], err)
        return out

    def run_status(self, *args: str, step: str) -> tuple[int, str, str]:
        """Run ``git ARGS``; return exit status, stdout, stderr. Past the time or size limit its
        process group is killed and :class:`ForkError` raised."""
        self._limits.check_time(step)
        handle = self._git.execute(
            [*self._prefix, *args], as_process=True, env=self._env, start_new_session=True, pass_fds=(self._lock_fd,)
        )
        proc = handle.proc  # `handle` must stay referenced: when collected, GitPython terminates git
        if proc is None:
            raise CloneUnavailable(f"git {args[0]} did not start")
        try:
            while True:
                remaining = self._limits.deadline - time.monotonic()
                try:
                    out, err = proc.communicate(timeout=max(0.0, min(0.1, remaining)))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() >= self._limits.deadline:
                        _kill_group(proc)
                        self._limits.check_time(step)
                    size = _disk_usage(self._work)
                    if size > self._limits.max_bytes:
                        _kill_group(proc)
                        raise self._limits.size_error(size, f"while {step}") from None
        finally:
            if proc.poll() is None:
                _kill_group(proc)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def tree_bytes(self, commit: str) -> int:
        """The size of ``commit``'s files, once its tree's shape passed quasar/fork_tree.py's rules."""
        command = [*map(str, self._prefix), "ls-tree", "-r", "-t", "-l", "-z", "--full-tree", commit]
        failure = functools.partial(self._failure, "ls-tree")
        try:
            return fork_tree.listed_bytes(command, self._env, self._work, self._limits.check_time, failure)
        except fork_tree.TreeRefused as error:
            raise ForkError(f"{self._limits.url} at {self._limits.commit} is refused: {error}") from None

    def _failure(self, command: str, stderr: str) -> ForkError:
        url, commit = self._limits.url, self._limits.commit
        failure = git_failures.classify(command, stderr)
        if failure.kind == git_failures.HOST:
            return CloneUnavailable(f"git {command} failed on this host for {url} at {commit}: {failure.detail}")
        if failure.kind == git_failures.NETWORK:
            return CloneUnavailable(f"git {command} could not reach {url} for {commit}: {failure.detail}")
        if failure.kind == git_failures.COMMIT_MISSING:
            return ForkError(f"commit {commit} not found in {url}")
        if failure.kind == git_failures.REPO_MISSING:
            return ForkError(f"repository {url} not found, not public, or not reachable")
        return ForkError(f"git {command} failed for {url} at {commit}: {failure.detail}")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


def _disk_usage(root: Path) -> int:
    """Apparent size of the regular files under ``root``; links are not followed."""
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            try:
                info = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # git renames temporary files while it runs
                continue
            if stat.S_ISREG(info.st_mode):
                total += info.st_size
    return total


def _files_digest(root: Path) -> str:
    """sha256 over every entry under ``root`` except ``.git``: path, kind, executable bit, content."""
    digest = hashlib.sha256()

    def visit(directory: Path, relative: str) -> None:
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
        for entry in entries:
            name = f"{relative}{entry.name}"
            if name == ".git":
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                digest.update(b"d\0" + os.fsencode(name) + b"\0")
                visit(Path(entry.path), name + "/")
            elif stat.S_ISREG(info.st_mode):
                executable = b"x" if info.st_mode & stat.S_IXUSR else b"-"
                content = hashlib.sha256()
                with open(entry.path, "rb") as data:
                    for block in iter(lambda: data.read(1 << 20), b""):
                        content.update(block)
                digest.update(b"f" + executable + b"\0" + os.fsencode(name) + b"\0" + content.digest())
            else:
                target = os.fsencode(os.readlink(entry.path)) if stat.S_ISLNK(info.st_mode) else b""
                digest.update(b"o\0" + os.fsencode(name) + b"\0" + target + b"\0")

    visit(root, "")
    return digest.hexdigest()


def _is_complete(path: Path, fork_url: str, commit_hash: str) -> bool:
    """True when ``path`` is a checkout this module finished and its files are unchanged since."""
    if path.is_symlink() or not path.is_dir():
        return False
    try:
        marker = json.loads((path / ".git" / _MARKER).read_text())
        head = (path / ".git" / "HEAD").read_text().strip()
    except (OSError, ValueError):
        return False
    expected = {"format": _MARKER_FORMAT, "fork_url": fork_url, "commit_hash": commit_hash}
    if not isinstance(marker, dict) or any(marker.get(key) != value for key, value in expected.items()):
        return False
    return head == commit_hash and marker.get("files_sha256") == _files_digest(path)


def remove_checkout(checkout: Path) -> None:
    """Remove all a clone into ``checkout`` (a :func:`clone_dir_for` path) may leave: the checkout,
    an interrupted clone's partial directories, a killed holder's lock file. Only once no process
    clones or uses that key: a worker killed mid-evaluation leaves them otherwise."""
    for path in (checkout, *_partials(checkout), _lock_path(checkout)):
        _remove(path)


def _lock_path(checkout: Path) -> Path:
    """The lock file of the key whose checkout is ``checkout`` (see :func:`_key_lock`)."""
    return checkout.with_name(checkout.name + ".lock")


def _partials(checkout: Path) -> list[Path]:
    """The partial directories that interrupted clones into ``checkout`` left."""
    return list(checkout.parent.glob(checkout.name + _PARTIAL + "*"))


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
