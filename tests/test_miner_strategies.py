"""Candidates and strategies: edit rules, apply and roll back, the tuning search over tuning.json,
and the agent strategy against a stand-in chat endpoint on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time
from pathlib import Path

import pytest

from quasar.miner.strategies import (
    KEPT,
    SLOWER,
    AgentStrategy,
    Attempt,
    Candidate,
    EditRejected,
    StrategyError,
    TuningFileError,
    TuningStrategy,
    check_edit_path,
    read_space,
)
from quasar.miner.strategies.agent import apply_diff, build_messages, parse_reply
from quasar.miner.strategies.tuning import (
    DEVICES,
    SPACE_FILE,
    TUNING_FILE,
    TUNING_SOURCE,
    chip_entry,
    code_digest,
    configuration_key,
    parse_space,
    read_source_space,
    with_change,
)
from quasar.starter_fork import KERNEL_DIR, template_root, tuning_contract, write_starter_fork
from test_miner_standins import CHUNK_FILE, ChatStandIn, file_reply
from tests.gitrepo import git

GATE_FILE = "fla/ops/quasar/gate.py"


@pytest.fixture
def starter(tmp_path) -> Path:
    path = tmp_path / "fork"
    write_starter_fork(path)
    return path


# --- edit rules ---


@pytest.mark.parametrize(
    "path",
    [
        "fla/ops/quasar/chunk.py",
        "fla/ops/quasar/tuning.json",
        "fla/ops/quasar/csrc/quasar_recurrent.cu",
        "fla/ops/quasar/kernels/fused.py",
    ],
)
def test_edit_paths_inside_the_kernels_are_allowed(path):
    assert check_edit_path(path) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("fla/layers/quasar.py", "outside fla/ops/quasar/"),
        ("fla/ops/gla/chunk.py", "outside fla/ops/quasar/"),
        ("setup.py", "outside fla/ops/quasar/"),
        ("../fla/ops/quasar/chunk.py", "no '..'"),
        ("fla/ops/quasar/../../layers/quasar.py", "no '..'"),
        ("/fla/ops/quasar/chunk.py", "leading '/'"),
        ("fla/ops/quasar//chunk.py", "'//'"),
        ("fla/ops/quasar/./chunk.py", "'.'"),
        ("fla/ops/quasar", "outside fla/ops/quasar/"),
        ("fla/ops/quasar/chunk.cpython-311-x86_64-linux-gnu.so", "file type not allowed"),
        ("fla/ops/quasar/__pycache__/chunk.cpython-311.py", "bytecode caches"),
        ("fla/ops/quasar/chunk .py", "only letters"),
        ("fla\\ops\\quasar\\chunk.py", "only letters"),
    ],
)
def test_edit_paths_elsewhere_are_rejected_with_the_rule(path, message):
    with pytest.raises(EditRejected) as error:
        check_edit_path(path)
    assert message in str(error.value)


@pytest.mark.parametrize(
    "source",
    [
        "from fla.ops.kda import chunk_kda\n",
        "import fla.ops.gla as g\n",
        "from fla.ops import kda\n",
        "import importlib\nm = importlib.import_module('fla.ops.' + 'gla')\n",
        "from ..gla import chunk_gla\n",
    ],
)
def test_forbidden_imports_are_rejected_before_anything_is_written(starter, source):
    before = (starter / CHUNK_FILE).read_text()
    with pytest.raises(EditRejected, match=r"import check: fla/ops/quasar/chunk.py:\d+: forbidden-import"):
        Candidate("agent", "sneaky", {CHUNK_FILE: before + source})
    assert (starter / CHUNK_FILE).read_text() == before


def test_unverifiable_code_and_broken_syntax_are_rejected():
    with pytest.raises(EditRejected, match="unverifiable-import"):
        Candidate("agent", "x", {CHUNK_FILE: "exec('import fla.ops.kda')\n"})
    with pytest.raises(EditRejected, match="syntax-error"):
        Candidate("agent", "x", {CHUNK_FILE: "def broken(:\n"})
    with pytest.raises(EditRejected, match="changes no file"):
        Candidate("agent", "x", {})


def test_apply_and_rollback_restore_every_byte(starter):
    gate = (starter / GATE_FILE).read_bytes()
    chunk = (starter / CHUNK_FILE).read_bytes()
    candidate = Candidate(
        "agent",
        "new helper, gate removed, chunk edited",
        {"fla/ops/quasar/helpers/extra.py": "X = 1\n", GATE_FILE: None, CHUNK_FILE: chunk.decode() + "# edit\n"},
    )
    applied = candidate.apply(starter)
    assert (starter / "fla/ops/quasar/helpers/extra.py").read_text() == "X = 1\n"
    assert not (starter / GATE_FILE).exists()
    assert (starter / CHUNK_FILE).read_bytes().endswith(b"# edit\n")
    applied.rollback()
    assert not (starter / "fla/ops/quasar/helpers/extra.py").exists()
    assert (starter / GATE_FILE).read_bytes() == gate and (starter / CHUNK_FILE).read_bytes() == chunk
    assert git(starter, "status", "--porcelain", "--untracked-files=no") == ""


def test_apply_refuses_to_write_through_links(starter, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, starter / "fla/ops/quasar/linked")
    with pytest.raises(EditRejected, match="is a link or a file, not a folder"):
        Candidate("agent", "x", {"fla/ops/quasar/linked/evil.py": "X = 1\n"}).apply(starter)
    assert list(outside.iterdir()) == []
    os.symlink(outside / "target.py", starter / "fla/ops/quasar/link.py")
    with pytest.raises(EditRejected, match="is a symbolic link"):
        Candidate("agent", "x", {"fla/ops/quasar/link.py": "X = 1\n"}).apply(starter)
    assert not (outside / "target.py").exists()


# --- tuning ---


def write_space(repo: Path, defaults: dict, choices: dict) -> None:
    (repo / SPACE_FILE).write_text(json.dumps({"defaults": defaults, "choices": choices}) + "\n")


def test_the_space_is_read_from_tuning_py_literals_without_running_it():
    # The starter fork's own tuning.py, read as text, against the contract it defines when run.
    space = read_source_space((Path(str(template_root())) / KERNEL_DIR / "tuning.py").read_text())
    contract = tuning_contract()
    assert space is not None and space.defaults == dataclasses.asdict(contract.DEFAULTS)
    assert space.choices == {name: sorted(allowed) for name, allowed in contract._ALLOWED.items()}
    assert read_source_space("raise SystemExit('never run')\n") is None
    assert read_source_space("def broken(:\n") is None


def test_the_starter_forks_tunables_are_found(starter):
    if not (starter / TUNING_SOURCE).is_file():
        pytest.skip("this starter fork declares no tunables")
    space = read_space(starter)
    assert space is not None and space.choices
    assert all(space.defaults[name] in options for name, options in space.choices.items())
    assert {"wy_warps", "wy_maxnreg", "segment_chunks"} <= set(space.choices)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"choices": {}}, "field 'defaults' must be an object"),
        ({"defaults": {}}, "field 'choices' must be an object"),
        ({"defaults": {}, "choices": {"bv": [16]}}, "choices.bv has no default in 'defaults'"),
        ({"defaults": {"bv": 16}, "choices": {"bv": []}}, "choices of 'bv' must be a list of 1 to 64"),
        ({"defaults": {"bv": 16}, "choices": {"bv": [[16]]}}, "must be numbers, strings or booleans"),
        ([1, 2], "must be a JSON object"),
    ],
)
def test_tuning_space_errors_name_the_field(document, message):
    with pytest.raises(TuningFileError) as error:
        parse_space(json.dumps(document))
    assert message in str(error.value)
    with pytest.raises(TuningFileError, match="is not JSON"):
        parse_space("{")


def test_tuning_searches_one_step_at_a_time_nearest_first_and_never_twice(starter):
    write_space(starter, {"chunks": 16, "bv": 32, "fixed": "x"}, {"chunks": [4, 8, 16, 32], "bv": [16, 32]})
    (starter / TUNING_FILE).write_text('{"fixed": "y"}\n')
    strategy = TuningStrategy()
    history: list[Attempt] = []
    proposed = []
    while (candidate := strategy.propose(starter, history)) is not None:
        proposed.append(json.loads(candidate.changes[TUNING_FILE]))
        history.append(Attempt("tuning", candidate.key, candidate.description, SLOWER))
        assert len(proposed) <= 4
    assert proposed == [
        {"fixed": "y", "chunks": 8},
        {"fixed": "y", "chunks": 32},
        {"fixed": "y", "chunks": 4},
        {"fixed": "y", "bv": 16},
    ]


def test_tuning_goes_on_from_a_kept_configuration_without_going_back(starter):
    write_space(starter, {"chunks": 64}, {"chunks": [16, 32, 64]})
    strategy = TuningStrategy()
    first = strategy.propose(starter, [])
    assert first.description == "chunks 64 -> 32"
    first.apply(starter)  # kept: the checkout now holds it
    history = [Attempt("tuning", first.key, first.description, KEPT)]
    second = strategy.propose(starter, history)
    assert second.description == "chunks 32 -> 16"  # not back to 64, the base it left
    history.append(Attempt("tuning", second.key, second.description, SLOWER))
    assert strategy.propose(starter, history) is None


def test_tuning_keys_name_the_gpu_and_the_kernel_code(starter):
    write_space(starter, {"bv": 32}, {"bv": [16, 32]})
    on_h100 = TuningStrategy("NVIDIA H100 80GB HBM3").propose(starter, [])
    assert on_h100.description == "bv 32 -> 16 on NVIDIA H100 80GB HBM3"
    assert TuningStrategy("NVIDIA A100").propose(starter, []).key != on_h100.key
    before = code_digest(starter)
    (starter / CHUNK_FILE).write_text((starter / CHUNK_FILE).read_text() + "# changed\n")
    assert code_digest(starter) != before
    assert configuration_key(before, None, {"bv": 16}) != configuration_key(code_digest(starter), None, {"bv": 16})
    edited_code = code_digest(starter)
    (starter / TUNING_FILE).write_text('{"bv": 16}\n')
    assert code_digest(starter) == edited_code  # the tuning file is not kernel code


def test_tuning_on_a_gpu_with_its_own_entry_changes_that_entry(starter):
    # A fork whose tuning has an entry for the H200: on an H200 the search starts from the entry's
    # values and writes into that entry; elsewhere at the top level.
    shipped = json.loads((starter / TUNING_FILE).read_text())
    shipped[DEVICES] = {"H200": {"wy_warps": 1, "wy_maxnreg": 0, "fused_conv": ""}}
    (starter / TUNING_FILE).write_text(json.dumps(shipped, indent=1) + "\n")
    assert shipped["wy_warps"] == 2
    space = read_space(starter)
    on_h200 = space.current(shipped, "NVIDIA H200")
    assert (on_h200["wy_warps"], on_h200["wy_maxnreg"]) == (1, 0) and DEVICES not in on_h200
    assert space.current(shipped, "NVIDIA H100 80GB HBM3")["wy_warps"] == 2
    for device, chip in (("NVIDIA H200", "H200"), ("NVIDIA H100 80GB HBM3", None)):
        strategy, history, seen = TuningStrategy(device), [], []
        while (candidate := strategy.propose(starter, history)) is not None and len(seen) < 40:
            written = json.loads(candidate.changes[TUNING_FILE])
            name = candidate.description.split()[0]
            effective = space.current(written, device)
            assert effective == {**space.current(shipped, device), name: effective[name]}, candidate.description
            assert effective[name] != space.current(shipped, device)[name]
            where = written[DEVICES][chip] if chip else written
            assert where[name] == effective[name]
            # Only the entry that applies on this GPU changed: the others' tunings are the shipped ones.
            for other in set(space.choices) - {name}:
                assert written.get(other) == shipped.get(other)
            if chip:
                assert {k: v for k, v in written.items() if k != DEVICES} == {
                    k: v for k, v in shipped.items() if k != DEVICES
                }
            seen.append(candidate.description)
            history.append(Attempt("tuning", candidate.key, candidate.description, SLOWER))
        assert seen and any(text.startswith("wy_warps 1 -> ") for text in seen) == (chip is not None)


def test_the_entry_for_a_gpu_is_the_first_fragment_found_in_its_name():
    written = {"bv": 16, DEVICES: {"h100": {"bv": 32}, "NVIDIA H100 80GB": {"bv": 64}, "": {"bv": 8}}}
    assert chip_entry(written, "NVIDIA H100 80GB HBM3") == "h100"
    assert chip_entry(written, "NVIDIA A100") is None and chip_entry(written, None) is None
    assert chip_entry({DEVICES: {"H200": [1]}}, "NVIDIA H200") is None
    assert with_change(written, "NVIDIA H100 80GB HBM3", "bv", 128)[DEVICES]["h100"] == {"bv": 128}
    assert with_change(written, "NVIDIA A100", "bv", 128)["bv"] == 128


def test_tuning_without_a_declared_space_or_with_a_broken_file_proposes_nothing(starter, caplog):
    for name in (TUNING_SOURCE, SPACE_FILE):
        if (starter / name).exists():
            (starter / name).unlink()
    assert TuningStrategy().propose(starter, []) is None
    assert "the fork declares no tunables" in caplog.text
    write_space(starter, {"bv": 32}, {"bv": [16, 32]})
    (starter / TUNING_FILE).write_text("{broken")
    assert TuningStrategy().propose(starter, []) is None
    assert "tuning.json is not JSON" in caplog.text


# --- the agent's reply ---


def test_replies_with_full_files_in_several_markdown_spellings():
    reply = (
        "Sure! Here is the plan.\n**DESCRIPTION:** fuse the state update\n\n"
        "### FILE: `fla/ops/quasar/chunk.py`\n```python\nA = 1\n```\n"
        "**FILE:** fla/ops/quasar/gate.py\n~~~py\nB = 2\n~~~\nDELETE: fla/ops/quasar/old.py\n"
    )
    description, changes, diffs = parse_reply(reply)
    assert description == "fuse the state update"
    assert changes == {
        "fla/ops/quasar/chunk.py": "A = 1\n",
        "fla/ops/quasar/gate.py": "B = 2\n",
        "fla/ops/quasar/old.py": None,
    }
    assert diffs == []
    with pytest.raises(StrategyError, match="no FILE block and no diff"):
        parse_reply("I would make it faster.")
    with pytest.raises(StrategyError, match="never closes"):
        parse_reply("FILE: fla/ops/quasar/chunk.py\n```python\nA = 1\n")


def test_a_diff_is_applied_to_a_scratch_copy(starter):
    original = (starter / CHUNK_FILE).read_text()
    diff = (
        "--- a/fla/ops/quasar/chunk.py\n+++ b/fla/ops/quasar/chunk.py\n@@ -1,3 +1,4 @@\n"
        + "".join(f" {line}\n" for line in original.splitlines()[:1])
        + "+# agent was here\n"
        + "".join(f" {line}\n" for line in original.splitlines()[1:3])
    )
    description, changes, diffs = parse_reply(f"DESCRIPTION: note\n```diff\n{diff}```\n")
    produced = apply_diff(starter, diffs[0])
    assert produced[CHUNK_FILE].splitlines()[1] == "# agent was here"
    assert (starter / CHUNK_FILE).read_text() == original  # the checkout is untouched
    outside = diff.replace("fla/ops/quasar/chunk.py", "fla/layers/quasar.py")
    with pytest.raises(EditRejected, match="outside fla/ops/quasar/"):
        apply_diff(starter, outside)
    with pytest.raises(StrategyError, match="does not apply"):
        apply_diff(starter, diff.replace(' """Chunked', " something else"))


