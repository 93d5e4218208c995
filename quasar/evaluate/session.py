"""The parent's side of the conversation with the sandboxed child: one request and its reply at a
time, each reply checked for shape before anything in it is used (docs/evaluation.md, "Timing").

Nothing the child says is believed: a failure it reports becomes a :class:`ChildFailure` whose
message is safe to print (report.clean_text), and a child that dies or floods is named as such.
"""

from __future__ import annotations

import math
import subprocess
import threading
import time
from dataclasses import dataclass

import torch

from quasar.errors import QuasarError
from quasar.evaluate import protocol, workload
from quasar.evaluate.environment import EVALUATION_PACKAGES
from quasar.evaluate.options import new_seed
from quasar.evaluate.report import ERROR, NEEDS_GPU, OOM, TIMEOUT, clean_text
from quasar.evaluate.sandbox import SandboxedChild

# Correctness outputs come back through a shared memory file (protocol.SharedArea, a region per
# length); one up to this size is copied out when it arrives, a larger one is read in place once the
# child is gone and nothing can write to it any more (a copy of 1 GiB at a million tokens saved).
COPY_OUTPUTS_UP_TO = 64 << 20


@dataclass
class Request:
    """One request: its seeds, the fingerprints the child reported (float32 ``[count, 8, 2, K]``), its
    round trip, and the time per forward credited to the fork."""

    input_seed: int
    basis_seed: int
    fingerprints: torch.Tensor
    round_trip_ns: int
    forward_ns: int = 0
    # Its place in its length's pool of seeds drawn ahead (ReferenceWork), if it took one.
    position: int | None = None


@dataclass
class SharedOutput:
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


def output_tensor(output: torch.Tensor | SharedOutput) -> torch.Tensor:
    """A correctness output as a tensor, wherever it was kept."""
    return output.tensor() if isinstance(output, SharedOutput) else output


# The most of one reason that may come from the child (an error message, its last output lines).
MAX_REASON_CHARS = 600
# The lines torch's CUDA errors end with (c10/cuda), after the error itself.
_CUDA_ERROR_HINTS = (
    "Search for `cuda",
    "CUDA kernel errors might be asynchronously reported",
    "For debugging consider passing CUDA_LAUNCH_BLOCKING",
    "Compile with `TORCH_USE_CUDA_DSA`",
)

# How many of the child's last output lines a reason quotes when the child dies.
DEATH_OUTPUT_LINES = 4


class ChildFailure(QuasarError):
    """A length or the evaluation failed because of the child; ``message`` is safe to print
    (:func:`clean_text`: it may quote the child)."""

    def __init__(self, status: str, message: str):
        message = clean_text(message, MAX_REASON_CHARS)
        super().__init__(message)
        self.status = status
        self.message = message


def mib(nbytes: int | None) -> float | None:
    return None if nbytes is None else nbytes / (1 << 20)


# The most bytes of memory a reply may report: far above any device's memory, and small enough
# for every figure made from it (MiB as a float, a difference of two) to stay finite.
MAX_REPORTED_BYTES = 1 << 50

_SCALARS = (bool, int, float, str, type(None))


def shown_value(value: object, limit: int = 60) -> str:
    """A value of the child's as a reason quotes it: the repr of a scalar or of a short flat list,
    cut to ``limit`` characters; else only its type (the repr of a nested one may recurse past
    the limit)."""
    if isinstance(value, _SCALARS) or (
        isinstance(value, list) and len(value) <= 8 and all(isinstance(item, _SCALARS) for item in value)
    ):
        text = repr(value)
        return text if len(text) <= limit else text[: limit - 3] + "..."
    return f"a {type(value).__name__}"


def reply_bytes(reply: dict, key: str, what: str) -> int | None:
    """The byte count ``reply[key]``, None where the child sent none (null, as on the CPU); any
    other value than a whole number from 0 to :data:`MAX_REPORTED_BYTES` breaks the protocol."""
    value = reply.get(key)
    if value is None:
        return None
    if not (protocol.is_count(value) and value <= MAX_REPORTED_BYTES):
        raise ChildFailure(
            ERROR, f"the child broke the protocol during {what}: {key}={shown_value(value)} is not a byte count"
        )
    return value


