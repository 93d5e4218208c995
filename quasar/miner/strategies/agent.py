"""The agent strategy: ask a language model, through an OpenAI-compatible chat API, for kernel edits.

Each proposal is one ``POST {AGENT_API_URL}/chat/completions`` (``AGENT_MODEL``, optional bearer
``AGENT_API_KEY``): the prompt holds the rules, the math the layer must keep computing, the
recent attempts with their outcomes, and the current text of every file under
``fla/ops/quasar/``. The reply gives complete new files::

    DESCRIPTION: one line
    FILE: fla/ops/quasar/chunk.py
    ```python
    ...the whole file...
    ```

or one unified diff in a ```diff block (applied with ``git apply --recount`` to a scratch copy,
never to the checkout), and ``DELETE: path`` to remove a file. Whatever the reply says, the
candidate it becomes passes the checks of base.py (paths only under fla/ops/quasar/, no
traversal, sizes, forbidden imports) before anything is written; then it is evaluated like any
other candidate.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import httpx

from quasar import config
from quasar.cutoff import AnswerLate, AnswerRefused, exchange
from quasar.gitenv import NO_USER_CONFIGURATION
from quasar.imports import QUASAR_DIR
from quasar.miner.strategies.base import (
    ALLOWED_SUFFIXES,
    Attempt,
    Candidate,
    EditRejected,
    StrategyError,
    check_edit_path,
    printable_line,
)

MAX_PROMPT_FILE_CHARS = 200_000
# The miner guide's order of importance; the prompt shows these first (others follow by name).
PRIORITY = ("chunk.py", "fused_recurrent.py", "forward_substitution.py", "chunk_intra_token_parallel.py", "gate.py")
MAX_REPLY_CHARS = 2_000_000
# The largest answer read: the longest reply with every character escaped as \uXXXX, and its envelope.
MAX_ANSWER_BYTES = 6 * MAX_REPLY_CHARS + (1 << 16)
HISTORY_SHOWN = 10

SYSTEM_PROMPT = """You make the QuasarAttention kernels of a flash-linear-attention fork faster. The fork competes in \
QUASAR, ranked by the measured tokens/sec of the layer's forward pass (batch 1, hidden size 512, 8 heads of \
dimension 64, bfloat16 autocast on CUDA) at long sequence lengths (the target length below).

The kernels must keep computing exactly this, per head, with the state S (64 x 64) kept in float32:
  lambda_t = ||k_t||^2
  alpha_t  = (1 - exp(-beta_h * lambda_t)) / (lambda_t + 1e-8)
  S_t      = S_{t-1} + alpha_t * k_t (v_t - S_{t-1}^T k_t)^T
  o_t      = S_t^T q_t            (the state after the update; no scale, no normalisation of q or k)
Chunked form (chunk C, D = diag(alpha)): A = (I + strict_tril(D K K^T))^-1, W = A D K, U = A D V; per chunk
V' = U - W S, O = Q S + tril_incl(Q K^T) V', S <- S + K^T V'.
Every candidate is compared with a float32 reference over the whole sequence at lengths 512, 1024, 2048 and \
the target (relative error at most 2e-2, also per eighth of the sequence and per 64-token block), must give \
identical results when run twice, and is kept only if it is measurably faster.

Rules:
- Change only files under fla/ops/quasar/.
- fla/ops/quasar/chunk.py keeps, at module level: from fla.utils import autocast_custom_bwd, \
autocast_custom_fwd, autotune_cache_kwargs, check_shared_mem, input_guard.
- Never import fla.ops.gla or fla.ops.kda in any form; no exec, eval or dynamic imports.
- Keep the public functions (chunk_quasar, fused_recurrent_quasar) and their signatures.

Reply with one idea, in exactly this form:
DESCRIPTION: <one line: what you changed and why it is faster>
FILE: fla/ops/quasar/<file>
```python
<the complete new content of that file>
```
(one FILE block per changed file), or instead of FILE blocks one unified diff in a ```diff block with paths \
a/fla/ops/quasar/... and b/fla/ops/quasar/.... To delete a file, write a line DELETE: <path>."""

# Matched after markdown decoration (#, **, `) is removed from the line.
_HEADER = re.compile(r"(FILE|DELETE)\s*:\s*(\S+)", re.IGNORECASE)
_DESCRIPTION = re.compile(r"DESCRIPTION\s*:\s*(.*)", re.IGNORECASE)
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+.-]*)\s*$")


def read_kernel_files(repo: Path) -> dict[str, str]:
    """The text files under fla/ops/quasar/ a candidate may change, by repo-relative path.

    A fork may commit fla/ops/quasar (or a folder above it) as a symbolic link: read through, it
    would put files of the miner's machine into the prompt, so that is a StrategyError.
    """
    folder = Path(repo)
    for part in QUASAR_DIR.split("/"):
        folder = folder / part
        if folder.is_symlink():
            raise StrategyError(f"the fork's {folder.relative_to(repo)} is a symbolic link; its files are not read")
    base = Path(repo) / QUASAR_DIR
    files: dict[str, str] = {}
    for path in sorted(base.rglob("*")):
        if path.is_symlink() or not path.is_file() or "__pycache__" in path.parts:
            continue
        if not path.name.endswith(ALLOWED_SUFFIXES):
            continue
        try:
            files[path.relative_to(repo).as_posix()] = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return files