def test_attack_a_diff_creating_a_symlink_cannot_read_a_file_outside_the_fork(starter, tmp_path):
    """A hostile agent's diff creates fla/ops/quasar/notes.json as a link to the miner's wallet
    (``new file mode 120000``): read through, the wallet's secret would become the candidate's
    content, written into the fork and pushed with it. Only regular files come out of a diff."""
    secret = tmp_path / "home" / ".bittensor" / "wallets" / "miner" / "hotkeys" / "default"
    secret.parent.mkdir(parents=True)
    secret.write_text('{"secretPhrase": "lion tiger bear"}')
    diff = (
        "diff --git a/fla/ops/quasar/notes.json b/fla/ops/quasar/notes.json\nnew file mode 120000\n"
        f"--- /dev/null\n+++ b/fla/ops/quasar/notes.json\n@@ -0,0 +1 @@\n+{secret}\n\\ No newline at end of file\n"
    )
    with ChatStandIn([f"DESCRIPTION: notes\n```diff\n{diff}```\n"]) as chat:
        with pytest.raises(EditRejected, match="a link or a special file"):
            AgentStrategy(chat.url, "m").propose(starter, [])
    assert not (starter / "fla/ops/quasar/notes.json").exists()


def test_the_prompt_holds_the_rules_history_and_files(starter):
    from quasar.miner.strategies.agent import read_kernel_files

    files = read_kernel_files(starter)
    assert CHUNK_FILE in files and "fla/ops/quasar/csrc/quasar_recurrent.cu" in files
    history = [Attempt("agent", "k", "bigger blocks", SLOWER, 4096, 900.0, 1000.0, "-10.0% vs best")]
    system, user = build_messages(files, history, 4096)
    assert "fla.ops.gla" in system["content"] and "S_t^T q_t" in system["content"]
    assert "Target sequence length: 4,096 tokens." in user["content"]
    assert "[slower] agent: bigger blocks; measured 900 tokens/s vs best 1,000; -10.0% vs best" in user["content"]
    assert "def chunk_quasar(" in user["content"]
    order = [
        user["content"].index(f"FILE: fla/ops/quasar/{name}\n")
        for name in (
            "chunk.py",
            "fused_recurrent.py",
            "forward_substitution.py",
            "chunk_intra_token_parallel.py",
            "gate.py",
            "__init__.py",
        )
    ]
    assert order == sorted(order)  # the guide's priorities first


