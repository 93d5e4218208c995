"""GitHub for the miner: its fork through GitHub's REST API, and git with the token given per command.

The fork: ``GET /repos/{user}/{name}`` says whether the user already has it; when not,
``POST /repos/{upstream}/forks`` asks GitHub to create it, and the client polls until the fork
can be read (GitHub creates forks asynchronously), for a bounded time.

Where the token goes, and nowhere else: the ``Authorization`` header of the REST calls, and the
environment of one git process at a time (clone, fetch, push), from which a ``GIT_ASKPASS``
helper script that holds no secret answers git's password prompt. It is never part of a remote
URL, ``.git/config``, a command line, a credential store (``credential.helper`` is emptied for
every git call) or a log line, and it never reaches benchmarked code (the evaluation harness
starts that with a scrubbed environment). Git follows no redirect: the helper answers whatever host
asks, and a remote's redirect to another host had git send it the token.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from quasar.errors import QuasarError
from quasar.forks import GIT_NETWORK_VARIABLES
from quasar.gitenv import NO_USER_CONFIGURATION, identity
from quasar.miner.files import replace_file

logger = logging.getLogger(__name__)

API_VERSION = "2022-11-28"
DEFAULT_FORK_WAIT_S = 300.0
DEFAULT_POLL_S = 3.0
DEFAULT_GIT_TIMEOUT_S = 900.0

# Variables a git process may inherit: the user's own (git needs a home) and how the network is
# reached (quasar/forks.py's list). Every other variable (tokens, GIT_DIR, GIT_SSL_NO_VERIFY, an
# inherited GIT_ASKPASS...) is left out.
_KEPT_ENVIRONMENT = frozenset({"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", *GIT_NETWORK_VARIABLES})
_USERNAME_VARIABLE = "QUASAR_GIT_USERNAME"
_TOKEN_VARIABLE = "QUASAR_GIT_TOKEN"
ASKPASS_SCRIPT = f"""#!/bin/sh
# QUASAR miner: answers git's credential prompts from variables set for one git process only.
# This file holds no secret.
case "$1" in
    Username*) printf '%s\\n' "${_USERNAME_VARIABLE}" ;;
    *) printf '%s\\n' "${_TOKEN_VARIABLE}" ;;
esac
"""
# Matched in git's lowered stderr, which also holds URLs and commit hashes: no bare numbers.
_AUTH_FAILED = (
    "authentication failed",
    "invalid username or password",
    "could not read username",
    "could not read password",
    "terminal prompts disabled",
    "returned error: 403",
    "permission to",
)
_REDIRECTED = re.compile(r"returned error: 30[1278]\b")
_NOT_FOUND = ("repository not found", "not found", "does not appear to be a git repository")


class GitHubError(QuasarError, RuntimeError):
    """The GitHub API refused or failed a request; the message says what to do about it."""


class GitError(QuasarError, RuntimeError):
    """A git command failed; the message names the command and git's last line of explanation."""


@dataclass(frozen=True)
class Repository:
    """A GitHub repository as the API describes it."""

    full_name: str  # OWNER/NAME
    default_branch: str
    is_fork: bool
    parent: str | None  # OWNER/NAME of the repository it was forked from

    @property
    def owner(self) -> str:
        return self.full_name.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.full_name.split("/", 1)[1]


@dataclass(frozen=True)
class ForkResult:
    """The user's fork of the upstream repository, and whether this call created it."""

    repository: Repository
    created: bool


