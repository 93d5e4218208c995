"""Attacks on the evaluation harness, each a small hostile fork derived from the starter fork.

Every attack must be rejected (verdict fail, with a reason naming what went wrong) or contained
(the harm did not happen and the fork gained nothing). The evaluations run on CPU at tiny
lengths, a few at a time, in one session fixture; each test then checks one report.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from quasar.evaluate import EvaluationOptions, EvaluationReport, SandboxPolicy, evaluate
from quasar.evaluate.report import render_report
from quasar.evaluate.sandbox import SandboxedChild, SandboxUnavailable
from quasar.evaluate.verification import REL_ERROR_THRESHOLD, REQUEST_TOLERANCE
from quasar.starter_fork import write_starter_fork
from tests.evaluate_runs import FAST_CPU
from tests.hostile_forks import write_hostile_fork
from tests.processes import proc_files, run_python

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
SECRET_TOKEN = "ghp_quasarTestSecretToken0123456789abcdef"
SECRET_COLDKEY = "coldkey-secret-5GrwvaEF5zXb26Fz9rcQpDWS57CtERHpNehXCPcNoHGKutQY"
KEYRING_SECRET = "keyring-secret-of-an-earlier-evaluation"
# What the markup attack's exception says: unbalanced markup, a forged verdict line, terminal
# escapes (set the title, clear the screen) and a right-to-left override.
MARKUP_TEXT = "[/] \x1b]0;pwned\x07\x1b[2J[bold green]verdict PASS[/] \u202eevil"
LAST_WORDS = "LAST-WORDS-OF-THE-FORK"
# The sandbox's memory in the memory tests, and what the hog holds.
SMALL_MEMORY = 1536 << 20
HOG_BYTES = 3 << 30
MISS_SECONDS = 0.4
SLEEP_SECONDS = 0.4
# Several forwards per request: each sleeps this long; 3 forwards a request (CPU evaluations run
# one unless tokens_per_request says otherwise).
BATCHED_SLEEP_SECONDS = 0.05
BATCHED_FORWARDS = 3
# A byte count a forged reply gives: more than a float holds.
FORGED_BYTES = 10**400


class Listener:
    """A TCP listener on every interface of this host, counting connections it accepts."""

    def __init__(self):
        self.server = socket.create_server(("0.0.0.0", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.accepted = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                connection, _ = self.server.accept()
            except OSError:
                continue
            self.accepted += 1
            connection.close()

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.server.close()


def host_addresses() -> list[str]:
    """127.0.0.1 and this host's outward address (found without sending a packet)."""
    addresses = ["127.0.0.1"]
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))
        address = probe.getsockname()[0]
        if address not in addresses:
            addresses.append(address)
    except OSError:
        pass
    finally:
        probe.close()
    return addresses


def processes_where(field: str, matches) -> list[int]:
    """The processes whose /proc/PID/``field`` (bytes) ``matches``."""
    return [pid for pid, content in proc_files(field) if matches(content)]


def processes_with(marker: str) -> list[int]:
    return processes_where("cmdline", lambda cmdline: marker.encode() in cmdline)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass
class Case:
    attack: str | None  # None: the honest starter fork
    params: dict = field(default_factory=dict)
    target: int = 64
    options: EvaluationOptions = FAST_CPU
    claimed: float | None = None


@dataclass
class World:
    """Everything the attack tests look at after the evaluations."""

    reports: dict[str, EvaluationReport]
    seconds: dict[str, float]
    commands: dict[str, subprocess.CompletedProcess]
    listener_accepted: int
    markers: dict[str, str]
    paths: dict[str, Path]
    fork_layer_digest_before: str
    fork_layer_digest_after: str
    survivors: dict[str, list[int]]


def sandbox_unavailable_reason(empty_dir: Path) -> str | None:
    try:
        with SandboxedChild(empty_dir, "cpu", SandboxPolicy()):
            return None
    except SandboxUnavailable as error:
        return str(error)