def build_messages(files: dict[str, str], history: Sequence[Attempt], target_seq_len: int | None) -> list[dict]:
    """The chat messages of one request: the rules, then the attempts so far and the files."""
    lines = []
    if target_seq_len:
        lines.append(f"Target sequence length: {target_seq_len:,} tokens.")
    recent = list(history)[-HISTORY_SHOWN:]
    if recent:
        lines.append("\nRecent attempts (oldest first):")
        for attempt in recent:
            figures = ""
            if attempt.measured_tokens_per_sec is not None:
                figures = f"; measured {attempt.measured_tokens_per_sec:,.0f} tokens/s"
                if attempt.best_tokens_per_sec:
                    figures += f" vs best {attempt.best_tokens_per_sec:,.0f}"
            reason = f"; {attempt.reason[:300]}" if attempt.reason else ""
            lines.append(f"- [{attempt.outcome}] {attempt.strategy}: {attempt.description}{figures}{reason}")
    lines.append("\nThe current files (the best version so far):")
    used = 0

    def importance(path: str) -> tuple[int, str]:
        name = path[len(QUASAR_DIR) + 1 :]
        return (PRIORITY.index(name) if name in PRIORITY else len(PRIORITY), path)

    for path in sorted(files, key=importance):
        text = files[path]
        if used + len(text) > MAX_PROMPT_FILE_CHARS:
            lines.append(f"\nFILE: {path} (left out: the prompt is full)")
            continue
        used += len(text)
        lines.append(f"\nFILE: {path}\n```\n{text}\n```")
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def parse_reply(reply: str) -> tuple[str, dict[str, str | None], list[str]]:
    """Split a reply into (description, full-file changes, unified diffs); raises StrategyError."""
    if len(reply) > MAX_REPLY_CHARS:
        raise StrategyError(f"the agent's reply is longer than {MAX_REPLY_CHARS:,} characters")
    description, prose = "", ""
    changes: dict[str, str | None] = {}
    diffs: list[str] = []
    pending: str | None = None
    lines = reply.splitlines()
    index = 0
    while index < len(lines):
        line = lines[index]
        index += 1
        plain = line.strip().lstrip("#").replace("**", "").replace("`", "").strip()
        header, fence, named = _HEADER.fullmatch(plain), _FENCE.match(line), _DESCRIPTION.fullmatch(plain)
        if header:
            kind, path = header.group(1).upper(), header.group(2)
            if kind == "DELETE":
                changes[path] = None
            else:
                pending = path
        elif named and not description:
            description = named.group(1).strip()
        elif fence:
            marker, language = fence.group(1), fence.group(2).lower()
            body: list[str] = []
            while index < len(lines) and lines[index].strip() != marker:
                body.append(lines[index])
                index += 1
            if index >= len(lines):
                raise StrategyError("the agent's reply has a code block that never closes")
            index += 1
            text = "\n".join(body) + "\n"
            if pending is not None:
                if pending in changes:
                    raise StrategyError(f"the agent's reply gives {pending} twice")
                changes[pending] = text
                pending = None
            elif language in ("diff", "patch") or (text.startswith(("--- ", "diff --git")) and "\n+++ " in text):
                diffs.append(text)
        elif line.strip() and not prose:
            prose = line.strip()
    if not changes and not diffs:
        raise StrategyError("the agent's reply has no FILE block and no diff")
    return description or prose, changes, diffs


def _diff_paths(diff: str) -> tuple[set[str], set[str]]:
    """Paths a unified diff reads (---) and writes (+++), without a/ b/ prefixes; /dev/null left out."""
    old: set[str] = set()
    new: set[str] = set()
    for line in diff.splitlines():
        for prefix, found in (("--- ", old), ("+++ ", new)):
            if line.startswith(prefix):
                path = line[len(prefix) :].split("\t")[0].strip()
                if path == "/dev/null":
                    continue
                if path.startswith(("a/", "b/")):
                    path = path[2:]
                found.add(check_edit_path(path))
        if line.startswith(("rename ", "copy ")) or line.startswith(("old mode", "new mode")):
            raise EditRejected("the agent's diff renames, copies or changes modes; only content edits are allowed")
    return old, new