class GitHubClient:
    """GitHub's REST API at ``api_url`` (https://api.github.com, or a stand-in) as ``token``'s user."""

    def __init__(
        self,
        api_url: str,
        token: str,
        timeout_s: float = 30.0,
        http: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        if not token:
            raise GitHubError("GITHUB_TOKEN is not set: the miner needs a GitHub token to fork and push")
        self.api_url = api_url.rstrip("/")
        self._token = token
        self._http = http or httpx.Client(timeout=timeout_s)
        self._sleep = sleep

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str) -> httpx.Response:
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": API_VERSION,
            "User-Agent": "quasar-miner",
        }
        try:
            response = self._http.request(
                method, self.api_url + path, headers=headers, json={} if method == "POST" else None
            )
        except httpx.HTTPError as error:
            raise GitHubError(f"cannot reach the GitHub API at {self.api_url}: {error}") from None
        if response.status_code == 401:
            raise GitHubError(
                f"GitHub rejected GITHUB_TOKEN (401 {_message(response)}): use a classic token with "
                "the public_repo scope, or a fine-grained one that may create forks and write contents"
            )
        if response.status_code == 403:
            raise GitHubError(
                f"GitHub refused {method} {path} (403 {_message(response)}): the token lacks a "
                "permission, or the API rate limit is spent (wait and retry)"
            )
        return response

    def repository(self, full_name: str) -> Repository | None:
        """The repository ``OWNER/NAME``, or None when it does not exist (or is invisible to the token)."""
        response = self._request("GET", f"/repos/{full_name}")
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise GitHubError(f"GET /repos/{full_name} answered {response.status_code}: {_message(response)}")
        return _repository(response, f"GET /repos/{full_name}")

    def ensure_fork(
        self, username: str, upstream: str, wait_s: float = DEFAULT_FORK_WAIT_S, poll_s: float = DEFAULT_POLL_S
    ) -> ForkResult:
        """``username``'s fork of ``upstream`` (OWNER/NAME): the existing one, or a new one.

        A repository of the upstream's name that is not a fork of it is used as it is, with a
        warning (a miner may have pushed a copy instead of forking). Waits at most ``wait_s``
        for a new fork to become readable.
        """
        name = upstream.split("/", 1)[1]
        existing = self.repository(f"{username}/{name}")
        if existing is not None:
            if not existing.is_fork or (existing.parent or "").lower() != upstream.lower():
                logger.warning(
                    "%s exists but is not a fork of %s; using it as the miner's fork", existing.full_name, upstream
                )
            logger.info("using the existing fork %s (branch %s)", existing.full_name, existing.default_branch)
            return ForkResult(existing, created=False)
        response = self._request("POST", f"/repos/{upstream}/forks")
        if response.status_code == 404:
            raise GitHubError(f"cannot fork {upstream}: it does not exist or the token cannot see it")
        if response.status_code not in (200, 202):
            raise GitHubError(f"forking {upstream} failed ({response.status_code}): {_message(response)}")
        fork = _repository(response, f"POST /repos/{upstream}/forks")
        if fork.owner.lower() != username.lower():
            raise GitHubError(
                f"GitHub forked {upstream} into {fork.owner}'s account, but GITHUB_USERNAME is "
                f"{username}: set GITHUB_USERNAME to the token's account"
            )
        logger.info("asked GitHub to fork %s into %s; waiting for it", upstream, fork.full_name)
        deadline = time.monotonic() + wait_s
        while True:
            ready = self.repository(fork.full_name)
            if ready is not None:
                logger.info("fork %s is ready (branch %s)", ready.full_name, ready.default_branch)
                return ForkResult(ready, created=True)
            if time.monotonic() + poll_s > deadline:
                raise GitHubError(
                    f"GitHub did not finish creating the fork {fork.full_name} within {wait_s:g} s; "
                    "start the miner again in a few minutes"
                )
            self._sleep(poll_s)


def _message(response: httpx.Response) -> str:
    try:
        message = response.json().get("message")
    except (ValueError, AttributeError, RecursionError):  # not JSON, not an object, nested too deep
        message = None
    text = message if isinstance(message, str) else response.text
    return text.strip()[:300] or response.reason_phrase


def _repository(response: httpx.Response, what: str) -> Repository:
    try:
        data = response.json()
        full_name = data["full_name"]
        default_branch = data.get("default_branch") or "main"
        parent = data.get("parent") or data.get("source")
        parent_name = parent.get("full_name") if isinstance(parent, dict) else None
        if not (isinstance(full_name, str) and re.fullmatch(r"[A-Za-z0-9-]+/[A-Za-z0-9._-]+", full_name)):
            raise ValueError(f"full_name {full_name!r}")
        if not (isinstance(default_branch, str) and re.fullmatch(r"[A-Za-z0-9._/-]{1,200}", default_branch)):
            raise ValueError(f"default_branch {default_branch!r}")
        return Repository(full_name, default_branch, bool(data.get("fork")), parent_name)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise GitHubError(f"{what}: the GitHub API answered something that is not a repository ({error})") from None