class Session:
    """The parent's side of the conversation with one sandboxed child."""

    def __init__(self, child: SandboxedChild, deadline: float):
        self.child = child
        self.deadline = deadline

    def _failure(self, error: Exception, what: str) -> ChildFailure:
        if isinstance(error, (protocol.ChannelClosed, BrokenPipeError)):
            return ChildFailure(ERROR, self._death(what))
        if self.child.killed_reason:
            return ChildFailure(ERROR, self.child.killed_reason)
        if isinstance(error, protocol.ChannelTimeout):
            return ChildFailure(TIMEOUT, f"{what} timed out")
        return ChildFailure(ERROR, f"the child broke the protocol during {what}: {error}")

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
        how = "" if status is None else f", killed by signal {-status}" if status < 0 else f", exit status {status}"
        lines = [line for line in self.child.output.text().splitlines() if line.strip()][-DEATH_OUTPUT_LINES:]
        said = f"; its last output: {' | '.join(line.strip() for line in lines)}" if lines else "; it wrote nothing"
        return f"the child process exited during {what}{how}{said}"

    def request(
        self, header: dict, deadline: float, what: str, max_payload: int = 0
    ) -> tuple[dict, bytearray | None, int]:
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
            raise ChildFailure(ERROR, self.child.killed_reason)
        return reply, payload, elapsed


def missing_module_reason(module: str) -> str:
    """Why loading a fork that imports ``module``, which nothing here provides, failed."""
    if module == "fla" or module.startswith("fla."):
        return f"the fork's own module {module} is missing (imported by fla.layers.quasar or what it imports)"
    return (
        f"the fork imports {module!r}, which is not part of the evaluation environment (a fork may "
        f"import its own fla package, the standard library and {', '.join(EVALUATION_PACKAGES)})"
    )


def reply_failure(reply: dict, seq_len: int | None, what: str) -> ChildFailure:
    """The failure a reply of ``ok: false`` reports (raises ChildFailure itself where a field of it is malformed)."""
    error = reply.get("error")
    message = error if isinstance(error, str) else "unknown error"
    kind = reply.get("kind")
    if kind == "oom":
        peak = mib(reply_bytes(reply, "peak_bytes", what))
        shown = f"{peak:,.0f} MiB" if peak is not None else "unknown"
        return ChildFailure(OOM, f"OOM at T={seq_len}, peak {shown}")
    if kind == "missing_module" and isinstance(reply.get("module"), str) and reply["module"]:
        return ChildFailure(ERROR, missing_module_reason(reply["module"][:200]))
    if kind == "needs_gpu":
        return ChildFailure(
            NEEDS_GPU,
            "the forward needs a CUDA GPU for this fork: its Triton kernels cannot run "
            "on the CPU (no GPU driver); evaluate it where torch sees a GPU",
        )
    # The last line says what went wrong, but for torch's CUDA errors, which end with hints to the
    # one debugging them: their error line comes before those.
    lines = [line for line in message.strip().splitlines() if not line.startswith(_CUDA_ERROR_HINTS)]
    last_line = lines[-1] if lines else message.strip()
    return ChildFailure(ERROR, f"{what} failed: {last_line}")


def fingerprint_bytes(count: int) -> int:
    return count * math.prod(workload.FINGERPRINT_SHAPE) * 4


def parse_fingerprints(payload: bytearray | None, count: int, what: str) -> torch.Tensor:
    """The fingerprints of a ``run`` reply, float32 ``[count, 8, 2, K]`` (each checked later, not here)."""
    expected = fingerprint_bytes(count)
    if payload is None or len(payload) != expected:
        sent = 0 if payload is None else len(payload)
        raise ChildFailure(
            ERROR,
            f"the child broke the protocol during {what}: {sent} bytes of fingerprints "
            f"for {count} forwards, expected {expected}",
        )
    return torch.frombuffer(payload, dtype=torch.float32).reshape(count, *workload.FINGERPRINT_SHAPE)


def run_request(
    session: Session, length: int, count: int, deadline: float, what: str, seeds: tuple[int, int] | None = None
) -> Request:
    """One ``run`` request of ``count`` chained forwards, seeds drawn now (or ``seeds``), timed by this process."""
    input_seed, basis_seed = seeds if seeds is not None else (new_seed(), new_seed())
    header = {"op": "run", "seq_len": length, "input_seed": input_seed, "basis_seed": basis_seed, "count": count}
    reply, payload, elapsed = session.request(header, deadline, what, max_payload=fingerprint_bytes(count))
    if not reply.get("ok"):
        raise reply_failure(reply, length, what)
    return Request(input_seed, basis_seed, parse_fingerprints(payload, count, what), elapsed)