# The two quasar commands, on the honest starter fork, JSON out: the same short CPU run.
QUICK_CPU_RUN = ["--device", "cpu", "--repeats", "2", "--warmup", "1", "--json"]
COMMANDS = {
    "evaluate": ["evaluate", "{fork}", "--target", "64", "--seq-lens", "64", "--claimed", "1", *QUICK_CPU_RUN],
    "local_validator": ["local-validator", "--repo-path", "{fork}", "--seq-len", "64", *QUICK_CPU_RUN],
}


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    base = tmp_path_factory.mktemp("attacks")
    (base / "empty").mkdir()
    reason = sandbox_unavailable_reason(base / "empty")
    if reason is not None:
        pytest.skip(f"namespaces unavailable here: {reason}")
    caller_home = base / "caller-home"
    wallet_file = caller_home / ".bittensor" / "wallets" / "miner" / "coldkey"
    wallet_file.parent.mkdir(parents=True)
    wallet_file.write_text(SECRET_COLDKEY)
    outside_file = base / "outside" / "pwned.txt"
    tmp_file = Path("/tmp") / f"quasar-pwned-{os.getpid()}-{time.monotonic_ns()}"
    system_file = Path("/usr") / f"quasar-pwned-{os.getpid()}"
    # A Triton cache seed (quasar/evaluate/triton_seed.py) the fork would poison for later evaluations.
    triton_seed = base / "triton-seed"
    (triton_seed / "entry").mkdir(parents=True)
    (triton_seed / "entry" / "kernel.cubin").write_bytes(b"compiled by the starter fork")
    markers = {"sandboxed": f"quasar-bg-{os.getpid()}-a", "unsandboxed": f"quasar-bg-{os.getpid()}-b"}
    listener = Listener()
    write_outside_source = base / "write_outside"
    unsandboxed = SandboxPolicy(allow_unsandboxed=True, force_unsandboxed=True)
    # A read-only bind under /tmp, as a checkout or a venv there needs (base is under /tmp).
    bind_under_tmp = base / "under-tmp"
    bind_under_tmp.mkdir()

    cases = {
        "honest": Case(None, target=128, options=replace(FAST_CPU, seq_lens=(64,)), claimed=1e12),
        "huge_sources": Case(None),
        "honest_bind_under_tmp": Case(
            None, options=replace(FAST_CPU, policy=SandboxPolicy(extra_readonly_paths=(str(bind_under_tmp),)))
        ),
        "zeros": Case("zeros"),
        "noise": Case("noise"),
        "first_half": Case("first_half", target=128),
        "stale_cache": Case("stale_cache"),
        "cache_by_input": Case("cache_by_input", {"miss_seconds": MISS_SECONDS}),
        "timers": Case("timers", {"sleep_seconds": SLEEP_SECONDS}),
        "timers_batched": Case(
            "timers",
            {"sleep_seconds": BATCHED_SLEEP_SECONDS},
            options=replace(FAST_CPU, warmup_runs=2, tokens_per_request=64 * BATCHED_FORWARDS),
        ),
        "first_only": Case(
            "first_only", options=replace(FAST_CPU, tokens_per_request=1 << 18, max_forwards_per_request=4)
        ),
        "sums_on_few_tokens": Case("sums_on_few_tokens"),
        "presumed_signs": Case(
            "presumed_signs", options=replace(FAST_CPU, tokens_per_request=1 << 18, max_forwards_per_request=4)
        ),
        "flood": Case("flood", options=replace(FAST_CPU, policy=SandboxPolicy(max_output_bytes=4 << 20))),
        "sleep_forever": Case("sleep_forever", options=replace(FAST_CPU, length_timeout_s=8)),
        # T=64 must be ready within the limit while two other evaluations share the machine's cores.
        "sleep_at_length": Case(
            "sleep_at_length",
            {"sleep_length": 128},
            target=128,
            options=replace(FAST_CPU, seq_lens=(64,), length_timeout_s=20),
        ),
        "background": Case("background", {"marker": markers["sandboxed"]}),
        "background_unsandboxed": Case(
            "background", {"marker": markers["unsandboxed"]}, options=replace(FAST_CPU, policy=unsandboxed)
        ),
        "network": Case("network", {"addresses": host_addresses(), "port": listener.port}),
        "secrets": Case(
            "secrets", {"wallet_file": str(wallet_file), "parent_pid": os.getpid(), "caller_home": str(caller_home)}
        ),
        "write_outside": Case(
            "write_outside",
            {
                "paths": [
                    str(outside_file),
                    str(write_outside_source / "fla" / "layers" / "quasar.py"),
                    str(tmp_file),
                    str(system_file),
                    "/sandbox/fork/fla/layers/quasar.py",
                    "/sandbox/harness/child.py",
                    "/sandbox/triton-seed/entry/kernel.cubin",
                    "/sandbox/triton-seed/new/kernel.cubin",
                ]
            },
            options=replace(FAST_CPU, policy=SandboxPolicy(triton_seed=str(triton_seed))),
        ),
        "forge_reply": Case("forge_reply"),
        "forged_huge_integer": Case("forged_frame", {"header": b'{"ok":false,"peak_bytes":' + b"1" * 5000 + b"}"}),
        "forged_deep_nesting": Case("forged_frame", {"header": b"[" * 200_000}),
        "forged_peak": Case("forged_peak", {"peak": FORGED_BYTES}),
        "forged_memory": Case("forged_memory", {"peak": FORGED_BYTES}),
        "cheap_input": Case("cheap_input"),
        "oom": Case("oom", {"oom_length": 128}, target=256, options=replace(FAST_CPU, seq_lens=(64, 128))),
        "wrong_at_length": Case(
            "wrong_at_length", {"wrong_length": 128}, target=128, options=replace(FAST_CPU, seq_lens=(64,))
        ),
        "sloppy_timed": Case(
            "sloppy_timed",
            {"noise": 0.022, "eager": False, "exact_request": 3},
            target=128,
            options=replace(FAST_CPU, seq_lens=(64,), min_timed_runs=10, max_timed_runs=10),
        ),
        "keyring": Case("keyring", {"secret": KEYRING_SECRET}),
        "syscalls": Case("syscalls"),
        "host_files": Case("host_files"),
        "memory_hog": Case(
            "memory_hog",
            {"hog_bytes": HOG_BYTES},
            options=replace(FAST_CPU, policy=SandboxPolicy(memory_bytes=SMALL_MEMORY)),
        ),
        "memory_hog_watchdog": Case(
            "memory_hog",
            {"hog_bytes": HOG_BYTES},
            options=replace(
                FAST_CPU, policy=SandboxPolicy(memory_bytes=SMALL_MEMORY, cgroup_path=str(base / "no-such-cgroup"))
            ),
        ),
        "foreign_requests": Case("foreign_import", {"module": "requests"}),
        "foreign_bittensor": Case("foreign_import", {"module": "bittensor"}),
        "hang_at_import": Case("hang_at_import", options=replace(FAST_CPU, load_timeout_s=5)),
        "markup": Case("markup", {"text": MARKUP_TEXT}),
        "exit_at_forward": Case("exit_at_forward", {"last_words": LAST_WORDS}),
    }
    forks = {}
    for name, case in cases.items():
        if case.attack is None:
            forks[name] = base / name
            write_starter_fork(forks[name])
        else:
            forks[name] = write_hostile_fork(base / name, case.attack, **case.params)
    # The starter fork beside two 8 MB sources of one long list, which git compresses to nothing.
    (forks["huge_sources"] / "junk").mkdir()
    for junk in ("a.py", "b.py"):
        (forks["huge_sources"] / "junk" / junk).write_text("x = [" + "0," * (4 << 20) + "]\n")
    digest_before = file_digest(write_outside_source / "fla" / "layers" / "quasar.py")

    def run_case(name: str) -> tuple[str, EvaluationReport, float]:
        case = cases[name]
        started = time.monotonic()
        report = evaluate(forks[name], case.target, case.claimed, case.options)
        return name, report, time.monotonic() - started

    def run_command(name: str) -> tuple[str, subprocess.CompletedProcess, float]:
        started = time.monotonic()
        arguments = [a.replace("{fork}", str(forks["honest"])) for a in COMMANDS[name]]
        done = run_python(["-m", "quasar", *arguments], ROOT, 280)
        return name, done, time.monotonic() - started

    saved = {key: os.environ.get(key) for key in ("HOME", "GITHUB_TOKEN", "WALLET_PATH")}
    os.environ.update(HOME=str(caller_home), GITHUB_TOKEN=SECRET_TOKEN, WALLET_PATH=str(wallet_file.parent.parent))
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            evaluations = [pool.submit(run_case, name) for name in cases]
            commands = [pool.submit(run_command, name) for name in COMMANDS]
            results = [future.result() for future in evaluations]
            command_results = [future.result() for future in commands]
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        listener.close()
    return World(
        reports={name: report for name, report, _ in results},
        seconds={name: seconds for name, _, seconds in results + command_results},
        commands={name: done for name, done, _ in command_results},
        listener_accepted=listener.accepted,
        markers=markers,
        paths={
            "outside_file": outside_file,
            "tmp_file": tmp_file,
            "wallet_file": wallet_file,
            "system_file": system_file,
            "tmp_root": bind_under_tmp,
            "triton_seed": triton_seed,
        },
        fork_layer_digest_before=digest_before,
        fork_layer_digest_after=file_digest(write_outside_source / "fla" / "layers" / "quasar.py"),
        survivors={kind: processes_with(marker) for kind, marker in markers.items()},
    )