# --- the agent against a chat endpoint ---


def test_agent_turns_a_canned_reply_into_a_checked_candidate(starter):
    edited = (starter / CHUNK_FILE).read_text() + "\n# faster now\n"
    with ChatStandIn([file_reply("comment only", {CHUNK_FILE: edited})]) as chat:
        agent = AgentStrategy(chat.url, "coder-7b", api_key="sk-local-key")
        agent.target_seq_len = 2048
        candidate = agent.propose(starter, [])
    assert candidate.strategy == "agent" and candidate.description == "comment only"
    assert candidate.changes == {CHUNK_FILE: edited}
    request = chat.requests[0]
    assert request["model"] == "coder-7b"
    assert chat.headers[0]["Authorization"] == "Bearer sk-local-key"
    assert "def chunk_quasar(" in request["messages"][1]["content"]
    assert (starter / CHUNK_FILE).read_text() != edited  # proposing writes nothing


def test_agent_edits_outside_the_kernels_or_with_forbidden_imports_are_rejected(starter):
    chunk = (starter / CHUNK_FILE).read_text()
    replies = [
        file_reply("patch the layer", {"fla/layers/quasar.py": "X = 1\n"}),
        file_reply("borrow kda", {CHUNK_FILE: "from fla.ops.kda import chunk_kda\n" + chunk}),
        file_reply("escape", {"fla/ops/quasar/../../../evil.py": "X = 1\n"}),
        file_reply("same as before", {CHUNK_FILE: chunk}),
    ]
    with ChatStandIn(replies) as chat:
        agent = AgentStrategy(chat.url, "m")
        with pytest.raises(EditRejected, match="outside fla/ops/quasar/"):
            agent.propose(starter, [])
        with pytest.raises(EditRejected, match="forbidden-import"):
            agent.propose(starter, [])
        with pytest.raises(EditRejected, match="no '..'"):
            agent.propose(starter, [])
        with pytest.raises(StrategyError, match="changes nothing"):
            agent.propose(starter, [])
    assert git(starter, "status", "--porcelain") == ""


