"""Evaluate a checked-out fork: import check, sandboxed benchmark, correctness, claim, score.

:func:`evaluate` is what a validator runs on a submission and what ``scripts/local_validator.py``
runs for a miner, so a miner sees before submitting what a validator will see.

Threat model: the fork's code is hostile. It runs only in a sandboxed child (sandbox.py) and can
patch anything inside that process (``time``, ``torch.cuda.Event``, ``torch.cuda.synchronize``,
the harness's own child code), so nothing the child says is believed unchecked:

Timing. The parent times each request with its own clock (``time.perf_counter_ns``) around one
request/reply on the pipe: it sends ``run(input_seed, basis_seed, count)`` with seeds drawn at
that moment from ``secrets``. The child fills the request's buffers from the seeds (workload.py:
noise ``[count, T, 512]``, fingerprint bases) and runs ``count`` forwards one after another
under bf16 autocast: forward ``i``'s input is ``noise[i]`` times a ±1 sign per hidden channel
drawn from the bits of forward ``i - 1``'s fingerprint, and it replies with every fingerprint,
read back in the request's one synchronisation. No input exists before the previous forward's
whole output does (every channel's sign enters every projection of the input, so the noise,
known from the start, lets no work begin early): the forwards cannot be computed ahead, reused
or batched into one wider launch, whatever the fork does to the harness's code,
synchronisation or timers, and the reply cannot come before all of them are done. A request's
time per forward is its round trip less the harness's cost, divided by ``count``; the figure is
the median over requests.

On CUDA a request is one CUDA graph. Eager forwards at 512 to 2,048 tokens are bound by the host
CPU launching kernels, whose speed varied by 20–40% between processes on a virtual machine, so
no eager timing agreed within 2% there; a graph's replay is the GPU's time alone (87 µs a
forward at 512 tokens on an H100, requests within about 1% of each other; benchmarks/RESULTS.md).
After a length's first warm-up request, one forward run eagerly so the fork's Triton kernels
compile and tune, the child captures a whole request (signs, forwards, fingerprints) and replays
it from then on: a request costs the host a few launches and one synchronisation, whatever its
count. A forward that cannot be captured (one that synchronises with the host, say), or whose replay
disagrees with its eager forwards, runs eagerly, and the report says so and why (``timing``).

``count`` depends on the length alone (:func:`forwards_per_request`): on CUDA as many forwards
as make :data:`DEFAULT_TOKENS_PER_REQUEST` tokens (2^18), at most ``max_forwards_per_request``
(256) and :data:`MAX_TOKENS_PER_REQUEST` tokens, so 512 and 1,024 tokens run 256 forwards a
request, 2,048 run 128, 100k three and 1M one, in every evaluation; on CPU one. Many forwards a
request make the share of the host's round trip small: 63–260 µs a request on an H100 VM
(the graph's launch and the synchronisation, varying between processes), under 1% of a request
of 256 forwards at 512 tokens (benchmarks/RESULTS.md). The count is never taken from a measured
speed, so every evaluation times the same requests. What the harness adds (pipe,
messages, filling the buffers, the signs, the fingerprints, the synchronisation) is calibrated
before any fork code is loaded: the same requests, sizes and count with a stand-in for the layer
that returns a fixed output, captured the same way on CUDA; the minimum over several runs is
subtracted. It is trusted and conservative: the fork is never credited with more than that
minimum; calibrations interleaved with the timed requests can only lower it; it never exceeds
half the fastest round trip, so a calibration slowed by a noisy moment cannot inflate a figure;
and it is the graph's cost even where the fork's forwards ran eagerly (the child's word on how
they ran is not trusted), so an eager fork pays the harness's host launches itself. A fork may
make the harness's own work faster in its process; its gain is bounded by that calibrated cost
(``subtracted_us`` per forward in the report).

Tamper evidence. The fork sees and can patch everything in its process, the harness's own child
code included: so nothing the child knows before or during a forward tells it which requests
will be checked, or how. The fingerprint of an output ``[1, T, 512]`` is, for each eighth of the
sequence, 32 random ±1 projections (workload.py) under a basis of its own per forward, from the
request's basis seed. After the child's last reply, the parent draws which timed requests to
check (:func:`requests_to_verify`: 4, or enough for :data:`MAX_VERIFIED` forwards up to
:data:`VERIFY_ALL_UP_TO` tokens; at the target length enough that a fork degrading just over half
of the timed requests, what it takes to move their median, escapes with probability at most
:data:`ESCAPE_BOUND`, 0.1%: 10 of 100 or more) and recomputes the reference output
(``QuasarAttentionReference``, float32) of every forward of each, on the input the child had to
use: the noise rebuilt from the seed on the same device, times the signs of the fingerprint the
child reported for the forward before (integer arithmetic, exact on both sides). Each eighth's
projections estimate that eighth's error (their mean square), so an output that is zeros, noise,
stale (a cache), or wrong on any part of the sequence fails (:data:`FINGERPRINT_TOLERANCE`, per
forward and eighth), and so does a forward run on any other input than the chain says; and all
the projections of a request together estimate its error within about 4%, which must stay under
:data:`REQUEST_TOLERANCE` (1.15 × the correctness threshold): a timed request is held as exact as
the correctness request, up to that margin. The parent sees only a request's total time, so a
fork gains from any forward it skips or spoils in a request; checking whole requests keeps the
bound of single forwards. The chance that a fork degrading a share ``s`` of ``n`` timed requests
escapes ``k`` checks is ``C(n - sn, k) / C(n, k)`` (about ``(1 - s)^k``; :func:`escape_probability`,
in the report per length). At a length whose requests are one forward (a million tokens on CUDA),
the seeds of every request it may time are drawn when the evaluation starts, and the expected
fingerprints of requests at places drawn at random among them are computed while the fork's
kernels compile (:class:`ReferenceWork`); the draw takes from those, and stays uniform. Layer
weights come from a seed drawn per evaluation.

Correctness. One timed request of each length, at a place drawn at random among them (its
round, and its place in the round), runs on seeds drawn when the evaluation starts; only after it
ran does the parent ask for its last forward's whole output (written by the child into a shared
memory file, read by the parent after the child is gone where it is large:
:data:`COPY_OUTPUTS_UP_TO`) and run the same seeds once more, untimed. The parent compares the
output with the reference (computed while the child warms up where the request is one forward) over
the whole sequence, each eighth, and each 64-token block (relative to the sequence's RMS, which
catches a wrong tail that an eighth would dilute), checks it is finite, checks it is the output
the request fingerprinted, and that the repeat's fingerprints agree. The threshold
:data:`REL_ERROR_THRESHOLD` = 2e-2: the honest starter fork under bf16 autocast is at 0.95e-2 to
0.98e-2 against the float32 reference, on CPU and on an H100 alike, at every length from 64 to 1M
(benchmarks/RESULTS.md); zeros, noise or a skipped part give 0.3 and more.

Stability. On CUDA the parent and the child busy-poll the pipe (start.py's ``GPU_SPIN_SECONDS``) rather
than sleep between messages, so no request pays a scheduler wake-up or a cooled-down core, and the
child and the parent's timing thread each run on a physical core of their own, never SMT siblings
of each other, chosen from the GPU's index so that parallel evaluations on several GPUs get
distinct cores (pinning.py; the parent's thread gets its CPUs back afterwards). The warm-up lasts
``warmup_runs`` requests at each length, at least two (the capture after the first), so that
compilation and the allocator's growth are over, and, on CUDA, until ``warmup_seconds`` (1 s) of
back-to-back requests have passed since the first length's began, so that the GPU's clock ramp is
too (a count of warm-up forwards was 10 ms at 100k tokens; a second at every length added 4 s to an
evaluation whose timed requests all come after every length's warm-up). Every length is warmed up
first, shortest first; then the timed requests (the correctness request among them) run in
:data:`TIMED_ROUNDS` rounds over all the lengths, each length filling its share of
``timed_seconds`` (2 s in all, at least ``min_timed_runs`` requests) in every round. On an H100 VM
whole windows of a few seconds ran 2-3% slow now and then (every request of the window, its fastest
included); timed in one window, a length took such a slowdown whole and five evaluations disagreed
by 3% at 512 or 1,024 tokens (benchmarks/RESULTS.md); spread over rounds about ten seconds apart, a
slow window touches a quarter of a length's requests and the median passes over it. The child keeps
every length's buffers and graphs until it exits, so a length's peak memory is reported above what
was allocated before its warm-up (the inputs of its requests, which the harness allocates then, and
the fork's forwards).

On the CPU, a fork whose forward launches Triton kernels (a real fla tree's modules do, wherever
their tensors are) fails at its first length with one line saying it needs a GPU (status
``needs-gpu``), and no other length is tried. A fork importing a module that neither it nor the
evaluation environment has fails with a reason naming the module (:func:`missing_module_reason`).

Out of memory at a length is a result ("OOM at T=…, peak …"), not a crash; longer lengths are
then skipped. A length whose float32 reference does not fit in the parent's device memory fails
as unverifiable. Every length, the load and the whole evaluation have wall-time limits.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from quasar.evaluate import pinning, protocol, workload
from quasar.evaluate.report import (
    ERROR,
    FAIL,
    NEEDS_GPU,
    OK,
    OOM,
    PASS,
    SKIPPED,
    TIMEOUT,
    EvaluationReport,
    ImportCheck,
    LengthResult,
    Timings,
    clean_text,
)
from quasar.evaluate.sandbox import (
    SandboxedChild,
    SandboxError,
    SandboxPolicy,
    SandboxUnavailable,
)
from quasar.evaluate.environment import EVALUATION_PACKAGES, evaluation_environment
from quasar.evaluate.start import SandboxStart, evaluation_lengths

logger = logging.getLogger(__name__)

DEFAULT_SEQ_LENS = (512, 1024, 2048)
MIN_SEQ_LEN = 64
MAX_SEQ_LEN = 1 << 24
# CPU runs exist for tests and small lengths; they are not a benchmark.
CPU_MAX_SEQ_LEN = 65536
CPU_NOTE = "cpu: for tests and small lengths only, not a benchmark"

# Correctness (see the module docstring).
REL_ERROR_THRESHOLD = 2e-2
BLOCK_TOKENS = 64
BLOCK_ERROR_THRESHOLD = 2 * REL_ERROR_THRESHOLD
# A timed forward's fingerprint estimates the error of each eighth with the noise of a mean square
# of workload.FINGERPRINT_DIRECTIONS samples: twice the threshold there catches a forward that
# skipped or spoiled part of the sequence, and never an honest one.
FINGERPRINT_TOLERANCE = 2 * REL_ERROR_THRESHOLD
# A checked request's error, estimated from every projection of every forward in it (at least
# 8 x FINGERPRINT_DIRECTIONS = 256 samples, one standard deviation about 4% of the estimate):
# timed requests are held to the correctness threshold plus that noise's margin, so a fork that is
# exact where it is checked in full and sloppier where it is timed gains at most this much slack.
REQUEST_TOLERANCE = 1.15 * REL_ERROR_THRESHOLD
# Two runs on the same input (deterministic kernels agree exactly).
REPEAT_TOLERANCE = REL_ERROR_THRESHOLD / 4
# The output sent for the check against the run's own fingerprint: the same tensor, up to rounding.
CONSISTENCY_TOLERANCE = 1e-3

# Correctness outputs come back through a shared memory file (protocol.SharedArea, a region per
# length); one up to this size is copied out when it arrives, a larger one is read in place once the
# child is gone and nothing can write to it any more (a copy of 1 GiB at a million tokens saved).
COPY_OUTPUTS_UP_TO = 64 << 20

# Which timed requests are checked against the reference, every forward of each (see the docstring).
VERIFY_ALL_UP_TO = 16384
MAX_VERIFIED = 32
VERIFY_SAMPLE = 4
# At the target length, as many requests are checked as make the chance that a fork degrading just
# over half of the timed requests (enough to move the median) escapes every check at most this.
ESCAPE_BOUND = 1e-3
# Timed requests of one forward whose expected fingerprints the parent computes ahead, while the
# fork's kernels compile (ReferenceWork): twice the 10 a length of 100 to 200 timed requests needs,
# so that most of those drawn are among them.
AHEAD_REQUESTS = 24
# Forwards of a checked request whose reference runs as one batch make at most this many tokens.
REFERENCE_BATCH_TOKENS = 1 << 18

# Forwards per request (forwards_per_request): on CUDA as many as make this many tokens, within
# max_forwards_per_request; at most MAX_TOKENS_PER_REQUEST tokens in all (bounds a request and
# its verification).
DEFAULT_TOKENS_PER_REQUEST = 1 << 18
MAX_TOKENS_PER_REQUEST = 1 << 21
# The count the parent may ask for; a reply's fingerprints must fit in protocol.MAX_HEADER_BYTES.
MAX_FORWARDS_PER_REQUEST = 256

# Calibration of the harness's own cost per request, before fork code is loaded, at each length's
# count of forwards: the minimum of CALIBRATION_RUNS after CALIBRATION_WARMUP.
CALIBRATION_WARMUP = 2
CALIBRATION_RUNS = 7
# The timed requests of every length run in this many rounds over the lengths (see the docstring).
TIMED_ROUNDS = 4
# A forward time is never reported below this (calibration noise at tiny lengths).
MIN_FORWARD_NS = 1000
# Seconds the child has to import the fork's layer and build it (``load``; its kernels compile
# later, in each length's first forward, under ``length_timeout_s``): a real fla tree's import took
# 9.4-16.4 s on an H100 machine's one pinned core (benchmarks/RESULTS.md, issue 32), the starter
# fork's 0.2-0.4 s; seven times the slowest.
DEFAULT_LOAD_TIMEOUT_S = 120.0
# The longest the load waits for the fork's bytecode, compiled beside the import check (sandbox.py).
PRECOMPILE_WAIT_S = 30.0


class EvaluationInputError(ValueError):
    """The evaluation was asked for something it cannot do; the message names the argument."""


@dataclass(frozen=True)
class EvaluationOptions:
    """How to evaluate: lengths, device, limits, repeat counts, sandbox policy."""

    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    device: str = "cuda"
    timeout_s: float = 3600.0
    length_timeout_s: float = 900.0
    load_timeout_s: float = DEFAULT_LOAD_TIMEOUT_S
    import_profile: str = "core"
    require_cu: bool = False
    # Warm-up requests per length; on CUDA the warm-up also goes on until warmup_seconds have
    # passed since the first length's began.
    warmup_runs: int = 3
    # Timed requests ("runs") per length: as many as fit in timed_seconds, within these bounds.
    min_timed_runs: int = 10
    max_timed_runs: int = 200
    timed_seconds: float = 2.0
    weights_seed: int | None = None
    policy: SandboxPolicy = field(default_factory=SandboxPolicy)
    # Each request runs as many forwards as make this many tokens (forwards_per_request), at most
    # max_forwards_per_request; None: DEFAULT_TOKENS_PER_REQUEST on CUDA, one forward on CPU.
    tokens_per_request: int | None = None
    max_forwards_per_request: int = 256
    warmup_seconds: float = 1.0
    # Pin the child and the parent's timing thread to cores of their own (pinning.py); None: on CUDA only.
    pin_cpus: bool | None = None


def options_from_settings(settings, allow_unsandboxed: bool = False, **changes) -> EvaluationOptions:
    """The options a validator's settings give (quasar/config.py: lengths, device, limits, the
    sandbox's memory, cgroup and allocator settings), with ``changes`` to any field."""
    policy = SandboxPolicy(allow_unsandboxed=allow_unsandboxed, pytorch_cuda_alloc_conf=settings.pytorch_cuda_alloc_conf,
                           memory_bytes=settings.sandbox_memory_mb << 20, cgroup_path=settings.sandbox_cgroup or None)
    values = {"seq_lens": settings.eval_seq_lens, "device": settings.device, "timeout_s": settings.eval_timeout,
              "timed_seconds": settings.eval_timed_seconds, "load_timeout_s": settings.eval_load_timeout,
              "policy": policy}
    return EvaluationOptions(**{**values, **changes})