def reasons(world: World, name: str) -> str:
    return "\n".join(world.reports[name].reasons)


# --- the honest baseline ---------------------------------------------------------------------


def test_honest_starter_fork_is_correct_and_only_the_inflated_claim_fails(world):
    report = world.reports["honest"]
    assert report.sandbox.startswith("namespaces"), report.sandbox
    assert [r for r in report.reasons if "claimed" not in r] == []
    assert report.claim_ok is False and "below 0.9 × claimed" in reasons(world, "honest")
    assert report.weighted_score == 0.0
    for item in report.lengths.values():
        assert item.status == "ok" and item.correct and item.finite and item.repeat_agree
        assert item.rel_error < REL_ERROR_THRESHOLD and max(item.rel_error_eighths) < REL_ERROR_THRESHOLD
        assert item.timed_runs == 3 and item.runs_verified == 3 * item.forwards_per_request
    measured = report.lengths["128"].tokens_per_sec
    assert report.measured_tokens_per_sec == measured
    assert report.lengths["128"].tokens_per_sec_min <= report.recommended_claim <= measured


def test_huge_sources_beside_the_fork_leave_its_evaluation_alone(world):
    # Their bytecode is not compiled beside the import check (tests/test_evaluate_sandbox.py
    # checks that what is compiled is bounded); the evaluation goes on as for the starter fork.
    report = world.reports["huge_sources"]
    assert report.verdict == "pass", report.reasons


def test_a_read_only_bind_under_tmp_survives_the_sandboxs_own_tmp(world):
    assert str(world.paths["tmp_root"]).startswith("/tmp/")
    report = world.reports["honest_bind_under_tmp"]
    assert report.verdict == "pass", report.reasons
    assert report.sandbox.startswith("namespaces"), report.sandbox


# --- outputs that are wrong ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["zeros", "noise", "stale_cache", "cheap_input"])
def test_wrong_output_is_rejected(world, name):
    report = world.reports[name]
    assert report.verdict == "fail"
    item = report.lengths["64"]
    assert item.correct is False
    assert "differs from the reference" in reasons(world, name) or "do not match the reference" in reasons(world, name)


