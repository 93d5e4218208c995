"""Stand-ins for the miner's outer boundary, as real servers on 127.0.0.1, and forks to mine on.

- GitHub: :class:`~quasar.localnet.github_standin.GitHubStandIn` (the local network's stand-in:
  fork endpoints over bare repositories, git's smart HTTP behind the token), here with the slow
  starter fork as its upstream (:func:`github_with_upstream`).
- :class:`ChatStandIn`: an OpenAI-compatible ``POST /v1/chat/completions`` answering canned replies.
- Fork builders: the starter fork made slow (to be sped up) or given a ``tuning.json``.

Imported by the other ``test_miner_*`` modules; the tests here check the stand-ins themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from quasar.localnet.github_standin import GitHubStandIn, send_json
from quasar.starter_fork import write_starter_fork
from tests.gitrepo import git

UPSTREAM = "troy12x/flash-linear-attention"
TOKEN = "ghp_standInToken0123456789abcdefQUASAR"
CHUNK_FILE = "fla/ops/quasar/chunk.py"
SLOW_MARK = "time.sleep(_STANDIN_DELAY_S)"


def bare_head(bare: Path, branch: str = "main") -> str:
    return git(None, "--git-dir", str(bare), "rev-parse", f"refs/heads/{branch}")


def bare_has(bare: Path, commit: str) -> bool:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull}
    return (
        subprocess.run(
            ["git", "--git-dir", str(bare), "cat-file", "-e", f"{commit}^{{commit}}"], env=env, capture_output=True
        ).returncode
        == 0
    )


# --- forks to mine on ---


def slow_chunk_source(source: str, delay_s: float) -> str:
    """The starter fork's chunk.py, sleeping ``delay_s`` per call and printing its environment at import."""
    source = source.replace(
        "from __future__ import annotations\n", "from __future__ import annotations\n\nimport os\nimport time\n", 1
    )
    source += (
        f"\n\n_STANDIN_DELAY_S = {delay_s!r}\n"
        "print('STANDIN-ENVIRONMENT', sorted(os.environ.items()), flush=True)\n"
        "_standin_chunk_quasar = chunk_quasar\n\n\n"
        "def chunk_quasar(*args, **kwargs):\n"
        f"    {SLOW_MARK}\n"
        "    return _standin_chunk_quasar(*args, **kwargs)\n"
    )
    return source


def fast_chunk_source(slow: str) -> str:
    """The slow chunk.py without its sleep (what the agent stand-in proposes)."""
    return slow.replace(SLOW_MARK, "pass")


def wrong_chunk_source(slow: str) -> str:
    """A fast but wrong chunk.py: each token gets the previous token's output (the harness must fail it;
    a scaled output would not do, the layer's RMSNorm undoes a scale)."""
    return slow.replace(
        f"    {SLOW_MARK}\n    return _standin_chunk_quasar(*args, **kwargs)\n",
        "    o, state = _standin_chunk_quasar(*args, **kwargs)\n    return o.roll(1, 1), state\n",
    )


def write_slow_fork(dest: Path, delay_s: float = 0.2) -> str:
    """The starter fork with a slow chunk_quasar, committed; returns the commit."""
    write_starter_fork(dest)
    chunk = dest / CHUNK_FILE
    chunk.write_text(slow_chunk_source(chunk.read_text(), delay_s))
    git(dest, "commit", "-q", "-am", "slow starter")
    return git(dest, "rev-parse", "HEAD")


def write_tuning_fork(dest: Path) -> str:
    """The starter fork declaring one tunable in tuning_space.json, ``combine_block_v`` (16, 32, 64),
    read from tuning.json by a wrapper around chunk_quasar that is slow at the default 16; committed."""
    write_starter_fork(dest)
    chunk = dest / CHUNK_FILE
    source = chunk.read_text().replace(
        "from __future__ import annotations\n",
        "from __future__ import annotations\n\nimport json\nimport time\nfrom pathlib import Path\n",
        1,
    )
    source += (
        "\n\n_standin_chunk_quasar = chunk_quasar\n\n\n"
        "def chunk_quasar(*args, **kwargs):\n"
        "    tuning = Path(__file__).with_name('tuning.json')\n"
        "    written = json.loads(tuning.read_text()) if tuning.exists() else {}\n"
        "    time.sleep(0.2 if written.get('combine_block_v', 16) == 16 else 0.0)\n"
        "    return _standin_chunk_quasar(*args, **kwargs)\n"
    )
    chunk.write_text(source)
    space = {"defaults": {"combine_block_v": 16}, "choices": {"combine_block_v": [16, 32, 64]}}
    (dest / "fla/ops/quasar/tuning_space.json").write_text(json.dumps(space, indent=2) + "\n")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "tunable starter")
    return git(dest, "rev-parse", "HEAD")