@dataclass(frozen=True)
class ProgressEvent:
    """A step of an evaluation, for progress displays: ``done`` of ``total`` in ``stage``."""

    stage: str
    seq_len: int | None = None
    done: int = 0
    total: int = 0


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class _Request:
    """One request: its seeds, the fingerprints the child reported (float32 ``[count, 8, K]``), its
    round trip, and the time per forward credited to the fork."""

    input_seed: int
    basis_seed: int
    fingerprints: torch.Tensor
    round_trip_ns: int
    forward_ns: int = 0
    # Its place in its length's pool of seeds drawn ahead (ReferenceWork), if it took one.
    position: int | None = None


@dataclass
class _LengthRun:
    """One length's state: its report entry, timed requests (the correctness request among them),
    the correctness request's output and repeat; the warm-up's request time (plans the timed
    rounds) and the least harness cost seen."""

    result: LengthResult
    timed: list[_Request] = field(default_factory=list)
    check: _Request | None = None
    output: torch.Tensor | _SharedOutput | None = None
    repeat: _Request | None = None
    request_s: float = 0.0
    cost_ns: int = 0
    # Where the correctness output goes in the shared area.
    output_offset: int = 0
    # The correctness request's seeds (drawn before the child exists) and the round it runs in,
    # drawn by this process: nothing the child sees tells it apart from the timed requests.
    check_seeds: tuple[int, int] = (0, 0)
    check_round: int = 0
    # Seeds drawn ahead for the timed requests, in order (lengths of one forward a request; see
    # ReferenceWork), and the expected fingerprints and norms the parent computed for some of them.
    seed_pool: list[tuple[int, int]] = field(default_factory=list)
    precomputed: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


@dataclass
class _SharedOutput:
    """A correctness output left in the shared area, read in place once the child is ``gone``."""

    area: protocol.SharedArea
    offset: int
    dtype: torch.dtype
    shape: list[int]
    gone: threading.Event

    def tensor(self) -> torch.Tensor:
        """The output (waits until no process of the sandbox can write to the area)."""
        self.gone.wait()
        nbytes = math.prod(self.shape) * torch.empty((), dtype=self.dtype).element_size()
        raw = torch.frombuffer(self.area.view(nbytes, self.offset), dtype=torch.uint8)
        return raw.view(self.dtype).reshape(self.shape)


def output_tensor(output: torch.Tensor | _SharedOutput) -> torch.Tensor:
    """A correctness output as a tensor, wherever it was kept."""
    return output.tensor() if isinstance(output, _SharedOutput) else output


# The most of one reason that may come from the child (an error message, its last output lines).
MAX_REASON_CHARS = 600
# How many of the child's last output lines a reason quotes when the child dies.
DEATH_OUTPUT_LINES = 4


class _ChildFailure(Exception):
    """A length or the evaluation failed because of the child; ``message`` is safe to print
    (:func:`clean_text`: it may quote the child)."""

    def __init__(self, status: str, message: str):
        message = clean_text(message, MAX_REASON_CHARS)
        super().__init__(message)
        self.status = status
        self.message = message


def _new_seed() -> int:
    return secrets.randbits(63)


def _weights_seed(options: EvaluationOptions) -> int:
    """The seed of an evaluation's layer weights: the one ``options`` asks for, else a new one."""
    return options.weights_seed if options.weights_seed is not None else _new_seed()


def _mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / (1 << 20)