def test_zeros_and_noise_are_far_from_the_reference(world):
    for name in ("zeros", "noise"):
        item = world.reports[name].lengths["64"]
        assert item.rel_error > 0.5
        assert item.fingerprint_error > 0.5


def test_correct_only_on_the_first_half_names_the_wrong_eighths(world):
    text = reasons(world, "first_half")
    assert world.reports["first_half"].verdict == "fail"
    assert "T=128: eighths 5 (1), 6 (1), 7 (1), 8 (1) of the sequence differ" in text
    item = world.reports["first_half"].lengths["128"]
    assert max(item.rel_error_eighths[:4]) < REL_ERROR_THRESHOLD


def test_stale_cache_fails_the_timed_run_check(world):
    assert "timed forwards checked do not match the reference" in reasons(world, "stale_cache")


def test_replaying_fingerprints_in_the_harness_code_is_caught(world):
    report = world.reports["forge_reply"]
    assert report.verdict == "fail"
    assert "timed forwards checked do not match the reference" in reasons(world, "forge_reply")


# Replies the parent could not read made evaluate() raise (ValueError, RecursionError,
# OverflowError): the validator's worker took that for a fault of its own, retried three times and
# gave the submission up without ever failing it. Each now fails the fork, naming what was malformed.
@pytest.mark.parametrize(
    ("name", "during", "malformed"),
    [
        (
            "forged_huge_integer",
            "loading the fork's layer",
            "malformed message header: ValueError: Exceeds the limit (4300 digits) for integer string conversion",
        ),
        (
            "forged_deep_nesting",
            "loading the fork's layer",
            "malformed message header: RecursionError: maximum recursion depth exceeded",
        ),
        ("forged_peak", "warm-up at T=64", f"peak_bytes={str(FORGED_BYTES)[:57]}... is not a byte count"),
        ("forged_memory", "reading memory use", f"peak_bytes={str(FORGED_BYTES)[:57]}... is not a byte count"),
    ],
)
def test_a_forged_reply_the_parent_cannot_read_fails_the_fork(world, name, during, malformed):
    report = world.reports[name]
    assert report.verdict == "fail"
    [reason] = [reason for reason in report.reasons if "the child broke the protocol" in reason]
    assert f"the child broke the protocol during {during}" in reason and malformed in reason, reason


def test_wrong_only_at_one_length_fails_there(world):
    report = world.reports["wrong_at_length"]
    assert report.verdict == "fail"
    assert report.lengths["64"].correct is True
    assert report.lengths["128"].correct is False
    assert all(r.startswith("T=128") for r in report.reasons), report.reasons
    assert report.weighted_score == 0.0


# --- timing cannot be faked ------------------------------------------------------------------


def fastest_possible(item, seconds: float) -> float:
    """tokens/s of a run that took ``seconds``, less everything the harness subtracts from a round trip."""
    return item.seq_len / (seconds - item.subtracted_us / 1e6)


# Caching by input gains nothing: every timed input was fresh, so every run paid the miss.
# Patched timers do not change the measurement: every run is credited with its real sleep.
@pytest.mark.parametrize(("attack", "seconds"), [("cache_by_input", MISS_SECONDS), ("timers", SLEEP_SECONDS)])
def test_a_run_is_credited_with_no_less_than_the_time_it_took(world, attack, seconds):
    report = world.reports[attack]
    assert report.verdict == "pass", report.reasons
    item = report.lengths["64"]
    assert item.tokens_per_sec_max <= fastest_possible(item, seconds)
    assert item.subtracted_us / 1e6 < seconds / 4


def test_several_forwards_per_request_are_timed_and_verified_one_by_one(world):
    report = world.reports["timers_batched"]
    assert report.verdict == "pass", report.reasons
    item = report.lengths["64"]
    # Every forward of every request was checked.
    assert item.forwards_per_request == BATCHED_FORWARDS
    assert item.runs_verified == 3 * BATCHED_FORWARDS and item.requests_verified == 3
    # No forward is credited with less than its real sleep (the request's time is divided by the count).
    assert item.tokens_per_sec_max <= fastest_possible(item, BATCHED_SLEEP_SECONDS)


def test_an_output_right_only_in_the_sums_the_fingerprint_takes_is_caught(world):
    # The fork puts each eighth's weighted sum on one token and zeros elsewhere (what o_proj of its
    # summed inputs gives, skipping o_proj over the sequence) and sends the real output when asked.
    report = world.reports["sums_on_few_tokens"]
    assert report.verdict == "fail"
    item = report.lengths["64"]
    assert item.rel_error < REL_ERROR_THRESHOLD and item.fingerprint_error > 0.5
    assert (
        "T=64: 3 of 3 timed forwards checked match the reference in their signed sums but not in their absolute values"
    ) in reasons(world, "sums_on_few_tokens")


@pytest.mark.parametrize(
    "name",
    [
        # The fork runs only the first forward of each request and returns zeros for the others.
        "first_only",
        # The fork nudges the low bits of every value it reports so that the signs would all be +1,
        # and runs each forward on its noise alone, as a fork running a request's forwards in one
        # batch would.
        "presumed_signs",
    ],
)
def test_forwards_not_run_on_their_chained_inputs_are_caught(world, name):
    report = world.reports[name]
    assert report.verdict == "fail"
    item = report.lengths["64"]
    assert item.forwards_per_request == 4 and item.runs_verified == 12
    assert "T=64: 9 of 12 timed forwards checked do not match the reference" in reasons(world, name)