def apply_diff(repo: Path, diff: str) -> dict[str, str | None]:
    """The files a unified diff produces from the checkout at ``repo``, as full contents.

    The diff is applied with ``git apply --recount`` in a scratch folder holding copies of the
    files it reads, so a bad diff never touches the checkout.
    """
    old, new = _diff_paths(diff)
    if not old and not new:
        raise StrategyError("the agent's diff names no file")
    try:
        encoded = diff.encode("utf-8")
    except UnicodeEncodeError:
        raise EditRejected("the agent's diff is not UTF-8 text (a lone surrogate)") from None
    with tempfile.TemporaryDirectory(prefix="quasar-agent-diff-") as scratch:
        work = Path(scratch) / "tree"
        for path in old:
            source = Path(repo) / path
            if source.is_file() and not source.is_symlink():
                (work / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, work / path)
        work.mkdir(exist_ok=True)
        patch = Path(scratch) / "edit.patch"
        patch.write_bytes(encoded)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C",
            **NO_USER_CONFIGURATION,
            "GIT_CEILING_DIRECTORIES": scratch,
            "HOME": scratch,
        }
        result = subprocess.run(
            ["git", "apply", "--recount", "--whitespace=nowarn", str(patch)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        if result.returncode != 0:
            message = (result.stderr or result.stdout).strip().splitlines()
            raise StrategyError(f"the agent's diff does not apply: {message[-1] if message else 'no message'}")
        produced: dict[str, str | None] = {}
        for path in old | new:
            produced[path] = _read_produced(work / path, path)
        return produced


def _read_produced(target: Path, path: str) -> str | None:
    """The text git apply left at ``target`` (None when it deleted it): a regular file only.

    A diff can create a symbolic link (``new file mode 120000``); read through, it would make
    any file of the miner's machine (its wallet, say) the candidate's content.
    """
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise EditRejected(f"the agent's diff makes {path} a link or a special file; only regular files are allowed")
    try:
        return target.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise EditRejected(f"the agent's diff makes {path} something other than UTF-8 text") from None


class AgentStrategy:
    """Edits from the chat model ``model`` at ``api_url`` (an OpenAI-compatible ``…/v1`` base)."""

    name = "agent"

    def __init__(
        self,
        api_url: str,
        model: str,
        api_key: str = "",
        timeout_s: float = float(config.OPTIONS_BY_KEY["agent_timeout"].default),
        temperature: float = 0.2,
        http: httpx.Client | None = None,
    ):
        if not api_url:
            raise ValueError("the agent strategy needs AGENT_API_URL")
        if not model:
            raise ValueError("the agent strategy needs AGENT_MODEL (the model name the endpoint serves)")
        self.api_url = api_url.rstrip("/")
        self.model = model
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.temperature = temperature
        self._http = http or httpx.Client()
        self.target_seq_len: int | None = None

    def close(self) -> None:
        self._http.close()

    def ask(self, messages: list[dict]) -> str:
        """One chat completion; returns the reply's text or raises StrategyError.

        The whole exchange (connecting, sending, the status line, headers and body) must end
        within ``timeout_s``, counted in all, not per read, and the answer must fit
        ``MAX_ANSWER_BYTES``, uncompressed (:func:`quasar.cutoff.exchange`); its JSON may nest no
        deeper than the parser's recursion limit.
        """
        headers: dict[str, str] = {}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        body = {"model": self.model, "messages": messages, "temperature": self.temperature}
        try:
            answer = exchange(
                self._http,
                "POST",
                f"{self.api_url}/chat/completions",
                self.timeout_s,
                MAX_ANSWER_BYTES,
                headers=headers,
                json=body,
                timeout=self.timeout_s,
            )
        except AnswerLate:
            raise StrategyError(f"the agent endpoint's answer took longer than {self.timeout_s:g}s") from None
        except AnswerRefused as refusal:
            raise StrategyError(f"the agent endpoint {refusal}") from None
        except httpx.HTTPError as error:
            raise StrategyError(f"cannot reach the agent endpoint {self.api_url}: {error}") from None
        text = answer.content.decode("utf-8", errors="replace")
        if answer.status_code >= 400:
            raise StrategyError(
                f"the agent endpoint {self.api_url} answered {answer.status_code}: {printable_line(text)[:300]}"
            )
        try:
            content = json.loads(text)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError, RecursionError):
            raise StrategyError(
                "the agent endpoint's answer is not a chat completion (no choices[0].message.content)"
            ) from None
        if not isinstance(content, str) or not content.strip():
            raise StrategyError("the agent endpoint answered an empty message")
        return content

    def propose(self, repo_path: Path, history: Sequence[Attempt]) -> Candidate:
        repo = Path(repo_path)
        files = read_kernel_files(repo)
        reply = self.ask(build_messages(files, history, self.target_seq_len))
        description, changes, diffs = parse_reply(reply)
        for diff in diffs:
            produced = apply_diff(repo, diff)
            overlap = sorted(set(produced) & set(changes))
            if overlap:
                raise StrategyError(f"the agent's reply changes {overlap[0]} both as a file and in a diff")
            changes.update(produced)
        changes = {
            path: text
            for path, text in changes.items()
            if (path in files and files[path] != text) or (path not in files and text is not None)
        }
        if not changes:
            raise StrategyError("the agent's edit changes nothing")
        candidate = Candidate(strategy=self.name, description=description, changes=changes)
        if any(attempt.key == candidate.key for attempt in history):
            raise StrategyError("the agent proposed an edit that was already tried")
        return candidate