def check_lengths(seq_lens: Sequence[int], target_seq_len: int, device: str) -> list[int]:
    """The sorted lengths to run (``seq_lens`` plus the target); raises EvaluationInputError."""
    lengths = evaluation_lengths(seq_lens, target_seq_len)
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or not MIN_SEQ_LEN <= length <= MAX_SEQ_LEN:
            raise EvaluationInputError(f"sequence length {length!r}: expected an integer from {MIN_SEQ_LEN} to {MAX_SEQ_LEN}")
        if device == "cpu" and length > CPU_MAX_SEQ_LEN:
            raise EvaluationInputError(f"sequence length {length}: CPU runs are limited to {CPU_MAX_SEQ_LEN} tokens ({CPU_NOTE})")
    return lengths


class _Session:
    """The parent's side of the conversation with one sandboxed child."""

    def __init__(self, child: SandboxedChild, deadline: float):
        self.child = child
        self.deadline = deadline

    def _failure(self, error: Exception, what: str) -> _ChildFailure:
        if isinstance(error, (protocol.ChannelClosed, BrokenPipeError)):
            return _ChildFailure(ERROR, self._death(what))
        if self.child.killed_reason:
            return _ChildFailure(ERROR, self.child.killed_reason)
        if isinstance(error, protocol.ChannelTimeout):
            return _ChildFailure(TIMEOUT, f"{what} timed out")
        return _ChildFailure(ERROR, f"the child broke the protocol during {what}: {error}")

    def _death(self, what: str) -> str:
        """Why the child went away during ``what``: the limit that killed it, or how it ended and
        the last lines it wrote."""
        process = self.child.process
        try:
            status = process.wait(timeout=2) if process is not None else None
        except subprocess.TimeoutExpired:
            status = None
        self.child.drained(timeout=2)
        if self.child.killed_reason:
            return f"{self.child.killed_reason} (during {what})"
        how = ("" if status is None else f", killed by signal {-status}" if status < 0 else f", exit status {status}")
        lines = [line for line in self.child.output.text().splitlines() if line.strip()][-DEATH_OUTPUT_LINES:]
        said = f"; its last output: {' | '.join(line.strip() for line in lines)}" if lines else "; it wrote nothing"
        return f"the child process exited during {what}{how}{said}"

    def request(self, header: dict, deadline: float, what: str, max_payload: int = 0) -> tuple[dict, bytearray | None, int]:
        """Send ``header``, wait for the reply; returns ``(reply, payload, round-trip ns)``."""
        deadline = min(deadline, self.deadline)
        assert self.child.channel is not None
        try:
            start = time.perf_counter_ns()
            self.child.channel.send(header)
            reply, payload = self.child.channel.recv(deadline=deadline, max_payload=max_payload)
            elapsed = time.perf_counter_ns() - start
        except (protocol.ChannelError, OSError) as error:
            raise self._failure(error, what) from None
        if self.child.killed_reason:
            raise _ChildFailure(ERROR, self.child.killed_reason)
        return reply, payload, elapsed


def missing_module_reason(module: str) -> str:
    """Why loading a fork that imports ``module``, which nothing here provides, failed."""
    if module == "fla" or module.startswith("fla."):
        return f"the fork's own module {module} is missing (imported by fla.layers.quasar or what it imports)"
    return (f"the fork imports {module!r}, which is not part of the evaluation environment (a fork may "
            f"import its own fla package, the standard library and {', '.join(EVALUATION_PACKAGES)})")


def _reply_failure(reply: dict, seq_len: int | None, what: str) -> _ChildFailure:
    message = str(reply.get("error", "unknown error"))
    kind = reply.get("kind")
    if kind == "oom":
        peak = _mib(reply.get("peak_bytes")) if isinstance(reply.get("peak_bytes"), int) else None
        shown = f"{peak:,.0f} MiB" if peak is not None else "unknown"
        return _ChildFailure(OOM, f"OOM at T={seq_len}, peak {shown}")
    if kind == "missing_module" and isinstance(reply.get("module"), str) and reply["module"]:
        return _ChildFailure(ERROR, missing_module_reason(reply["module"][:200]))
    if kind == "needs_gpu":
        return _ChildFailure(NEEDS_GPU, "the forward needs a CUDA GPU for this fork: its Triton kernels cannot run "
                                        "on the CPU (no GPU driver); evaluate it where torch sees a GPU")
    last_line = message.strip().splitlines()[-1] if message.strip() else message
    return _ChildFailure(ERROR, f"{what} failed: {last_line}")