# --- containment -----------------------------------------------------------------------------


def test_flooding_stdout_is_cut_off(world):
    report = world.reports["flood"]
    assert report.verdict == "fail"
    assert "wrote over 4 MiB to stdout/stderr" in reasons(world, "flood")
    assert len(report.log_tail) <= 8000
    assert world.seconds["flood"] < 120


# A fork that sleeps forever in its forward, or hangs at import, is stopped at the limit of
# that stage (the warm-up's, the load's), failed, and the evaluation ends in bounded time.
@pytest.mark.parametrize(
    ("attack", "reason", "seconds"),
    [
        ("sleep_forever", "T=64: warm-up at T=64 timed out", 90),
        ("hang_at_import", "loading the fork's layer (limit 5 s) timed out", 60),
    ],
)
def test_a_fork_that_hangs_is_stopped_at_its_stages_limit(world, attack, reason, seconds):
    assert world.reports[attack].verdict == "fail"
    assert reason in reasons(world, attack)
    assert world.seconds[attack] < seconds


def test_a_length_that_never_returns_stops_the_evaluation_before_any_timing(world):
    # Every length is prepared before the timed rounds: T=64 was ready, T=128 hung in its warm-up.
    report = world.reports["sleep_at_length"]
    assert report.verdict == "fail"
    assert "T=128: warm-up at T=128 timed out" in reasons(world, "sleep_at_length")
    shorter = report.lengths["64"]
    assert shorter.error == "not timed: the evaluation stopped at T=128"
    assert shorter.tokens_per_sec is None and shorter.timed_runs == 0 and shorter.correct is not True
    assert world.seconds["sleep_at_length"] < 90


def test_background_processes_die_with_the_sandbox(world):
    assert "BACKGROUND-STARTED" in world.reports["background"].log_tail
    assert world.survivors["sandboxed"] == []
    assert world.reports["background"].verdict == "pass", world.reports["background"].reasons


def test_background_processes_are_found_and_killed_without_a_sandbox(world):
    report = world.reports["background_unsandboxed"]
    assert report.sandbox.startswith("UNSANDBOXED")
    assert any("UNSANDBOXED" in note for note in report.notes)
    assert "outlived it and were killed" in reasons(world, "background_unsandboxed")
    assert world.survivors["unsandboxed"] == []


def test_no_network_not_even_to_this_host(world):
    log = world.reports["network"].log_tail
    assert "NETWORK-BLOCKED 127.0.0.1" in log and "NETWORK-BLOCKED internet" in log
    assert "NETWORK-CONNECTED" not in log
    assert world.listener_accepted == 0


def test_no_abstract_unix_socket_of_this_host(tmp_path):
    # An abstract socket has no file for the private root to leave out: the network namespace,
    # which holds the abstract namespace, is what keeps the fork from it.
    reason = sandbox_unavailable_reason(tmp_path)
    if reason is not None:
        pytest.skip(f"namespaces unavailable here: {reason}")
    name = f"quasar-abstract-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind("\0" + name)
        listener.listen()
        listener.setblocking(False)
        fork = write_hostile_fork(tmp_path / "fork", "abstract_socket", name=name)
        report = evaluate(fork, 64, None, FAST_CPU)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert "ABSTRACT-REFUSED" in report.log_tail and "ABSTRACT-CONNECTED" not in report.log_tail, report.log_tail
    assert report.verdict == "pass", report.reasons


def test_the_callers_environment_and_wallets_are_out_of_reach(world):
    report = world.reports["secrets"]
    everything = report.to_json() + report.log_tail
    assert SECRET_TOKEN not in everything and SECRET_COLDKEY not in everything
    assert f"SECRET-UNREADABLE {world.paths['wallet_file']}" in report.log_tail
    assert "'HOME': '/sandbox/home'" in report.log_tail
    assert "GITHUB_TOKEN" not in report.log_tail and "WALLET_PATH" not in report.log_tail


def test_writes_outside_the_sandbox_do_not_happen(world):
    log = world.reports["write_outside"].log_tail
    # The private root is read-only but for HOME, /tmp and /dev/shm, which are the sandbox's own.
    for path in (world.paths["system_file"], "/sandbox/fork/fla/layers/quasar.py", "/sandbox/harness/child.py"):
        assert f"WRITE-REFUSED {path}" in log
    # Paths under /tmp land in the sandbox's own /tmp and vanish with it: nothing reaches the host.
    assert not world.paths["outside_file"].exists()
    assert not world.paths["tmp_file"].exists()
    assert not world.paths["system_file"].exists()
    assert world.fork_layer_digest_after == world.fork_layer_digest_before
    assert world.reports["write_outside"].verdict == "pass", world.reports["write_outside"].reasons