def test_agent_endpoint_failures_are_strategy_errors(starter):
    with ChatStandIn(status=503) as chat:
        with pytest.raises(StrategyError, match="answered 503"):
            AgentStrategy(chat.url, "m").propose(starter, [])
    with ChatStandIn(["I cannot help with that."]) as chat:
        with pytest.raises(StrategyError, match="no FILE block"):
            AgentStrategy(chat.url, "m").propose(starter, [])
    with ChatStandIn() as chat:
        url = chat.url
    with pytest.raises(StrategyError, match="cannot reach the agent endpoint"):
        AgentStrategy(url, "m", timeout_s=2).propose(starter, [])
    with pytest.raises(ValueError, match="AGENT_MODEL"):
        AgentStrategy("http://127.0.0.1:1/v1", "")


def test_agent_does_not_offer_an_edit_already_tried(starter):
    edited = (starter / CHUNK_FILE).read_text() + "# same idea\n"
    with ChatStandIn([file_reply("idea", {CHUNK_FILE: edited})] * 2) as chat:
        agent = AgentStrategy(chat.url, "m")
        first = agent.propose(starter, [])
        with pytest.raises(StrategyError, match="already tried"):
            agent.propose(starter, [Attempt("agent", first.key, first.description, SLOWER)])


class HostileChat:
    """A chat endpoint on 127.0.0.1 whose answer is ``mode``: "trickle" (a byte every 50 ms, never
    ending), "deep" (JSON nested 200,000 arrays deep), "huge" (an endless body, no length),
    "escapes" (429 with terminal escape sequences in its body), "slow-headers" (its status line and
    headers a byte every 50 ms, for 10 s) or "late" (its headers after ``delay_s``, then one byte of
    the body after ``delay_s`` more, then nothing)."""

    def __init__(self, mode: str, delay_s: float = 0.0):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                if mode == "escapes":
                    self.send_response(429)
                    self.send_header("Content-Length", "25")
                    self.end_headers()
                    self.wfile.write(b"overloaded \x1b]0;owned\x07\x1b[2J")
                    return
                if mode in ("slow-headers", "late"):
                    self.close_connection = True
                    try:
                        self.answer_slowly(mode)
                    except OSError:
                        pass
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    if mode == "deep":
                        self.wfile.write(b"[" * 200_000)
                    while mode != "deep":
                        self.wfile.write(b" " if mode == "trickle" else b" " * (1 << 20))
                        self.wfile.flush()
                        time.sleep(0.05 if mode == "trickle" else 0)
                except OSError:
                    pass

            def answer_slowly(self, mode: str) -> None:
                if mode == "late":
                    time.sleep(delay_s)
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                    self.wfile.flush()
                    time.sleep(delay_s)
                    self.wfile.write(b"{")
                    self.wfile.flush()
                    time.sleep(10)
                    return
                for _ in range(200):
                    self.wfile.write(b"X")
                    self.wfile.flush()
                    time.sleep(0.05)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("trickle", "took longer than 0.5s"),
        ("deep", "not a chat completion"),
        ("huge", "answered with more than"),
    ],
)
def test_attack_an_endless_huge_or_deeply_nested_answer_ends_as_a_strategy_error(starter, mode, message):
    """A hostile endpoint trickling its answer a byte at a time (each read well within the
    timeout, so a per-read timeout never ends it), sending a body without end (read whole into
    memory before any size check), or JSON nested deeper than the parser recurses (RecursionError,
    which ended the miner's cycle): each is a StrategyError within the timeout."""
    chat = HostileChat(mode)
    started = time.monotonic()
    try:
        with pytest.raises(StrategyError, match=message):
            AgentStrategy(chat.url, "m", timeout_s=0.5).propose(starter, [])
    finally:
        chat.close()
    assert time.monotonic() - started < 1.5


