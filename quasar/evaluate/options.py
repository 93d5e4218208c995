"""What an evaluation runs: its options, the lengths it takes, how many forwards make a request.

Imports no torch (a validator's worker reads these before it imports torch). How the options
are used: docs/evaluation.md.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from quasar.config.options import DEFAULT_SEQ_LENS, OPTIONS_BY_KEY
from quasar.config.values import MAX_SEQ_LEN, MIN_SEQ_LEN
from quasar.errors import QuasarError
from quasar.evaluate.sandbox import SandboxPolicy
from quasar.evaluate.start import evaluation_lengths, output_offsets

# CPU runs exist for tests and small lengths; they are not a benchmark.
CPU_MAX_SEQ_LEN = 65536

CPU_NOTE = "cpu: for tests and small lengths only, not a benchmark"

# Forwards per request (forwards_per_request): on CUDA as many as make this many tokens, within
# max_forwards_per_request; at most MAX_TOKENS_PER_REQUEST tokens in all (bounds a request and
# its verification).
DEFAULT_TOKENS_PER_REQUEST = 1 << 18

MAX_TOKENS_PER_REQUEST = 1 << 21

# The count the parent may ask for; a reply's fingerprints must fit in protocol.MAX_HEADER_BYTES.
MAX_FORWARDS_PER_REQUEST = 256


class EvaluationInputError(QuasarError, ValueError):
    """The evaluation was asked for something it cannot do; the message names the argument."""


class NotOnThisMachine(EvaluationInputError):
    """A length the rules allow that this machine's settings cannot run (a CPU's limit, an output
    area above SANDBOX_MEMORY_MB): the evaluating host's limit, never the fork's fault."""


class BeyondCpuLimit(NotOnThisMachine):
    """A length past CPU_MAX_SEQ_LEN on a CPU: the tools' refusals say which flag gives a shorter one."""


@dataclass(frozen=True)
class EvaluationOptions:
    """How to evaluate: lengths, device, limits, repeat counts, sandbox policy."""

    # What a setting gives (options_from_settings) defaults to that setting's default, but for
    # triton_seed_dir.
    seq_lens: tuple[int, ...] = DEFAULT_SEQ_LENS
    device: str = OPTIONS_BY_KEY["device"].default
    timeout_s: float = float(OPTIONS_BY_KEY["eval_timeout"].default)
    length_timeout_s: float = 900.0
    # Seconds the child has to import the fork's layer and build it (``load``; its kernels compile
    # later, in each length's first forward, under ``length_timeout_s``).
    load_timeout_s: float = float(OPTIONS_BY_KEY["eval_load_timeout"].default)
    import_profile: str = "core"
    require_cu: bool = False
    # Warm-up requests per length; on CUDA the warm-up also goes on until warmup_seconds have
    # passed since the first length's began.
    warmup_runs: int = 3
    # Timed requests ("runs") per length: as many as fit in timed_seconds, within these bounds.
    min_timed_runs: int = 10
    max_timed_runs: int = 200
    timed_seconds: float = float(OPTIONS_BY_KEY["eval_timed_seconds"].default)
    weights_seed: int | None = None
    policy: SandboxPolicy = field(default_factory=SandboxPolicy)
    # Each request runs as many forwards as make this many tokens (forwards_per_request), at most
    # max_forwards_per_request; None: DEFAULT_TOKENS_PER_REQUEST on CUDA, one forward on CPU.
    tokens_per_request: int | None = None
    max_forwards_per_request: int = 256
    warmup_seconds: float = 1.0
    # Pin the child and the parent's timing thread to cores of their own (pinning.py); None: on CUDA only.
    pin_cpus: bool | None = None
    # Where the Triton cache seeds live (triton_seed.py; TRITON_SEED_DIR); empty: no seed, what a
    # tool that reads no settings (the benchmarks) runs with.
    triton_seed_dir: str = ""


def options_from_settings(settings, allow_unsandboxed: bool = False, **changes) -> EvaluationOptions:
    """The options a validator's settings give (quasar/config.py: lengths, device, limits, the
    sandbox's memory, cgroup and allocator settings), with ``changes`` to any field."""
    policy = SandboxPolicy(
        allow_unsandboxed=allow_unsandboxed,
        pytorch_cuda_alloc_conf=settings.pytorch_cuda_alloc_conf,
        memory_bytes=settings.sandbox_memory_mb << 20,
        cgroup_path=settings.sandbox_cgroup or None,
    )
    values = {
        "seq_lens": settings.eval_seq_lens,
        "device": settings.device,
        "timeout_s": settings.eval_timeout,
        "timed_seconds": settings.eval_timed_seconds,
        "load_timeout_s": settings.eval_load_timeout,
        "triton_seed_dir": settings.triton_seed_dir,
        "policy": policy,
    }
    return EvaluationOptions(**{**values, **changes})