def test_a_fork_cannot_poison_the_triton_cache_seed_for_later_evaluations(world):
    # The seed is mounted read-only; the child works on its own copy of it (in its private HOME).
    log = world.reports["write_outside"].log_tail
    assert "WRITE-REFUSED /sandbox/triton-seed/entry/kernel.cubin" in log
    assert "WRITE-REFUSED /sandbox/triton-seed/new/kernel.cubin" in log
    seed = world.paths["triton_seed"]
    assert sorted(p.relative_to(seed).as_posix() for p in seed.rglob("*")) == ["entry", "entry/kernel.cubin"]
    assert (seed / "entry" / "kernel.cubin").read_bytes() == b"compiled by the starter fork"
    assert any("Triton cache seeded with 1 file(s)" in note for note in world.reports["write_outside"].notes)


def test_out_of_memory_is_a_verdict_not_a_crash(world):
    report = world.reports["oom"]
    assert report.verdict == "fail"
    assert "OOM at T=128, peak unknown" in report.reasons
    assert report.lengths["64"].status == "ok" and report.lengths["64"].correct
    assert report.lengths["128"].status == "oom"
    assert report.lengths["256"].status == "skipped"
    assert "the target length T=256 was not measured" in report.reasons


# --- timed forwards are as exact as the checked one ------------------------------------------


def test_a_fork_exact_only_where_the_correctness_run_used_to_be_is_caught(world):
    # The attack of issue 32: 2.2% RMS noise on every forward but the repeats and the request right
    # after the warm-up (FAST_CPU's warm-up is two requests), where the correctness run used to be. The
    # correctness request is one of the timed requests now, drawn in secret: it carries the noise
    # too, and so does every timed request checked.
    report = world.reports["sloppy_timed"]
    assert report.verdict == "fail"
    for key in ("64", "128"):
        item = report.lengths[key]
        assert item.correct is False
        # Its correctness output is exact only where the draw put the correctness request on the
        # place the fork guessed (one in ten here), else 2.2% off (0.024); the other timed
        # requests checked are off either way.
        assert item.rel_error < 0.03, item.rel_error
        assert item.request_error > REQUEST_TOLERANCE, item.request_error
        assert any(
            reason.startswith(f"T={key}: ") and "less exact than the correctness threshold allows" in reason
            for reason in report.reasons
        ), report.reasons


def test_a_fork_that_turns_sloppy_once_checked_is_caught_in_the_requests_after(tmp_path, monkeypatch):
    # The child learns which request was the correctness request only when its output is asked
    # for; from then on this fork adds 2.2% noise. Drawn here to come first (round 0, place 0),
    # every later timed request is sloppy, and checked.
    from quasar.evaluate import harness

    monkeypatch.setattr(harness.secrets, "randbelow", lambda bound: 0)
    fork = write_hostile_fork(tmp_path / "fork", "sloppy_after_check", noise=0.022)
    report = evaluate(fork, 64, None, replace(FAST_CPU, min_timed_runs=6, max_timed_runs=6))
    item = report.lengths["64"]
    assert item.timed_runs == 6 and item.requests_verified == 6
    assert item.rel_error < REL_ERROR_THRESHOLD, "the correctness request itself was exact"
    assert report.verdict == "fail"
    assert item.request_error > REQUEST_TOLERANCE
    assert "timed requests checked are less exact than the correctness threshold allows" in "\n".join(report.reasons)


# --- isolation between evaluations -----------------------------------------------------------


def test_the_kernel_keyring_is_closed_so_nothing_is_left_for_a_later_evaluation(world):
    log = world.reports["keyring"].log_tail
    for call in ("add_key", "request_key", "keyctl"):
        assert f"SYSCALL {call} -1 EPERM" in log, log
    assert KEYRING_SECRET not in world.reports["keyring"].to_json().replace(f"{KEYRING_SECRET!r}", "")
    assert world.reports["keyring"].verdict == "pass", world.reports["keyring"].reasons


def test_the_seccomp_filter_refuses_what_a_fork_never_needs(world):
    report = world.reports["syscalls"]
    assert "seccomp" in report.sandbox
    log = report.log_tail
    # ptrace(TRACEME) and perf_event_open would succeed or fail otherwise without the filter.
    for call in (
        "unshare",
        "setns",
        "clone_newuser",
        "ptrace",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "mount",
        "finit_module",
        "memfd_secret",
    ):
        assert f"SYSCALL {call} -1 EPERM" in log, (call, log)
    assert "SYSCALL clone3 -1 ENOSYS" in log
    assert report.verdict == "pass", report.reasons


def test_the_hosts_etc_and_sys_are_out_of_sight(world):
    log = world.reports["host_files"].log_tail
    hostname = Path("/etc/hostname").read_text().strip() if Path("/etc/hostname").exists() else None
    if hostname:
        # As a word: a short hostname ("vm") also occurs inside Triton's own warnings' words.
        assert not re.search(rf"\b{re.escape(hostname)}\b", log.replace("HOST-READ /etc/hostname 'sandbox\\n'", ""))
    assert "HOST-READ /etc/hostname 'sandbox\\n'" in log
    for path in (
        "/etc/machine-id",
        "/etc/shadow",
        "/etc/ssh",
        "/sys/class/net",
        "/sys/fs/cgroup",
        "/sys/class/dmi/id",
        "/sys/kernel",
        "/sys/devices/virtual",
    ):
        assert f"HOST-UNREADABLE {path} No such file or directory" in log, (path, log)
    assert "HOST-READ /etc/hosts '127.0.0.1 localhost\\n::1 localhost\\n'" in log