@pytest.mark.parametrize("mode", ["slow-headers", "late"])
def test_attack_a_stalled_or_trickled_exchange_ends_within_the_one_timeout(starter, mode):
    """A hostile endpoint trickling its status line and headers a byte at a time (each read within
    the per-read timeout, and the answer's deadline was checked only on body bytes: the miner
    waited as long as the endpoint pleased), or sending its headers just before the timeout and
    its body's first byte just before another (the miner waited about twice AGENT_TIMEOUT): one
    deadline holds for the whole exchange. The late answer's stages fall at 1.9 s and 3.8 s: a
    second past the 2 s deadline tells the two apart on a loaded machine."""
    chat = HostileChat(mode, delay_s=1.9)
    started = time.monotonic()
    try:
        with pytest.raises(StrategyError, match="took longer than 2s"):
            AgentStrategy(chat.url, "m", timeout_s=2.0).propose(starter, [])
    finally:
        chat.close()
    assert time.monotonic() - started < 3.0


def test_attack_content_that_is_not_utf8_is_rejected_before_anything_is_written(starter):
    """A hostile endpoint's JSON can carry a lone surrogate (``\\udc80``): the file before it was
    written, then writing it raised UnicodeEncodeError, which left that file behind and ended the
    miner's cycle. Such content is rejected with the edit's other rules."""
    with pytest.raises(EditRejected, match="not UTF-8 text"):
        Candidate("agent", "x", {"fla/ops/quasar/a.json": "{}\n", "fla/ops/quasar/b.json": "\udc80"})
    with ChatStandIn([file_reply("notes", {"fla/ops/quasar/notes.json": "\udc80\n"})]) as chat:
        with pytest.raises(EditRejected, match="not UTF-8 text"):
            AgentStrategy(chat.url, "m").propose(starter, [])