def write_askpass(path: Path) -> Path:
    """Write the ``GIT_ASKPASS`` helper (no secret in it) to ``path``, executable by its owner only."""
    replace_file(path, ASKPASS_SCRIPT, "write git's credential helper", mode=0o700)
    return path


@dataclass(eq=False)
class Git:
    """Runs git for the miner's own workspace.

    No system or global git configuration (no user hooks, credential helpers or signing), hooks
    off, the credential store emptied, prompts off, English messages. ``network=True`` calls
    (clone, fetch, push) get the token through the askpass helper for that one process.
    """

    askpass: Path
    username: str
    token: str = field(repr=False)  # never in a repr, a log line or an error
    author_name: str
    author_email: str
    timeout_s: float = DEFAULT_GIT_TIMEOUT_S

    def _environment(self, network: bool) -> dict[str, str]:
        env = {name: value for name, value in os.environ.items() if name in _KEPT_ENVIRONMENT}
        env.update(
            {
                "LANG": "C",
                "LC_ALL": "C",
                "GIT_TERMINAL_PROMPT": "0",
                **NO_USER_CONFIGURATION,
                **identity(self.author_name, self.author_email),
            }
        )
        if network and self.token:
            env.update(
                {"GIT_ASKPASS": str(self.askpass), _USERNAME_VARIABLE: self.username, _TOKEN_VARIABLE: self.token}
            )
        return env

    def run(self, *args: str, cwd: Path, network: bool = False, check: bool = True) -> subprocess.CompletedProcess:
        """Run ``git ARGS`` in ``cwd``; a failure (when ``check``) raises :class:`GitError`."""
        command = [
            "git",
            "-c",
            "credential.helper=",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "commit.gpgSign=false",
            "-c",
            "protocol.file.allow=always",
            "-c",
            # A remote's redirect to another host would get the token: the askpass helper answers any host.
            "http.followRedirects=false",
            *args,
        ]
        try:
            result = subprocess.run(
                command,
                cwd=cwd,
                env=self._environment(network),
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise GitError(f"git {args[0]} did not finish within {self.timeout_s:g} s") from None
        except FileNotFoundError:
            raise GitError("git is not installed (the miner needs it to clone and push its fork)") from None
        if check and result.returncode != 0:
            raise GitError(self._explain(args, result.stderr or result.stdout))
        return result

    def output(self, *args: str, cwd: Path) -> str:
        """Stdout of ``git ARGS`` without the trailing newline."""
        return self.run(*args, cwd=cwd).stdout.strip()

    def _explain(self, args: tuple[str, ...], stderr: str) -> str:
        text = stderr.replace(self.token, "***") if self.token else stderr
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("hint:")]
        detail = lines[-1] if lines else "no message"
        lowered = text.lower()
        command = args[0]
        if command == "push" and ("[rejected]" in text or "non-fast-forward" in lowered):
            return (
                "git push was rejected: the fork's branch has commits this workspace lacks (pushed from "
                "elsewhere); the miner never force-pushes: merge them into the workspace or reset the fork"
            )
        if command in ("clone", "fetch", "push") and _REDIRECTED.search(lowered):
            return (
                f"git {command}: the remote answered with a redirect ({detail}), which the miner never "
                "follows (GITHUB_TOKEN would go where it points); check GIT_REMOTE_BASE and the fork's name"
            )
        if command in ("clone", "fetch", "push") and any(marker in lowered for marker in _AUTH_FAILED):
            return (
                f"git {command} was refused by the remote: authentication failed ({detail}); check that "
                "GITHUB_TOKEN is valid and may write to the fork"
            )
        if command in ("clone", "fetch") and any(marker in lowered for marker in _NOT_FOUND):
            return f"git {command}: the fork's repository was not found ({detail})"
        return f"git {' '.join(args[:2])} failed: {detail}"