@pytest.mark.parametrize("name, limit", [("memory_hog", "cgroup"), ("memory_hog_watchdog", "memory watchdog")])
def test_memory_over_the_sandboxs_limit_ends_the_evaluation(world, name, limit):
    report = world.reports[name]
    assert limit in report.sandbox, report.sandbox
    assert report.verdict == "fail"
    assert "HOG-HELD" not in report.log_tail
    assert f"sandbox's {SMALL_MEMORY >> 20:,} MiB" in reasons(world, name) or (
        f"over the sandbox's limit of {SMALL_MEMORY >> 20:,} MiB" in reasons(world, name)
    ), report.reasons


@pytest.mark.parametrize("how", ["mapping", "memfd"])
def test_shared_memory_over_the_sandboxs_limit_ends_the_evaluation_under_the_watchdog(tmp_path, how):
    # Shared memory is not anonymous: a watchdog summing anonymous memory alone let a fork hold
    # 3 GiB in a shared mapping or a memory file under a limit of 1.5 GiB, and pass.
    reason = sandbox_unavailable_reason(tmp_path)
    if reason is not None:
        pytest.skip(f"namespaces unavailable here: {reason}")
    fork = write_hostile_fork(tmp_path / "fork", "shared_memory_hog", hog_bytes=HOG_BYTES, how=how)
    policy = SandboxPolicy(memory_bytes=SMALL_MEMORY, cgroup_path=str(tmp_path / "no-such-cgroup"))
    report = evaluate(fork, 64, None, replace(FAST_CPU, policy=policy))
    assert "memory watchdog" in report.sandbox, report.sandbox
    assert report.verdict == "fail"
    assert f"over the sandbox's limit of {SMALL_MEMORY >> 20:,} MiB" in "\n".join(report.reasons), report.reasons


def test_shared_memory_segments_no_process_maps_are_not_kept_for_the_fork(tmp_path):
    # A System V segment outlives its mappings, where no watchdog sees it: a fork wrote three of
    # 1 GiB one at a time, detached each, and held 3 GiB under a limit of 1.5 GiB. The sandbox's
    # IPC namespace removes a segment once no process maps it.
    reason = sandbox_unavailable_reason(tmp_path)
    if reason is not None:
        pytest.skip(f"namespaces unavailable here: {reason}")
    fork = write_hostile_fork(tmp_path / "fork", "sysv_memory_hog", segments=3, segment_bytes=1 << 30)
    policy = SandboxPolicy(memory_bytes=SMALL_MEMORY, cgroup_path=str(tmp_path / "no-such-cgroup"))
    report = evaluate(fork, 64, None, replace(FAST_CPU, policy=policy))
    assert "memory watchdog" in report.sandbox, report.sandbox
    assert "SEGMENTS-KEPT 0 of 3" in report.log_tail, report.log_tail
    assert report.verdict == "pass", report.reasons


def test_a_fork_lowering_its_out_of_memory_preference_is_failed_under_the_watchdog(tmp_path):
    # Without CAP_SYS_RESOURCE (a Docker container's root lacks it) the 1000 the sandbox sets is no
    # floor: a fork set 0, and without a cgroup bounding all of its memory the host's killer, short
    # of memory the watchdog cannot see (docs/validator.md), would have taken the validator or a
    # neighbour's evaluation first. A read-only /proc stopped the write, but CUDA does not start in
    # one; the watchdog fails the fork instead.
    reason = sandbox_unavailable_reason(tmp_path)
    if reason is not None:
        pytest.skip(f"namespaces unavailable here: {reason}")
    fork = write_hostile_fork(tmp_path / "fork", "oom_score_adj")
    policy = SandboxPolicy(cgroup_path=str(tmp_path / "no-such-cgroup"))
    report = evaluate(fork, 64, None, replace(FAST_CPU, policy=policy))
    assert "memory watchdog" in report.sandbox, report.sandbox
    if "own uid" not in report.sandbox:
        pytest.skip("the sandbox has no uid of its own here (not root): docs/validator.md")
    assert report.verdict == "fail", report.log_tail
    said = "a process of the fork lowered its out-of-memory preference (oom_score_adj) from 1000 to 0"
    assert any(said in reason for reason in report.reasons), report.reasons


@pytest.mark.parametrize("name, module", [("foreign_requests", "requests"), ("foreign_bittensor", "bittensor")])
def test_the_validators_own_packages_are_not_importable(world, name, module):
    report = world.reports[name]
    assert report.verdict == "fail"
    assert f"the fork imports {module!r}, which is not part of the evaluation environment" in reasons(world, name)
    assert report.environment.startswith("torch ")


def test_the_forks_text_cannot_restyle_or_forge_the_report(world):
    from rich.console import Console

    report = world.reports["markup"]
    assert report.verdict == "fail"
    text = reasons(world, "markup")
    assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text
    assert "[bold green]verdict PASS[/]" in text
    console = Console(record=True, width=80, force_terminal=True, color_system="truecolor", file=io.StringIO())
    render_report(report, console)
    shown = console.export_text(styles=False)
    # Printed as the text it is (folded at 80 columns), no escape of the fork's reaching the terminal.
    assert "[bold green]verdict PASS[/]" in " ".join(shown.split())
    assert "]0;pwned" not in console.export_text(styles=True).replace("?]0;pwned", "")
    verdict_lines = [line for line in shown.splitlines() if line.strip().startswith("verdict")]
    assert verdict_lines and all("FAIL" in line for line in verdict_lines)