def test_attack_terminal_control_sequences_in_the_description_never_reach_the_log(starter):
    """A hostile agent's DESCRIPTION carries escape sequences (set the window title, clear the
    screen, colour) and a right-to-left override: logged as "trying agent: ...", they reached the
    miner's log and terminal raw. The description keeps printable characters only."""
    edited = (starter / CHUNK_FILE).read_text() + "# x\n"
    hostile = "faster \x1b]0;owned\x07\x1b[2J\x1b[31mred \u202ekcatta"
    with ChatStandIn([file_reply(hostile, {CHUNK_FILE: edited})]) as chat:
        candidate = AgentStrategy(chat.url, "m").propose(starter, [])
    assert candidate.description == "faster ]0;owned [2J [31mred kcatta"
    assert all(char.isprintable() for char in candidate.description)


def test_attack_terminal_control_sequences_in_an_error_answer_never_reach_the_log(starter):
    """A hostile endpoint answers 429 with a body of escape sequences: its first 300 characters,
    quoted in the StrategyError the miner logs, reached the log and terminal raw."""
    chat = HostileChat("escapes")
    try:
        with pytest.raises(StrategyError) as error:
            AgentStrategy(chat.url, "m").propose(starter, [])
    finally:
        chat.close()
    assert "answered 429:" in str(error.value) and all(char.isprintable() for char in str(error.value))