# --- GitHub ---


@contextmanager
def github_with_upstream(
    tmp_path: Path, tokens: dict[str, str], fork_delay_polls: int = 2, slow_delay_s: float = 0.2
) -> Iterator[GitHubStandIn]:
    """A GitHub stand-in whose upstream repository is the slow starter fork."""
    source = tmp_path / "upstream-source"
    write_slow_fork(source, slow_delay_s)
    with GitHubStandIn(tmp_path / "github", tokens, fork_delay_polls) as stand_in:
        stand_in.add_repository(UPSTREAM, source)
        yield stand_in


# --- chat endpoint ---


class ChatStandIn:
    """``POST /v1/chat/completions`` answering ``replies`` in order (500 when they run out)."""

    def __init__(self, replies: list[str] | None = None, status: int = 200):
        self.replies = list(replies or [])
        self.status = status
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ChatStandIn:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self):
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                stand_in.requests.append(body)
                stand_in.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    status, answer = 404, {"error": "not found"}
                elif stand_in.status != 200 or not stand_in.replies:
                    status, answer = (stand_in.status if stand_in.status != 200 else 500), {"error": "no reply"}
                else:
                    content = stand_in.replies.pop(0)
                    status, answer = (
                        200,
                        {
                            "id": "x",
                            "object": "chat.completion",
                            "model": body.get("model"),
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content},
                                }
                            ],
                        },
                    )
                send_json(self, status, answer)

        return Handler


def file_reply(description: str, files: dict[str, str]) -> str:
    """A chat reply in the agent's full-file format."""
    parts = [f"Here is my idea.\nDESCRIPTION: {description}\n"]
    for path, text in files.items():
        parts.append(f"FILE: {path}\n```python\n{text}```\n")
    return "\n".join(parts)


# --- the stand-ins themselves ---


def test_github_stand_in_checks_tokens_and_hides_new_forks(tmp_path):
    with github_with_upstream(tmp_path, {TOKEN: "alice"}, fork_delay_polls=1) as github:
        with httpx.Client() as http:
            bad = http.get(f"{github.api_url}/repos/{UPSTREAM}", headers={"Authorization": "Bearer nope"})
            assert bad.status_code == 401
            assert http.get(f"{github.api_url}/repos/{UPSTREAM}").json()["full_name"] == UPSTREAM
            auth = {"Authorization": f"Bearer {TOKEN}"}
            created = http.post(f"{github.api_url}/repos/{UPSTREAM}/forks", headers=auth)
            assert created.status_code == 202 and created.json()["full_name"] == "alice/flash-linear-attention"
            assert http.get(f"{github.api_url}/repos/alice/flash-linear-attention").status_code == 404
            assert http.get(f"{github.api_url}/repos/alice/flash-linear-attention").status_code == 200
            refs = http.get(f"{github.git_base}/alice/flash-linear-attention.git/info/refs?service=git-upload-pack")
            assert refs.status_code == 401


def test_chat_stand_in_answers_in_order():
    with ChatStandIn(["first", "second"]) as chat, httpx.Client() as http:
        answers = [http.post(f"{chat.url}/chat/completions", json={"model": "m", "messages": []}) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 500]
    assert answers[1].json()["choices"][0]["message"]["content"] == "second"


@pytest.fixture
def slow_fork(tmp_path) -> Path:
    path = tmp_path / "slow"
    write_slow_fork(path)
    return path


def test_fork_builders_change_only_what_they_say(slow_fork):
    slow = (slow_fork / CHUNK_FILE).read_text()
    assert SLOW_MARK in slow
    assert SLOW_MARK not in fast_chunk_source(slow)
    assert "o.roll(1, 1)" in wrong_chunk_source(slow)