def test_a_dead_childs_last_words_are_in_the_reason(world):
    text = reasons(world, "exit_at_forward")
    assert world.reports["exit_at_forward"].verdict == "fail"
    assert "the child process exited during warm-up at T=64, exit status 3" in text
    assert LAST_WORDS in text


def _processes_named(name: str) -> int:
    return len(processes_where("comm", lambda comm: comm.strip() == name.encode()))


def test_an_exhausting_neighbour_cannot_sink_an_honest_evaluation(tmp_path, monkeypatch):
    # Two evaluations side by side, as a validator with two GPUs runs them; each sandbox may hold
    # 96 tasks. The hostile one starts processes until refused and holds them while the honest
    # one starts and runs: with a uid and a cgroup of its own, the honest one is unaffected (with
    # one uid for both, its child could not even start).
    name = f"qexhaust{os.getpid() % 10000}"
    policy = SandboxPolicy(max_processes=96)
    # As on a validator, the honest child starts threads of its own (OpenMP, OpenBLAS).
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    honest = tmp_path / "honest"
    write_starter_fork(honest)
    hostile = write_hostile_fork(tmp_path / "hostile", "exhaust_processes", most=10_000, name=name, hold_seconds=40)
    with ThreadPoolExecutor(max_workers=2) as pool:
        exhausting = pool.submit(evaluate, hostile, 64, None, replace(FAST_CPU, policy=policy, load_timeout_s=90))
        # Until the hostile one is refused: its count stops growing.
        deadline, held, previous = time.monotonic() + 60, 0, -1
        while (held < 40 or held != previous) and time.monotonic() < deadline:
            previous = held
            time.sleep(1.0)
            held = _processes_named(name)
        honest_report = pool.submit(evaluate, honest, 64, None, replace(FAST_CPU, policy=policy)).result()
        still_held = _processes_named(name)
        hostile_report = exhausting.result()
    assert held >= 40 and still_held == held, (held, still_held)
    assert "FORK-REFUSED after" in hostile_report.log_tail
    assert honest_report.verdict == "pass", honest_report.reasons
    uids = {report.sandbox.split("own uid ")[1].split(",")[0] for report in (honest_report, hostile_report)}
    assert len(uids) == 2 and "65534" not in uids
    assert _processes_named(name) == 0


def test_refuses_to_run_unsandboxed_unless_allowed(tmp_path):
    write_starter_fork(tmp_path / "fork")
    options = replace(FAST_CPU, policy=SandboxPolicy(force_unsandboxed=True))
    report = evaluate(tmp_path / "fork", 64, None, options)
    assert report.verdict == "fail"
    assert any("refusing to run the fork without a sandbox" in r and "--allow-unsandboxed" in r for r in report.reasons)
    assert all(item.status == "skipped" for item in report.lengths.values())


def test_command_line_json_report(world):
    done = world.commands["evaluate"]
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["verdict"] == "pass" and data["reasons"] == []
    assert data["import_check"]["ok"] is True
    item = data["lengths"]["64"]
    for key in ("tokens_per_sec", "cv", "peak_vram_mb", "finite", "rel_error", "correct"):
        assert key in item
    assert item["correct"] is True and item["finite"] is True
    assert data["measured_tokens_per_sec"] == item["tokens_per_sec"]
    # verified = min(claimed 1, measured) in league 100k (x 0.5)
    assert data["weighted_score"] == pytest.approx(0.5)
    assert data["recommended_claim"] <= item["tokens_per_sec"]
    assert "cpu: for tests and small lengths only, not a benchmark" in data["notes"]


def test_local_validator_json_is_the_same_report(world):
    done = world.commands["local_validator"]
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    report = EvaluationReport.from_dict(data)
    assert report.verdict == "pass" and report.seq_lens == [64] and report.target_seq_len == 64
    assert report.lengths["64"].correct is True
    assert report.weighted_score == pytest.approx(0.5 * report.measured_tokens_per_sec)


HOLDER = """
import sys, time
from quasar.evaluate.sandbox import SandboxedChild, SandboxPolicy
child = SandboxedChild(sys.argv[1], "cpu", SandboxPolicy()).__enter__()
child.channel.send({"op": "load", "fork_dir": child.fork_dir, "weights_seed": 1})
child.channel.recv(deadline=time.monotonic() + 120)
print("LOADED", flush=True)
time.sleep(600)
"""


def test_the_sandbox_dies_with_a_killed_parent(world, tmp_path):
    marker = f"quasar-orphan-{os.getpid()}"
    fork = write_hostile_fork(tmp_path / "fork", "background", marker=marker)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(fork)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOADED"
        assert processes_with(marker), "the fork's background processes should be running by now"
        holder.kill()
        holder.wait(timeout=10)
        deadline = time.monotonic() + 10
        while processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_with(marker) == []
    finally:
        holder.kill()