def test_attack_a_diff_that_is_not_utf8_is_rejected(starter):
    """A hostile agent's diff carries a lone surrogate (from ``\\udc80`` in its JSON): writing the
    patch raised UnicodeEncodeError, which is no StrategyError and ended the miner's cycle."""
    diff = "--- /dev/null\n+++ b/fla/ops/quasar/notes.json\n@@ -0,0 +1 @@\n+\udc80\n"
    with ChatStandIn([f"DESCRIPTION: notes\n```diff\n{diff}```\n"]) as chat:
        with pytest.raises(EditRejected, match="not UTF-8 text"):
            AgentStrategy(chat.url, "m").propose(starter, [])


@pytest.mark.parametrize("linked", ["fla", "fla/ops", "fla/ops/quasar"])
def test_attack_a_fork_whose_kernel_folder_is_a_link_never_sends_what_it_points_to(tmp_path, linked):
    """A fork whose fla/ops/quasar (or a folder above it) is a symbolic link, committed as git
    allows: the agent read every .json and .py under the link's target (the miner's cloud
    credentials, say) into its prompt, sent to the chat endpoint. Nothing is read or sent."""
    secrets = tmp_path / "home" / ".config"
    below = secrets / "fla/ops/quasar"[len(linked) + 1 :]  # where the kernels would be, through the link
    below.mkdir(parents=True)
    (below / "application_default_credentials.json").write_text('{"refresh_token": "SECRET-REFRESH"}\n')
    source = tmp_path / "source"
    (source / linked).parent.mkdir(parents=True)
    (source / linked).symlink_to(secrets)
    git(source, "init", "-q")
    git(source, "add", "-A")
    git(source, "commit", "-q", "-m", "a kernel folder that is a link")
    clone = tmp_path / "clone"
    git(None, "clone", "-q", str(source), str(clone))
    assert (clone / linked).is_symlink()
    with ChatStandIn(["no idea"]) as chat:
        with pytest.raises(StrategyError, match="is a symbolic link"):
            AgentStrategy(chat.url, "m").propose(clone, [])
    assert chat.requests == []