@dataclass(frozen=True)
class ProgressEvent:
    """A step of an evaluation, for progress displays: ``done`` of ``total`` in ``stage``."""

    stage: str
    seq_len: int | None = None
    done: int = 0
    total: int = 0


ProgressCallback = Callable[[ProgressEvent], None]


def new_seed() -> int:
    return secrets.randbits(63)


def draw_weights_seed(options: EvaluationOptions) -> int:
    """The seed of an evaluation's layer weights: the one ``options`` asks for, else a new one."""
    return options.weights_seed if options.weights_seed is not None else new_seed()


def check_lengths(
    seq_lens: Sequence[int], target_seq_len: int, device: str, memory_bytes: int | None = None
) -> list[int]:
    """The sorted lengths to run (``seq_lens`` plus the target); raises EvaluationInputError for a
    length outside the rules, BeyondCpuLimit for one past a CPU's limit, NotOnThisMachine, where ``memory_bytes``
    (the sandbox's memory limit) is given, for lengths whose output area (start.output_offsets)
    would not fit in it."""
    lengths = evaluation_lengths(seq_lens, target_seq_len)
    for length in lengths:
        if isinstance(length, bool) or not isinstance(length, int) or not MIN_SEQ_LEN <= length <= MAX_SEQ_LEN:
            raise EvaluationInputError(
                f"sequence length {length!r}: expected an integer from {MIN_SEQ_LEN} to {MAX_SEQ_LEN}"
            )
        if device == "cpu" and length > CPU_MAX_SEQ_LEN:
            raise BeyondCpuLimit(
                f"sequence length {length}: CPU runs are limited to {CPU_MAX_SEQ_LEN} tokens ({CPU_NOTE})"
            )
    # The area lives in the evaluating process, outside the sandbox's limit, and is filled at the
    # start on CUDA: 32 GiB at the API's largest target. Bounding it by that limit keeps an
    # evaluation's host memory within twice the limit the operator sized for the host.
    area = output_offsets(lengths)[1]
    if memory_bytes is not None and area > memory_bytes:
        raise NotOnThisMachine(
            f"sequence lengths {lengths}: their output area of {area / (1 << 30):.1f} GiB (2 KiB a token of "
            f"each length, held outside the sandbox) exceeds the host memory one evaluation may hold, "
            f"SANDBOX_MEMORY_MB ({memory_bytes >> 20} MiB)"
        )
    return lengths


def output_area_warning(seq_lens: Sequence[int], memory_bytes: int, device: str) -> str | None:
    """A warning for a validator's start where ``seq_lens`` beside the API's largest target
    (MAX_SEQ_LEN) make an output area above ``memory_bytes``: check_lengths then refuses the
    largest targets, and this validator never evaluates such a submission. None where every
    target fits, and on a CPU, whose runs stop at CPU_MAX_SEQ_LEN anyway."""
    if device == "cpu":
        return None
    area = output_offsets(evaluation_lengths(seq_lens, MAX_SEQ_LEN))[1]
    if area <= memory_bytes:
        return None
    needed_mib = -(-area // (1 << 20))
    return (
        f"EVAL_SEQ_LENS {','.join(map(str, seq_lens))} beside the API's largest target ({MAX_SEQ_LEN:,} tokens) "
        f"make an output area of {area / (1 << 30):.1f} GiB, above SANDBOX_MEMORY_MB ({memory_bytes >> 20:,} MiB): "
        f"submissions at the largest targets are not evaluated here. Shorten EVAL_SEQ_LENS, or set "
        f"SANDBOX_MEMORY_MB of at least {needed_mib:,} where the host has the memory (docs/evaluation.md, Limits)"
    )


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


def request_counts(lengths: Sequence[int], options: EvaluationOptions) -> dict[int, int]:
    """Forwards per request at each length (:func:`forwards_per_request` with ``options``)."""
    return {
        length: forwards_per_request(length, tokens_per_request(options), options.max_forwards_per_request)
        for length in lengths
    }