def forwards_per_request(seq_len: int, tokens_per_request: int, max_forwards: int) -> int:
    """How many forwards every request at ``seq_len`` runs: enough to make ``tokens_per_request``
    tokens, at least 1, at most ``max_forwards`` and at most :data:`MAX_TOKENS_PER_REQUEST` tokens
    in all. A function of the length and the options only, never of a measured speed, so every
    evaluation times the same requests."""
    wanted = math.ceil(tokens_per_request / seq_len)
    return max(1, min(wanted, max_forwards, MAX_TOKENS_PER_REQUEST // seq_len))


def tokens_per_request(options: EvaluationOptions) -> int:
    """``options.tokens_per_request``, or its default for the device (one forward on CPU)."""
    if options.tokens_per_request is not None:
        return options.tokens_per_request
    return DEFAULT_TOKENS_PER_REQUEST if options.device.startswith("cuda") else 0


def _calibrate(session: _Session, runs: dict[int, _LengthRun], counts: dict[int, int], timings: Timings,
               progress: ProgressCallback) -> dict[int, int]:
    """Nanoseconds of everything a request of ``counts[T]`` forwards does but the layer, per length
    (trusted: no fork code yet): the minimum round trip of :data:`CALIBRATION_RUNS`. A length
    whose input does not even fit in memory is marked OOM, with every longer one skipped."""
    started = time.monotonic()
    costs: dict[int, int] = {}
    lengths = sorted(runs)
    for index, length in enumerate(lengths):
        progress(ProgressEvent("calibrate", length, index, len(lengths)))
        try:
            samples = [_harness_cost(session, length, counts[length], session.deadline)
                       for _ in range(CALIBRATION_WARMUP + CALIBRATION_RUNS)]
        except _ChildFailure as failure:
            if failure.status != OOM:
                raise
            runs[length].result.status, runs[length].result.error = OOM, failure.message
            break
        costs[length] = min(samples[CALIBRATION_WARMUP:])
    timings.calibration_s = time.monotonic() - started
    return costs


def _fingerprint_bytes(count: int) -> int:
    return count * workload.SEGMENTS * workload.FINGERPRINT_DIRECTIONS * 4


def _fingerprints(payload: bytearray | None, count: int, what: str) -> torch.Tensor:
    """The fingerprints of a ``run`` reply, float32 ``[count, 8, K]`` (each checked later, not here)."""
    expected = _fingerprint_bytes(count)
    if payload is None or len(payload) != expected:
        sent = 0 if payload is None else len(payload)
        raise _ChildFailure(ERROR, f"the child broke the protocol during {what}: {sent} bytes of fingerprints "
                                   f"for {count} forwards, expected {expected}")
    shape = (count, workload.SEGMENTS, workload.FINGERPRINT_DIRECTIONS)
    return torch.frombuffer(payload, dtype=torch.float32).reshape(shape)


def _run_request(session: _Session, length: int, count: int, deadline: float, what: str,
                 seeds: tuple[int, int] | None = None) -> _Request:
    """One ``run`` request of ``count`` chained forwards, seeds drawn now (or ``seeds``), timed by this process."""
    input_seed, basis_seed = seeds if seeds is not None else (_new_seed(), _new_seed())
    header = {"op": "run", "seq_len": length, "input_seed": input_seed, "basis_seed": basis_seed, "count": count}
    reply, payload, elapsed = session.request(header, deadline, what, max_payload=_fingerprint_bytes(count))
    if not reply.get("ok"):
        raise _reply_failure(reply, length, what)
    return _Request(input_seed, basis_seed, _fingerprints(payload, count, what), elapsed)


MAX_TIMING_CHARS = 300


def _capture(session: _Session, length: int, count: int, deadline: float) -> str:
    """Ask the child to capture the requests at ``length`` in a CUDA graph; how they will be timed
    (``"cuda-graph"``, or eager and why). Informational: the parent's clock times them either way."""
    what = f"capturing the forwards at T={length}"
    header = {"op": "capture", "seq_len": length, "count": count, "input_seed": _new_seed(),
              "basis_seed": _new_seed()}
    reply, _, _ = session.request(header, deadline, what)
    if not reply.get("ok"):
        raise _reply_failure(reply, length, what)
    timing = reply.get("timing")
    return clean_text(timing, MAX_TIMING_CHARS) if isinstance(timing, str) else "unknown (the child did not say)"


def _receive_output(session: _Session, length: int, offset: int, deadline: float) -> torch.Tensor | _SharedOutput:
    """The last forward's output: through the pipe, or the shared area at ``offset`` (copied out,
    or left there to read once the child is gone when over :data:`COPY_OUTPUTS_UP_TO` bytes)."""
    limit = length * workload.HIDDEN_SIZE * 4
    header = {"op": "output", "offset": offset}
    reply, payload, _ = session.request(header, deadline, "sending the output", max_payload=limit)
    if not reply.get("ok"):
        raise _reply_failure(reply, length, "sending the output")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    dtype = dtypes.get(reply.get("dtype"))
    shape = reply.get("shape")
    expected_shape = [1, length, workload.HIDDEN_SIZE]
    if dtype is None or shape != expected_shape:
        raise _ChildFailure(ERROR, f"the output sent has dtype {reply.get('dtype')!r} and shape {shape}, "
                                   f"expected a float tensor of shape {expected_shape}")
    nbytes = length * workload.HIDDEN_SIZE * torch.empty((), dtype=dtype).element_size()
    shared, area = reply.get("shared_bytes"), session.child.shared
    if shared is not None:
        if payload is not None or area is None or shared != nbytes or offset + nbytes > area.size:
            raise _ChildFailure(ERROR, f"the child broke the protocol sending the output: shared_bytes={shared!r}, "
                                       f"expected {nbytes}")
        if nbytes > COPY_OUTPUTS_UP_TO:
            return _SharedOutput(area, offset, dtype, expected_shape, session.child.gone)
        payload = area.read(nbytes, offset)
    if payload is None or len(payload) != nbytes:
        sent = 0 if payload is None else len(payload)
        raise _ChildFailure(ERROR, f"the output sent has {sent} bytes, expected {nbytes}")
    return torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(expected_shape)


def _memory(session: _Session, deadline: float, reset: bool) -> tuple[int | None, int | None]:
    """The child's device memory: ``(allocated now, peak since the last reset)`` in bytes (None
    where it has none to report); ``reset`` starts a new peak."""
    reply, _, _ = session.request({"op": "memory", "reset": reset}, deadline, "reading memory use")

    def count(key: str) -> int | None:
        value = reply.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return count("allocated_bytes"), count("peak_bytes")


def _length_peak(before: tuple[int | None, int | None], after: tuple[int | None, int | None]) -> int | None:
    """A length's peak memory: the peak of its warm-up (``after``) above what was allocated before
    it (``before``: the layer's weights and the buffers of shorter lengths), so the fork's
    forwards and this length's inputs, which the harness allocates during the warm-up."""
    allocated, peak = before[0], after[1]
    if allocated is None or peak is None:
        return None
    return max(peak - allocated, 0)


def _harness_cost(session: _Session, length: int, count: int, deadline: float) -> int:
    """One round trip of everything a request of ``count`` forwards does but the layer (``calibrate``)."""
    header = {"op": "calibrate", "seq_len": length, "input_seed": _new_seed(), "basis_seed": _new_seed(),
              "count": count}
    what = f"calibration at T={length}"
    reply, payload, elapsed = session.request(header, deadline, what, max_payload=_fingerprint_bytes(count))
    if not reply.get("ok"):
        raise _reply_failure(reply, length, what)
    _fingerprints(payload, count, what)
    return elapsed


def _per_forward_ns(request: _Request, count: int, cost_ns: int) -> int:
    return max((request.round_trip_ns - cost_ns) // count, MIN_FORWARD_NS)


def _prepare_length(session: _Session, run: _LengthRun, options: EvaluationOptions, count: int, timings: Timings,
                    progress: ProgressCallback, warmup_since: float) -> None:
    """Warm-up (with the capture) and peak memory at one length.

    The first warm-up request runs one forward, eagerly: the fork's kernels compile there (a
    request of ``count`` eager forwards cost the host about 1.5 ms each at 512 to 2,048 tokens
    on an H100 machine, a few tenths of a second a length). Then the child captures a request of
    ``count`` forwards, and every later warm-up request runs ``count``: at least one, in all
    ``warmup_runs`` requests and, on CUDA, until ``warmup_seconds`` have passed since
    ``warmup_since`` (the monotonic time the evaluation's first warm-up began); the last one's
    round trip is kept in ``run.request_s`` to plan the timed rounds. The correctness request
    runs later, among the timed ones (:func:`_time_round`).
    """
    length = run.result.seq_len
    deadline = time.monotonic() + options.length_timeout_s
    before = _memory(session, deadline, reset=True)

    started = time.monotonic()
    warmup_s = options.warmup_seconds if options.device.startswith("cuda") else 0.0
    # The first request runs one forward eagerly (the fork's kernels compile and tune at this
    # length); then the child captures a request of count forwards in a CUDA graph, which the
    # rest of the warm-up replays.
    runs = max(options.warmup_runs, 2)
    progress(ProgressEvent("warmup", length, 0, runs))
    timings.first_forward_s += _run_request(session, length, 1, deadline, f"warm-up at T={length}").round_trip_ns / 1e9
    run.result.timing = _capture(session, length, count, deadline)
    done = 1
    while done < runs or time.monotonic() - warmup_since < warmup_s:
        progress(ProgressEvent("warmup", length, done, max(runs, done + 1)))
        run.request_s = _run_request(session, length, count, deadline, f"warm-up at T={length}").round_trip_ns / 1e9
        done += 1
    timings.warmup_s += time.monotonic() - started
    run.result.peak_vram_mb = _mib(_length_peak(before, _memory(session, deadline, reset=False)))


def _correctness_request(session: _Session, run: _LengthRun, count: int, deadline: float, timings: Timings,
                         progress: ProgressCallback) -> _Request:
    """The correctness request: a timed request like the others, on the seeds drawn for it; then
    (untimed) its last forward's whole output and a repeat of it on the same seeds. Only once the
    request has run does the child learn it was the one checked in full."""
    length = run.result.seq_len
    progress(ProgressEvent("correctness", length, 0, 1))
    request = _run_request(session, length, count, deadline, f"timed run at T={length}", seeds=run.check_seeds)
    started = time.monotonic()
    run.check = request
    run.output = _receive_output(session, length, run.output_offset, deadline)
    timings.output_s += time.monotonic() - started
    run.repeat = _run_request(session, length, count, deadline, f"repeat run at T={length}", seeds=run.check_seeds)
    timings.correctness_s += time.monotonic() - started
    return request


def round_quota(options: EvaluationOptions, request_s: float, done: int, rounds_left: int) -> tuple[int, int]:
    """``(least, planned)`` timed requests of one length in a round, ``done`` already timed and
    ``rounds_left`` rounds to go (this one included): the part of ``min_timed_runs`` and
    ``max_timed_runs`` left, spread over those rounds, and between them the round's share of
    ``timed_seconds`` at the warm-up's pace."""
    least = math.ceil(max(options.min_timed_runs - done, 0) / rounds_left)
    most = max(least, min(math.ceil((options.max_timed_runs - done) / rounds_left), options.max_timed_runs - done))
    wanted = math.ceil(options.timed_seconds / TIMED_ROUNDS / max(request_s, 1e-9))
    return least, max(least, min(most, wanted))


def _time_round(session: _Session, run: _LengthRun, options: EvaluationOptions, count: int, rounds_left: int,
                timings: Timings, progress: ProgressCallback) -> None:
    """One round of timed requests at one length, each followed by a calibration of the same count
    (their minimum lowers ``run.cost_ns``). The planned number comes from the warm-up's pace,
    which a busy host can make far too small, so the wall clock also ends the round once its
    share of ``timed_seconds`` has passed and its least number is met. In the round drawn for it
    (``run.check_round``, or an earlier one that takes every request left), the correctness
    request takes a place drawn among the planned ones (or the round's last, should the round end
    before it)."""
    length = run.result.seq_len
    deadline = time.monotonic() + options.length_timeout_s
    least, planned = round_quota(options, run.request_s, len(run.timed), rounds_left)
    # The correctness request is due from its round on, or in a round that takes every request
    # left under max_timed_runs (the bounds can be met before its round comes).
    due = run.check is None and (TIMED_ROUNDS - rounds_left >= run.check_round
                                 or len(run.timed) + planned >= options.max_timed_runs)
    check_at = secrets.randbelow(planned) if due and planned > 0 else None
    total = len(run.timed) + planned * rounds_left
    started = time.monotonic()
    for index in range(planned):
        out_of_time = index >= least and time.monotonic() - started >= options.timed_seconds / TIMED_ROUNDS
        if out_of_time and check_at is None:
            break
        progress(ProgressEvent("timed", length, min(len(run.timed), total - 1), total))
        if out_of_time or index == check_at:
            check_at = None
            request = _correctness_request(session, run, count, deadline, timings, progress)
        else:
            position = sum(1 for timed in run.timed if timed.position is not None)
            pooled = position < len(run.seed_pool)
            request = _run_request(session, length, count, deadline, f"timed run at T={length}",
                                   seeds=run.seed_pool[position] if pooled else None)
            request.position = position if pooled else None
        timings.timed_s += request.round_trip_ns / 1e9
        run.timed.append(request)
        run.cost_ns = min(run.cost_ns, _harness_cost(session, length, count, deadline))


def _finish_length(run: _LengthRun, count: int) -> None:
    """The length's figures from its timed requests: each one's time per forward, credited after
    subtracting the harness's cost (never more than half the fastest round trip)."""
    length = run.result.seq_len
    cost_ns = min(run.cost_ns, min(r.round_trip_ns for r in run.timed) // 2)
    for request in run.timed:
        request.forward_ns = _per_forward_ns(request, count, cost_ns)
    forward = sorted(r.forward_ns for r in run.timed)
    median_ns = statistics.median(forward)
    run.result.status = OK
    run.result.timed_runs = len(forward)
    run.result.forwards_per_request = count
    run.result.median_ms = median_ns / 1e6
    run.result.tokens_per_sec = length / (median_ns / 1e9)
    run.result.tokens_per_sec_min = length / (forward[-1] / 1e9)
    run.result.tokens_per_sec_max = length / (forward[0] / 1e9)
    run.result.cv = statistics.pstdev(forward) / statistics.fmean(forward)
    run.result.subtracted_us = cost_ns / count / 1e3


def _pinning_note(plan: pinning.CpuPlan | None, note: str, child_cpus: list[int] | None, timing_pinned: bool) -> str:
    """What the report says about pinning: the plan, and where it did not take effect."""
    if plan is None:
        return note
    problems = []
    if child_cpus is not None and frozenset(child_cpus) != plan.child:
        problems.append(f"the child runs on CPUs {pinning.format_cpu_list(child_cpus)} instead")
    if not timing_pinned:
        problems.append("the timing thread could not be pinned")
    return note + "".join(f"; {problem}" for problem in problems)


def _benchmark_in_sandbox(sandbox: SandboxStart, lengths: list[int], references: ReferenceWork,
                          options: EvaluationOptions, deadline: float, timings: Timings, progress: ProgressCallback,
                          report: EvaluationReport) -> tuple[dict[int, _LengthRun], Callable[[], None]]:
    """Wait for the sandboxed child and run every length in it; the parent's timing thread runs
    pinned (if planned) until the child is done, then gets its own CPUs back.

    Returns the runs and a function to call once the parent's own work is done: it waits for the
    child to be gone and records its output. The child is closed on a thread of its own meanwhile
    (its exit, its GPU context torn down, the straggler scan: about a second on an H100 machine),
    since nothing it could do after its last reply changes the parent's verdict.
    """
    runs = {length: _LengthRun(LengthResult(seq_len=length), output_offset=sandbox.offsets[length])
            for length in lengths}
    progress(ProgressEvent("start"))
    plan, note = sandbox.plan, sandbox.note
    try:
        child = sandbox.wait()
    except SandboxUnavailable as error:
        report.reasons.append(f"sandbox unavailable: {error}")
        return runs, lambda: None
    except SandboxError as error:
        report.reasons.append(f"sandbox: {error}")
        return runs, lambda: None
    try:
        # What this evaluation waited for: a child started before it (started_before_s) may be up already.
        timings.startup_s = max(0.0, time.monotonic() - sandbox.started - timings.started_before_s)
        report.sandbox = child.isolation_note
        with pinning.pinned(plan.timing if plan is not None else None) as timing_pinned:
            report.cpu_pinning = _pinning_note(plan, note, child.child_cpus, timing_pinned)
            _measure(child, runs, lengths, references, options, deadline, timings, progress, report)
    except BaseException:
        child.close()
        raise
    closing = threading.Thread(target=child.close, name="quasar-sandbox-close")
    closing.start()

    def closed() -> None:
        closing.join()
        report.log_tail = clean_text(child.output.text()[-8000:], 8000)
        if child.stragglers_killed:
            report.reasons.append(f"{child.stragglers_killed} process(es) started by the fork outlived it and were killed")

    return runs, closed


def _measure(child: SandboxedChild, runs: dict[int, _LengthRun], lengths: list[int], references: ReferenceWork,
             options: EvaluationOptions, deadline: float, timings: Timings, progress: ProgressCallback,
             report: EvaluationReport) -> None:
    """Calibrate, load the fork and run every length in a started child; fills ``runs``."""
    session = _Session(child, deadline)
    weights_seed = references.weights_seed
    try:
        counts = request_counts(lengths, options)
        try:
            harness_ns = _calibrate(session, runs, counts, timings, progress)
        finally:
            # The parent's reference work runs on the device while the child warms up (not measured).
            references.release()
        started = time.monotonic()
        progress(ProgressEvent("load"))
        child.precompiled(timeout=PRECOMPILE_WAIT_S)
        header = {"op": "load", "fork_dir": child.fork_dir, "weights_seed": weights_seed}
        reply, _, _ = session.request(header, time.monotonic() + options.load_timeout_s,
                                      f"loading the fork's layer (limit {options.load_timeout_s:g} s)")
        timings.load_s = time.monotonic() - started
        if not reply.get("ok"):
            raise _reply_failure(reply, None, "loading the fork's layer (fla.layers.quasar.QuasarAttention)")
    except _ChildFailure as failure:
        report.reasons.append(failure.message)
        return
    # Each length is prepared (warm-up, capture, correctness), shortest first; then the timed
    # requests run in rounds over every prepared length (module docstring, "Stability").
    prepared: list[int] = []
    stopped = None
    warmup_since = time.monotonic()

    def references_done() -> None:
        waited = time.monotonic()
        references.wait()
        timings.reference_s += time.monotonic() - waited

    for length in lengths:
        run = runs[length]
        if length not in harness_ns:
            break
        if length == lengths[-1]:
            # The longest length's warm-up needs the most memory: the reference (its transient
            # float32 work on the device included) is done before it, so it never costs the fork memory.
            references_done()
        run.cost_ns = harness_ns[length]
        run.check_seeds = references.check_seeds[length]
        run.seed_pool = references.timed_seeds.get(length, [])
        run.precomputed = references.precomputed.get(length, {})
        run.check_round = secrets.randbelow(TIMED_ROUNDS)
        failed = _length_step(run, _prepare_length, session, run, options, counts[length], timings, progress,
                              warmup_since)
        if failed is None:
            prepared.append(length)
        elif not _child_usable(child, failed):
            stopped = f"the evaluation stopped at T={length}"
            break
        elif failed == OOM:
            break
    if stopped is None:
        # ... and ends before the timed requests.
        references_done()
        stopped = _time_rounds(session, child, runs, prepared, counts, options, timings, progress)
    for length in prepared:
        run = runs[length]
        if run.result.error is not None:
            continue
        if not run.timed or run.check is None:
            run.result.error = f"not timed: {stopped}"
            run.timed, run.check, run.output, run.repeat = [], None, None, None
            continue
        _finish_length(run, counts[length])
        progress(ProgressEvent("timed", length, run.result.timed_runs, run.result.timed_runs))
        logger.info("T=%d: %.0f tokens/s (median of %d, cv %.3f)", length, run.result.tokens_per_sec,
                    run.result.timed_runs, run.result.cv)


def _time_rounds(session: _Session, child: SandboxedChild, runs: dict[int, _LengthRun], prepared: list[int],
                 counts: dict[int, int], options: EvaluationOptions, timings: Timings,
                 progress: ProgressCallback) -> str | None:
    """The timed requests of the prepared lengths in :data:`TIMED_ROUNDS` rounds over them (a
    length that fails drops out); None, or why the child can serve no more."""
    for round_index in range(TIMED_ROUNDS):
        for length in prepared:
            run = runs[length]
            if run.result.error is not None:
                continue
            failed = _length_step(run, _time_round, session, run, options, counts[length], TIMED_ROUNDS - round_index,
                                  timings, progress)
            if failed is not None and not _child_usable(child, failed):
                return f"the evaluation stopped at T={length}"
    return None


def _length_step(run: _LengthRun, step: Callable[..., None], *args: object) -> str | None:
    """Run one step of a length, ``step(*args)``: None, or the status of its failure, with which
    the length is marked (its reason kept, its runs dropped)."""
    try:
        step(*args)
    except _ChildFailure as failure:
        run.result.status = failure.status
        run.result.error = failure.message
        run.timed, run.check, run.output, run.repeat = [], None, None, None
        return failure.status
    return None


def _child_usable(child: SandboxedChild, failed: str) -> bool:
    """Whether the child can serve other lengths after a failure of ``failed`` status: it is
    running and the failure was an error or out of memory (a timeout leaves it busy)."""
    return failed in (ERROR, OOM) and child.process is not None and child.process.poll() is None


def _request_buffers(request: _Request, length: int, device: str) -> workload.RequestBuffers:
    """The noise and bases of ``request``, rebuilt from its seeds as the child made them."""
    buffers = workload.RequestBuffers.allocate(len(request.fingerprints), length, device)
    workload.fill_request(buffers, request.input_seed, request.basis_seed)
    return buffers


def _reference_outputs(reference: torch.nn.Module, buffers: workload.RequestBuffers, request: _Request, start: int,
                       stop: int) -> torch.Tensor:
    """The reference outputs ``[stop - start, T, 512]`` of forwards ``start`` to ``stop - 1`` of
    ``request``, in one batch, each on the input the child had to use: its noise times the signs of
    the fingerprint the child reported for the forward before (known for all of them at once, so
    a chain of forwards is checked as one batch)."""
    batch = workload.chained_inputs(buffers.noise, request.fingerprints, start, stop)
    with torch.inference_mode():
        return reference(batch)[0]


def reference_batch_size(seq_len: int) -> int:
    """Forwards of a request whose reference runs as one batch: :data:`REFERENCE_BATCH_TOKENS` tokens, at least one."""
    return max(1, REFERENCE_BATCH_TOKENS // seq_len)


def fingerprint_error(claimed: torch.Tensor | list, expected: torch.Tensor, reference_norms: torch.Tensor) -> float:
    """Largest per-eighth error estimate of a reported fingerprint against the reference's.

    ``||claimed_e - expected_e|| / (sqrt(K) · ||reference_e||)``; ``inf`` for a malformed or
    non-finite fingerprint.
    """
    values = _as_double(claimed)
    if values is None or values.shape != expected.shape or not torch.isfinite(values).all():
        return math.inf
    difference = torch.linalg.vector_norm(values - expected.double().cpu(), dim=1)
    scale = math.sqrt(expected.shape[1]) * reference_norms.double().cpu()
    errors = [float(d / s) if s > 0 else (0.0 if d == 0 else math.inf) for d, s in zip(difference, scale)]
    return max(errors)


def worst_block_error(output: torch.Tensor, reference: torch.Tensor, block: int = BLOCK_TOKENS) -> float:
    """Largest error over ``block``-token blocks, relative to the reference's RMS per token."""
    out = output.reshape(-1, output.shape[-1])
    ref = reference.reshape(-1, reference.shape[-1])
    error_sq = torch.cat([(out[a:b].double() - ref[a:b].double()).square().sum(-1)
                          for a, b in workload.segment_bounds(out.shape[0])])
    mean_ref_sq = float(ref.double().square().sum()) / ref.shape[0]
    if not math.isfinite(float(error_sq.sum())):
        return math.inf
    if mean_ref_sq == 0:
        return 0.0 if float(error_sq.sum()) == 0 else math.inf
    padded = torch.nn.functional.pad(error_sq, (0, (-error_sq.shape[0]) % block))
    sums = padded.reshape(-1, block).sum(1)
    counts = torch.full_like(sums, block)
    counts[-1] = error_sq.shape[0] - block * (sums.shape[0] - 1)
    return float(torch.sqrt(sums / (counts * mean_ref_sq)).max())


def _as_double(values: torch.Tensor | list) -> torch.Tensor | None:
    """Reported values as a float64 CPU tensor (a tensor, or nested lists of numbers); None if they are not numbers."""
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.float64)
    try:
        return torch.tensor(values, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError):
        return None


def _relative_difference(a: torch.Tensor | list, b: torch.Tensor | list) -> float:
    left, right = _as_double(a), _as_double(b)
    if left is None or right is None or left.shape != right.shape or not (
            torch.isfinite(left).all() and torch.isfinite(right).all()):
        return math.inf
    scale = float(torch.linalg.vector_norm(right))
    difference = float(torch.linalg.vector_norm(left - right))
    return difference / scale if scale > 0 else (0.0 if difference == 0 else math.inf)


def escape_probability(timed: int, verified: int, degraded: int) -> float:
    """The chance that none of ``verified`` requests drawn at random (without replacement) from
    ``timed`` is one of the ``degraded`` ones: ``C(timed - degraded, verified) / C(timed, verified)``."""
    if not 0 <= degraded <= timed or not 0 <= verified <= timed:
        raise ValueError(f"escape_probability({timed}, {verified}, {degraded}): counts out of range")
    return math.comb(timed - degraded, verified) / math.comb(timed, verified)


def degraded_to_move_median(timed: int) -> int:
    """How many of ``timed`` requests a fork must speed up to move their median: just over half."""
    return timed // 2 + 1


def requests_to_verify(run: _LengthRun, target: bool) -> int:
    """How many timed requests to check, every forward of each, the correctness request among them.

    At least :data:`VERIFY_SAMPLE` (up to :data:`VERIFY_ALL_UP_TO` tokens, enough requests for
    :data:`MAX_VERIFIED` forwards if that is more); at the ``target`` length, enough that a fork
    degrading just over half of the timed requests escapes with probability at most
    :data:`ESCAPE_BOUND` (10 of 100 or more requests); never more than were timed.
    """
    timed = len(run.timed)
    count = run.result.forwards_per_request or 1
    wanted = max(VERIFY_SAMPLE, MAX_VERIFIED // count) if run.result.seq_len <= VERIFY_ALL_UP_TO else VERIFY_SAMPLE
    if target:
        degraded = degraded_to_move_median(timed)
        while wanted < timed and escape_probability(timed, wanted, degraded) > ESCAPE_BOUND:
            wanted += 1
    return min(wanted, timed)


def _checked_requests(run: _LengthRun, target: bool) -> list[_Request]:
    """The requests to check: the correctness request (its place among the timed ones was drawn
    before they ran) and others drawn at random now, after the child's last reply, uniformly
    among the rest of the timed requests.

    Where the parent computed some timed requests' expected fingerprints ahead (``run.precomputed``:
    a uniformly random set of places in the seed pool, which holds a place for every request a
    length may time), the draw takes as many of those as it can: all of them that were timed, if
    no more than wanted, else a random choice of them; and the rest at random among the others.
    The places computed ahead that were timed are a uniformly random set of the timed requests, of
    a size that does not depend on which they are, so the draw stays uniform among them.
    """
    assert run.check is not None
    wanted = requests_to_verify(run, target) - 1
    others = [request for request in run.timed if request is not run.check]
    chooser = secrets.SystemRandom()
    ahead = [request for request in others if request.position in run.precomputed]
    if len(ahead) >= wanted:
        return [run.check, *chooser.sample(ahead, wanted)]
    rest = [request for request in others if request.position not in run.precomputed]
    return [run.check, *ahead, *chooser.sample(rest, min(wanted - len(ahead), len(rest)))]


def _verify_length(run: _LengthRun, reference: torch.nn.Module, device: str, progress: ProgressCallback,
                   expected_check: torch.Tensor | None = None, target: bool = False) -> list[str]:
    """Check one length's timed requests (every forward of those drawn, each alone and each request
    as a whole), the correctness request's whole output and its repeat against the reference;
    the reasons to fail. ``expected_check``: the reference output of the correctness request's
    last forward if already computed; ``target``: the length is the target (more requests checked)."""
    from quasar.reference import relative_error

    result, length = run.result, run.result.seq_len
    assert run.check is not None and run.output is not None and run.repeat is not None
    chosen = _checked_requests(run, target)
    total = sum(len(request.fingerprints) for request in chosen)
    progress(ProgressEvent("reference", length, 0, total + 1))
    worst, failed, done = 0.0, 0, 0
    request_errors: list[float] = []
    batch = reference_batch_size(length)
    last = len(run.check.fingerprints) - 1
    for request in chosen:
        ahead = run.precomputed.get(request.position) if request.position is not None else None
        buffers = _request_buffers(request, length, device) if ahead is None else None
        forwards = len(request.fingerprints)
        difference_sq = reference_sq = 0.0
        for start in range(0, forwards, batch):
            stop = min(start + batch, forwards)
            if ahead is not None:
                # Computed while the child warmed up (a request of one forward).
                fingerprints, norms = ahead[0][None], ahead[1][None]
            else:
                assert buffers is not None
                expected = _reference_outputs(reference, buffers, request, start, stop)
                if request is run.check and expected_check is None and start <= last < stop:
                    expected_check = expected[last - start:last - start + 1].clone()
                # The batch's fingerprints and norms in a few launches and one copy to the host,
                # then each forward compared on its own and summed into the request's estimate.
                fingerprints = workload.fingerprints_of(expected, buffers.directions[start:stop],
                                                        buffers.token_weights[start:stop]).cpu()
                norms = workload.segment_norms_of(expected).cpu()
                del expected
            for offset, index in enumerate(range(start, stop)):
                error = fingerprint_error(request.fingerprints[index], fingerprints[offset], norms[offset])
                worst = max(worst, error)
                failed += error > FINGERPRINT_TOLERANCE
                difference_sq += float((request.fingerprints[index].double() - fingerprints[offset].double())
                                       .square().sum())
                reference_sq += workload.FINGERPRINT_DIRECTIONS * float(norms[offset].double().square().sum())
            done += stop - start
            progress(ProgressEvent("reference", length, done, total + 1))
        request_errors.append(_estimated_error(difference_sq, reference_sq))
        del buffers
    # The correctness output last: read in place, it waits for the sandbox to be gone.
    buffers = _request_buffers(run.check, length, device)
    if expected_check is None:
        expected_check = _reference_outputs(reference, buffers, run.check, last, last + 1)
    expected = expected_check
    output = output_tensor(run.output).to(device)
    result.finite = bool(torch.isfinite(output).all())
    result.rel_error = relative_error(output, expected)
    bounds = workload.segment_bounds(length)
    result.rel_error_eighths = [relative_error(output[:, a:b], expected[:, a:b]) for a, b in bounds]
    result.worst_block_error = worst_block_error(output, expected)
    consistency = fingerprint_error(run.check.fingerprints[last],
                                    workload.fingerprint(output, buffers.directions[last], buffers.token_weights[last]),
                                    workload.segment_norms(expected))
    result.repeat_rel_diff = _relative_difference(run.repeat.fingerprints, run.check.fingerprints)
    result.repeat_agree = result.repeat_rel_diff <= REPEAT_TOLERANCE
    del output, expected, expected_check, buffers

    result.runs_verified = total
    result.requests_verified = len(chosen)
    result.fingerprint_error = worst
    result.request_error = max(request_errors)
    result.requests_checked_ahead = sum(request.position in run.precomputed for request in chosen
                                        if request.position is not None)
    result.escape_probability = escape_probability(len(run.timed), len(chosen), degraded_to_move_median(len(run.timed)))

    where = f"T={length}"
    reasons = []
    if not result.finite:
        reasons.append(f"{where}: the output has NaN or infinite values")
    if not result.rel_error <= REL_ERROR_THRESHOLD:
        reasons.append(f"{where}: the output differs from the reference: relative error "
                       f"{result.rel_error:.3g} > {REL_ERROR_THRESHOLD:g} over the whole sequence")
    bad = [i + 1 for i, e in enumerate(result.rel_error_eighths) if not e <= REL_ERROR_THRESHOLD]
    if bad:
        shown = ", ".join(f"{i} ({result.rel_error_eighths[i - 1]:.3g})" for i in bad)
        reasons.append(f"{where}: eighths {shown} of the sequence differ from the reference "
                       f"(relative error > {REL_ERROR_THRESHOLD:g})")
    if not result.worst_block_error <= BLOCK_ERROR_THRESHOLD:
        reasons.append(f"{where}: a {BLOCK_TOKENS}-token block differs from the reference (error "
                       f"{result.worst_block_error:.3g} of the sequence RMS > {BLOCK_ERROR_THRESHOLD:g})")
    if not consistency <= CONSISTENCY_TOLERANCE:
        reasons.append(f"{where}: the output sent for the check is not the output its run fingerprinted "
                       f"(difference {consistency:.3g})")
    if failed:
        reasons.append(f"{where}: {failed} of {total} timed forwards checked do not match the reference "
                       f"(largest error {worst:.3g} > {FINGERPRINT_TOLERANCE:g}): the output was not "
                       "computed from that run's input")
    inexact = [error for error in request_errors if not error <= REQUEST_TOLERANCE]
    if inexact and not failed:
        reasons.append(f"{where}: {len(inexact)} of {len(chosen)} timed requests checked are less exact than "
                       f"the correctness threshold allows (estimated error {max(inexact):.3g} > "
                       f"{REQUEST_TOLERANCE:g})")
    if not result.repeat_agree:
        reasons.append(f"{where}: two runs on the same input disagree (relative difference "
                       f"{result.repeat_rel_diff:.3g} > {REPEAT_TOLERANCE:g})")
    result.correct = not reasons
    return reasons


def _estimated_error(difference_sq: float, reference_sq: float) -> float:
    """A relative error estimated from summed squared fingerprint differences and the reference's
    summed squared norms (each eighth's weighted by the number of directions)."""
    if not math.isfinite(difference_sq):
        return math.inf
    if reference_sq <= 0:
        return 0.0 if difference_sq == 0 else math.inf
    return math.sqrt(difference_sq / reference_sq)


class ReferenceWork:
    """The parent's reference layer and the expected outputs of the correctness requests, computed on a
    thread of their own while the sandboxed child warms up (the fork's kernels compile on the
    child's one core for seconds while the device has little to do). A validator's worker starts
    it while the fork is being cloned and hands it to :func:`evaluate` with the started child.

    The correctness requests' seeds are drawn here, before the child exists, and kept in this
    process until the request is asked for. Where a request is one forward (``counts``: forwards
    per request at each length, one from about 131k tokens on CUDA), that forward's input depends
    on the seeds alone and its output is computed here; a request of several forwards chains each
    input to the fingerprint the child reports for the forward before, so its last forward's
    output is computed with the timed requests' checks.

    At such a length the seeds of every timed request it may time (``pool_size``) are drawn here
    too (``timed_seeds``, used in order), and once the correctness outputs are done the thread
    computes the expected fingerprints of timed requests at places drawn at random in that pool
    (``precomputed``), up to :data:`AHEAD_REQUESTS`, until it is stopped (on CUDA only, unless
    ``ahead`` says otherwise: on a CPU it would share the cores with the child): at a million tokens the
    checks of the timed requests (a reference forward of about 0.3 s each on an H100) are then done
    while the fork's kernels compile, and :func:`_checked_requests` draws from them.

    The thread builds the layer on the host at once and touches the device only once released
    (:meth:`release`, after the child's calibration); :meth:`wait` stops it after the reference it
    is computing and ends it, before the longest length's warm-up and the timed requests: the
    reference never shares the device with a measurement, nor its memory with the fork's largest
    forwards. A length whose expected output did not fit in memory is left to
    :func:`_verify_length`, which reports it.
    """

    def __init__(self, weights_seed: int, device: str, lengths: Sequence[int], counts: dict[int, int],
                 pool_size: int = 0, ahead: bool | None = None):
        self.weights_seed = weights_seed
        self.device = device
        self.counts = dict(counts)
        # On a CPU the child's warm-up and this work would share the cores: there they wait.
        self.ahead = device.startswith("cuda") if ahead is None else ahead
        self.check_seeds = {length: (_new_seed(), _new_seed()) for length in lengths}
        pooled = [length for length in lengths if self.counts[length] == 1]
        self.timed_seeds = {length: [(_new_seed(), _new_seed()) for _ in range(pool_size)] for length in pooled}
        self.precomputed: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {length: {} for length in pooled}
        self.expected: dict[int, torch.Tensor] = {}
        self.reference: torch.nn.Module | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._released = threading.Event()
        self._thread = threading.Thread(target=self._compute, name="quasar-reference", daemon=True)
        self._thread.start()

    def _compute(self) -> None:
        from quasar.reference import QuasarAttentionReference

        try:
            reference = QuasarAttentionReference(**workload.LAYER_KWARGS)
            reference.load_state_dict(workload.make_weights(self.weights_seed), strict=True)
            self._released.wait()
            self.reference = reference.to(self.device).eval()
            for length, seeds in self.check_seeds.items():
                if self.counts[length] != 1:
                    continue
                buffers = workload.RequestBuffers.allocate(1, length, self.device)
                workload.fill_request(buffers, *seeds)
                check = _Request(*seeds, buffers.fingerprints, round_trip_ns=0)
                try:
                    self.expected[length] = _reference_outputs(self.reference, buffers, check, 0, 1)
                except torch.OutOfMemoryError:
                    break
                finally:
                    del buffers
            if self.device.startswith("cuda"):
                self._rehearse(min(self.check_seeds))
            for length in sorted(self.timed_seeds, reverse=True) if self.ahead else ():
                self._compute_ahead(length)
        except BaseException as error:  # re-raised by wait(), in the evaluation's own thread
            self._error = error

    def _compute_ahead(self, length: int) -> None:
        """Expected fingerprints and norms of timed requests at ``length`` at places of its seed
        pool drawn at random, until :data:`AHEAD_REQUESTS` or a stop."""
        places = list(range(len(self.timed_seeds[length])))
        secrets.SystemRandom().shuffle(places)
        buffers = workload.RequestBuffers.allocate(1, length, self.device)
        try:
            for place in places[:AHEAD_REQUESTS]:
                if self._stop.is_set():
                    return
                seeds = self.timed_seeds[length][place]
                workload.fill_request(buffers, *seeds)
                request = _Request(*seeds, buffers.fingerprints, round_trip_ns=0)
                expected = _reference_outputs(self.reference, buffers, request, 0, 1)
                fingerprints = workload.fingerprints_of(expected, buffers.directions, buffers.token_weights)[0].cpu()
                self.precomputed[length][place] = (fingerprints, workload.segment_norms_of(expected)[0].cpu())
                del expected
        except torch.OutOfMemoryError:
            pass  # the rest is checked afterwards, where the verification reports what does not fit
        finally:
            del buffers

    def _rehearse(self, length: int) -> None:
        """Check one made-up batch of timed forwards at ``length`` as :func:`_verify_length` checks
        a request's (the batched reference, fingerprints and norms), and forget the result: in a
        fresh process (a validator's worker) their kernels load at first use, a quarter of a
        second on an H100 machine, which is then spent here while the child warms up."""
        count = min(reference_batch_size(length), MAX_FORWARDS_PER_REQUEST)
        try:
            buffers = workload.RequestBuffers.allocate(count, length, self.device)
            workload.fill_request(buffers, _new_seed(), _new_seed())
            request = _Request(0, 0, torch.zeros(count, workload.SEGMENTS, workload.FINGERPRINT_DIRECTIONS), 0)
            expected = _reference_outputs(self.reference, buffers, request, 0, count)
            workload.fingerprints_of(expected, buffers.directions, buffers.token_weights).cpu()
            workload.segment_norms_of(expected).cpu()
        except torch.OutOfMemoryError:
            pass  # a rehearsal only: the verification meets the same limit and reports it

    def release(self) -> None:
        """Let the thread use the device from now on."""
        self._released.set()

    def complete(self) -> None:
        """Release the thread and wait until it has done all its work, the work ahead included."""
        self.release()
        self._thread.join()

    def join(self) -> None:
        """Stop the thread's work ahead, release it and wait for it to end (what it raised stays
        for :meth:`wait`)."""
        self._stop.set()
        self.release()
        self._thread.join()

    def wait(self) -> torch.nn.Module:
        """Release the thread and wait for it; the reference layer (raises what the thread raised)."""
        self.join()
        if self._error is not None:
            raise self._error
        assert self.reference is not None
        return self.reference


def start_references(target_seq_len: int, options: EvaluationOptions) -> ReferenceWork:
    """The reference work of an evaluation of ``target_seq_len`` with ``options``, started now
    with the weights seed the evaluation will use (for :func:`evaluate`'s ``references``); raises
    :class:`EvaluationInputError` for lengths it would refuse."""
    lengths = check_lengths(options.seq_lens, target_seq_len, options.device)
    return ReferenceWork(_weights_seed(options), options.device, lengths, request_counts(lengths, options),
                         options.max_timed_runs)


def request_counts(lengths: Sequence[int], options: EvaluationOptions) -> dict[int, int]:
    """Forwards per request at each length (:func:`forwards_per_request` with ``options``)."""
    return {length: forwards_per_request(length, tokens_per_request(options), options.max_forwards_per_request)
            for length in lengths}


def _verify(runs: dict[int, _LengthRun], references: ReferenceWork, timings: Timings,
            progress: ProgressCallback, target: int, longest_beside: bool | None = None) -> list[str]:
    """Check every run against the reference in this process; the reasons to fail, shortest length
    first. At the ``target`` length more timed requests are checked (:func:`requests_to_verify`).

    With ``longest_beside`` (default: on CUDA) the longest length is checked on a thread (and
    CUDA stream) of its own while the others are checked here: its float32 reference keeps the
    GPU busy while the shorter lengths' checks wait on the host. A length that runs out of memory
    beside the other is checked again alone afterwards; one whose float32 reference does not fit
    in this device's memory even alone cannot be verified: it fails with that reason, and the
    other lengths are still checked.
    """
    started = time.monotonic()
    reference = references.wait()
    device = references.device
    pending = [run for run in runs.values() if run.check is not None and run.output is not None]
    found: dict[int, list[str]] = {}
    again: list[_LengthRun] = []

    def check(run: _LengthRun, alone: bool) -> None:
        length = run.result.seq_len
        expected = references.expected.pop(length, None)
        try:
            found[length] = _verify_length(run, reference, device, progress, expected, target=length == target)
        except torch.OutOfMemoryError:
            if not alone:
                if expected is not None:
                    references.expected[length] = expected
                again.append(run)
                return
            run.result.correct = False
            found[length] = [f"T={length}: the float32 reference does not fit in the memory of {device} here, "
                             "so this length cannot be verified on this machine"]
        finally:
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
        run.output = None

    if longest_beside is None:
        longest_beside = device.startswith("cuda")
    beside = pending[-1] if longest_beside and len(pending) > 1 else None
    failure: list[BaseException] = []
    worker = None
    if beside is not None:
        stream = torch.cuda.Stream(device) if device.startswith("cuda") else None
        if stream is not None:
            # The correctness references were computed on this thread's stream.
            stream.wait_stream(torch.cuda.current_stream(device))

        def check_beside() -> None:
            try:
                with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                    check(beside, alone=False)
                if stream is not None:
                    stream.synchronize()
            except BaseException as error:  # re-raised below, in the evaluation's own thread
                failure.append(error)

        worker = threading.Thread(target=check_beside, name="quasar-verify-longest")
        worker.start()
    try:
        for run in pending:
            if run is not beside:
                check(run, alone=beside is None)
    finally:
        if worker is not None:
            worker.join()
    if failure:
        raise failure[0]
    for run in sorted(again, key=lambda item: item.result.seq_len):
        check(run, alone=True)
    references.expected.clear()
    timings.reference_s += time.monotonic() - started
    return [reason for length in sorted(found) for reason in found[length]]


def _device_name(device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu" if device == "cpu" else f"{device} (not available to the parent)"


def _import_check(repo: Path, options: EvaluationOptions) -> ImportCheck:
    from quasar.imports import validate_repo

    found = validate_repo(repo, profile=options.import_profile, require_cu=options.require_cu)
    return ImportCheck(ok=found.ok, profile=options.import_profile,
                       errors=[str(f) for f in found.errors], warnings=[str(f) for f in found.warnings])


# The claim a miner should submit: the speed this share of timed requests reached or beat.
CLAIM_QUANTILE = 0.75


def recommended_claim(seq_len: int, forward_ns: Sequence[int]) -> float:
    """A safe claim at ``seq_len`` from the timed forwards' durations (nanoseconds).

    A submission is scored at ``min(claimed, measured)`` and fails below ``0.9 × claimed``, so a
    claim should sit close under the median: the slowest run would waste most of the score on a
    noisy machine. The speed three in four requests reached is at or under the median, and a
    validator measuring within 10% of it still passes the claim check.
    """
    ordered = sorted(forward_ns)
    return seq_len / (ordered[math.ceil(CLAIM_QUANTILE * len(ordered)) - 1] / 1e9)


def _score(report: EvaluationReport, runs: dict[int, _LengthRun]) -> None:
    """Claim check, league, weighted score and recommended claim (QUASAR.md section 5)."""
    from quasar import scoring

    target = report.target_seq_len
    league = scoring.league_for(target)
    report.league, report.multiplier = league.name, league.multiplier
    target_run = runs[target]
    measured = target_run.result.tokens_per_sec if target_run.result.status == OK else None
    report.measured_tokens_per_sec = measured
    if measured is None:
        report.reasons.append(f"the target length T={target} was not measured")
        return
    report.recommended_claim = recommended_claim(target, [r.forward_ns for r in target_run.timed])
    claimed = report.claimed_tokens_per_sec
    if claimed is not None:
        report.claim_ok = measured >= scoring.CLAIM_FACTOR * claimed
        if not report.claim_ok:
            report.reasons.append(f"measured {measured:,.0f} tokens/s at T={target} is below {scoring.CLAIM_FACTOR} "
                                  f"× claimed {claimed:,.0f}")
    correct = all(run.result.correct for run in runs.values())
    result = scoring.Result(
        hotkey="evaluation", submission_id=0, submitted_at=0.0, target_sequence_length=target,
        claimed_tokens_per_sec=claimed if claimed is not None else measured,
        measured_tokens_per_sec=measured, correct=correct, logits_ok=None,
    )
    report.weighted_score = scoring.weighted_score(result)


def evaluate(
    repo_path: str | Path,
    target_seq_len: int,
    claimed_tokens_per_sec: float | None = None,
    options: EvaluationOptions | None = None,
    progress: ProgressCallback | None = None,
    sandbox: SandboxStart | None = None,
    references: ReferenceWork | None = None,
) -> EvaluationReport:
    """Evaluate the fork checked out at ``repo_path`` for ``target_seq_len``; never raises for the fork's faults.

    Starts the sandboxed child (no fork code runs in it before ``load``) and runs the import
    check while it starts; if the check passes, runs the fork's layer in the child at every
    length of ``options.seq_lens`` plus the target, checks it against the reference, the claim
    and the score; if not, kills the child. Raises :class:`EvaluationInputError` only for bad
    arguments (a missing directory, a length out of range, a non-positive claim, a ``sandbox``
    or ``references`` started for other lengths, device or weights).

    ``sandbox``: a child started without its fork for these lengths and options (start.py), which
    gets the fork here; ``references``: the reference work already started for them
    (:class:`ReferenceWork`). A validator's worker starts both while it clones the fork; the
    evaluation owns them from here and closes them on every path.
    """
    try:
        return _evaluate(repo_path, target_seq_len, claimed_tokens_per_sec, options or EvaluationOptions(),
                         progress or (lambda event: None), sandbox, references)
    finally:
        if sandbox is not None:
            sandbox.close()
        if references is not None:
            references.join()


def _evaluate(repo_path: str | Path, target_seq_len: int, claimed_tokens_per_sec: float | None,
              options: EvaluationOptions, progress: ProgressCallback, sandbox: SandboxStart | None,
              references: ReferenceWork | None) -> EvaluationReport:
    started = time.monotonic()
    repo = Path(repo_path)
    if not repo.is_dir():
        raise EvaluationInputError(f"repository path {str(repo)!r} is not a directory")
    if claimed_tokens_per_sec is not None and not (math.isfinite(claimed_tokens_per_sec) and claimed_tokens_per_sec > 0):
        raise EvaluationInputError(f"claimed tokens/sec must be a positive number, got {claimed_tokens_per_sec!r}")
    if options.device != "cpu" and not options.device.startswith("cuda"):
        raise EvaluationInputError(f"device must be cpu, cuda or cuda:N, got {options.device!r}")
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise EvaluationInputError(f"device {options.device}: CUDA is not available here "
                                   f"(--device cpu runs small lengths for tests; {CPU_NOTE})")
    lengths = check_lengths(options.seq_lens, target_seq_len, options.device)
    if not 1 <= options.max_forwards_per_request <= MAX_FORWARDS_PER_REQUEST:
        raise EvaluationInputError(f"max_forwards_per_request {options.max_forwards_per_request!r}: expected 1 "
                                   f"to {MAX_FORWARDS_PER_REQUEST}")
    if options.tokens_per_request is not None and not (
            isinstance(options.tokens_per_request, int) and 0 <= options.tokens_per_request <= MAX_TOKENS_PER_REQUEST):
        raise EvaluationInputError(f"tokens_per_request {options.tokens_per_request!r}: expected an integer from 0 "
                                   f"to {MAX_TOKENS_PER_REQUEST}")
    if sandbox is not None and (sandbox.lengths != lengths or sandbox.device != options.device):
        raise EvaluationInputError(f"the sandbox was started for T={sandbox.lengths} on {sandbox.device}, "
                                   f"not for T={lengths} on {options.device}")
    if references is not None and (sorted(references.check_seeds) != lengths or references.device != options.device
                                   or options.weights_seed not in (None, references.weights_seed)):
        raise EvaluationInputError(f"the reference work was started for T={sorted(references.check_seeds)} on "
                                   f"{references.device} with other weights than asked for")
    weights_seed = references.weights_seed if references is not None else _weights_seed(options)
    report = EvaluationReport(
        verdict=FAIL, reasons=[], repo=str(repo), target_seq_len=target_seq_len, seq_lens=lengths,
        device=options.device, device_name="", import_check=None,
        lengths={str(length): LengthResult(seq_len=length) for length in lengths},
        claimed_tokens_per_sec=claimed_tokens_per_sec, weights_seed=weights_seed,
    )
    if options.device == "cpu":
        report.notes.append(CPU_NOTE)
    report.environment = evaluation_environment().describe()
    timings = report.timings

    progress(ProgressEvent("import-check"))
    if sandbox is None:
        sandbox = SandboxStart(lengths, options.device, options.policy, options.pin_cpus, repo=repo)
    else:
        sandbox.provide_fork(repo)
        timings.started_before_s = started - sandbox.started
    try:
        checking = time.monotonic()
        report.import_check = _import_check(repo, options)
        timings.import_check_s = time.monotonic() - checking
        if not report.import_check.ok:
            report.reasons += [f"import check: {error}" for error in report.import_check.errors]
        else:
            deadline = time.monotonic() + options.timeout_s
            if references is None:
                references = ReferenceWork(weights_seed, options.device, lengths, request_counts(lengths, options),
                                           options.max_timed_runs)
            runs, closed = _benchmark_in_sandbox(sandbox, lengths, references, options, deadline, timings, progress,
                                                 report)
            try:
                report.reasons += _verify(runs, references, timings, progress, target_seq_len)
            finally:
                closed()
    finally:
        sandbox.close()
    if report.import_check.ok:
        for length, run in runs.items():
            report.lengths[str(length)] = run.result
            if run.result.status not in (OK, SKIPPED) and run.result.error:
                report.reasons.append(run.result.error if run.result.status == OOM else f"T={length}: {run.result.error}")
        for length, run in runs.items():
            if (run.result.timing or "").startswith("eager (capture failed"):
                report.notes.append(f"T={length}: timed {run.result.timing}; the harness's cost subtracted is that "
                                    "of a CUDA graph, so a forward that can be captured times faster")
        skipped = [str(length) for length, run in runs.items() if run.result.status == SKIPPED]
        if skipped and not any(r.startswith("sandbox") for r in report.reasons):
            report.notes.append(f"not run: T={', '.join(skipped)}")
        _score(report, runs)
        if report.sandbox.startswith("UNSANDBOXED"):
            report.notes.append(report.sandbox)
    report.device_name = _device_name(options.device)
    report.verdict = PASS if not report.reasons else FAIL
    timings.total_s = time.monotonic() - started
    progress(ProgressEvent("done"))
    logger.info("evaluation of %s: %s%s", repo, report.verdict, "" if report.passed else f" ({'; '.join(report.reasons)})")
    return report