MAX_TIMING_CHARS = 300


def capture(session: Session, length: int, count: int, deadline: float) -> str:
    """Ask the child to capture the requests at ``length`` in a CUDA graph; how they will be timed
    (``"cuda-graph"``, or eager and why). Informational: the parent's clock times them either way."""
    what = f"capturing the forwards at T={length}"
    header = {"op": "capture", "seq_len": length, "count": count, "input_seed": new_seed(), "basis_seed": new_seed()}
    reply, _, _ = session.request(header, deadline, what)
    if not reply.get("ok"):
        raise reply_failure(reply, length, what)
    timing = reply.get("timing")
    return clean_text(timing, MAX_TIMING_CHARS) if isinstance(timing, str) else "unknown (the child did not say)"


def receive_output(session: Session, length: int, offset: int, deadline: float) -> torch.Tensor | SharedOutput:
    """The last forward's output: through the pipe, or the shared area at ``offset`` (copied out,
    or left there to read once the child is gone when over :data:`COPY_OUTPUTS_UP_TO` bytes)."""
    limit = length * workload.HIDDEN_SIZE * 4
    header = {"op": "output", "offset": offset}
    reply, payload, _ = session.request(header, deadline, "sending the output", max_payload=limit)
    if not reply.get("ok"):
        raise reply_failure(reply, length, "sending the output")
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    named = reply.get("dtype")
    dtype = dtypes.get(named) if isinstance(named, str) else None
    shape = reply.get("shape")
    expected_shape = [1, length, workload.HIDDEN_SIZE]
    if dtype is None or shape != expected_shape:
        raise ChildFailure(
            ERROR,
            f"the output sent has dtype {shown_value(named)} and shape {shown_value(shape)}, "
            f"expected a float tensor of shape {expected_shape}",
        )
    nbytes = length * workload.HIDDEN_SIZE * torch.empty((), dtype=dtype).element_size()
    shared, area = reply.get("shared_bytes"), session.child.shared
    if shared is not None:
        exact = protocol.is_count(shared) and shared == nbytes
        if payload is not None or area is None or not exact or offset + nbytes > area.size:
            raise ChildFailure(
                ERROR,
                f"the child broke the protocol sending the output: shared_bytes={shown_value(shared)}, "
                f"expected {nbytes}",
            )
        if nbytes > COPY_OUTPUTS_UP_TO:
            return SharedOutput(area, offset, dtype, expected_shape, session.child.gone)
        payload = area.read(nbytes, offset)
    if payload is None or len(payload) != nbytes:
        sent = 0 if payload is None else len(payload)
        raise ChildFailure(ERROR, f"the output sent has {sent} bytes, expected {nbytes}")
    return torch.frombuffer(payload, dtype=torch.uint8).view(dtype).reshape(expected_shape)


def read_memory(session: Session, deadline: float, reset: bool) -> tuple[int | None, int | None]:
    """The child's device memory: ``(allocated now, peak since the last reset)`` in bytes (None
    where it has none to report); ``reset`` starts a new peak."""
    what = "reading memory use"
    reply, _, _ = session.request({"op": "memory", "reset": reset}, deadline, what)
    return reply_bytes(reply, "allocated_bytes", what), reply_bytes(reply, "peak_bytes", what)


def length_peak(before: tuple[int | None, int | None], after: tuple[int | None, int | None]) -> int | None:
    """A length's peak memory: the peak of its warm-up (``after``) above what was allocated before
    it (``before``: the layer's weights and the buffers of shorter lengths), so the fork's
    forwards and this length's inputs, which the harness allocates during the warm-up."""
    allocated, peak = before[0], after[1]
    if allocated is None or peak is None:
        return None
    return max(peak - allocated, 0)


def harness_cost(session: Session, length: int, count: int, deadline: float) -> int:
    """One round trip of everything a request of ``count`` forwards does but the layer (``calibrate``)."""
    header = {"op": "calibrate", "seq_len": length, "input_seed": new_seed(), "basis_seed": new_seed(), "count": count}
    what = f"calibration at T={length}"
    reply, payload, elapsed = session.request(header, deadline, what, max_payload=fingerprint_bytes(count))
    if not reply.get("ok"):
        raise reply_failure(reply, length, what)
    parse_fingerprints(payload, count, what)
    return elapsed
