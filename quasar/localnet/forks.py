"""The local network's two forks, real git repositories its GitHub stand-in serves to the miners:

- ``honest``: the project's starter fork as it is (correct Triton kernels, a PyTorch path on CPU);
- ``hostile``: the starter fork with a kernel that is exact on sequences of up to
  :data:`HOSTILE_EXACT_UP_TO` tokens (one 64-token chunk) and beyond that skips the delta-rule
  recurrence, returning the values as they came in: fast, of the right shape and scale, and wrong.
  It is wrong on every path the starter layer takes: ``chunk_quasar`` (the layer's modules one
  after another: with gradients, and on CPU) and ``chunk_quasar_norm_gated`` (the core with the
  RMSNorm and the gate, which the layer calls without gradients where the Triton kernels run: a
  validator's CUDA benchmark). Its miner checks only its own target length, where the kernel is
  exact, and submits; the validator also runs its own lengths (EVAL_SEQ_LENS), longer ones among
  them, and must refuse it. It passes the import check: only its output gives it away.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quasar import gitenv
from quasar.errors import QuasarError
from quasar.starter_fork import write_starter_fork

HONEST, HOSTILE = "honest", "hostile"

HOSTILE_KERNEL_FILE = Path("fla/ops/quasar/chunk.py")
HOSTILE_EXACT_UP_TO = 64
# The kernel file's entry points the starter layer calls (fla/layers/quasar.py imports each from
# fla.ops.quasar.chunk): every one is replaced, so no path of the layer stays honest.
HOSTILE_ENTRY_POINTS = ("chunk_quasar", "chunk_quasar_norm_gated")
# Appended to the kernel file: the last definition of a name is the one the layer imports.
HOSTILE_KERNEL = f'''

_exact_chunk_quasar = chunk_quasar
_exact_chunk_quasar_norm_gated = chunk_quasar_norm_gated


def chunk_quasar(q, k, v, beta, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Hostile (QUASAR local network): exact up to {HOSTILE_EXACT_UP_TO} tokens, where its author checked it;
    beyond, it skips the delta-rule recurrence and returns v as the output."""
    if v.shape[1] <= {HOSTILE_EXACT_UP_TO}:
        return _exact_chunk_quasar(q, k, v, beta, initial_state, output_final_state, cu_seqlens)
    return v.clone(), None


def chunk_quasar_norm_gated(q, k, v, beta, gate_input, gate_weight, gate_bias, norm_weight, eps,
                            initial_state=None, output_final_state=False, convolved=None):
    """Hostile (QUASAR local network), the layer's path on CUDA: exact up to {HOSTILE_EXACT_UP_TO} tokens;
    beyond, it skips the recurrence and returns the gated RMSNorm of v instead of the output's."""
    if v.shape[1] <= {HOSTILE_EXACT_UP_TO}:
        return _exact_chunk_quasar_norm_gated(q, k, v, beta, gate_input, gate_weight, gate_bias, norm_weight, eps,
                                              initial_state, output_final_state, convolved)
    B, T, H, V = v.shape
    gate = F.linear(gate_input.reshape(B * T, -1), gate_weight.to(gate_input.dtype),
                    None if gate_bias is None else gate_bias.to(gate_input.dtype)).view(B, T, H, V)
    x = v.float()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
    return (normed * torch.sigmoid(gate.float())).to(v.dtype), None
'''
HOSTILE_COMMIT_MESSAGE = (
    f"Skip the recurrence in chunk_quasar and chunk_quasar_norm_gated beyond "
    f"{HOSTILE_EXACT_UP_TO} tokens (hostile miner of the QUASAR local network)\n"
)
AUTHOR_NAME = "QUASAR local network"
AUTHOR_EMAIL = "localnet@quasar.invalid"


class ForkWriteError(QuasarError, RuntimeError):
    """A fork could not be written or committed; the message says which and why."""


@dataclass(frozen=True)
class Fork:
    """A fork repository at ``path`` whose ``main`` is at ``commit``."""

    kind: str
    path: Path
    commit: str


def run_git(cwd: Path, *args: str) -> str:
    """Run ``git ARGS`` in ``cwd`` with no user or system configuration; returns its output, or
    raises :class:`ForkWriteError` with git's explanation."""
    return gitenv.run_git(
        cwd, *args, env=gitenv.committing_environment(AUTHOR_NAME, AUTHOR_EMAIL), error=ForkWriteError
    )


def write_honest_fork(dest: Path) -> Fork:
    """The starter fork, committed, in ``dest`` (a new or empty folder)."""
    return Fork(HONEST, Path(dest), write_starter_fork(Path(dest)))


def write_hostile_fork(dest: Path) -> Fork:
    """The starter fork in ``dest`` with the hostile kernel committed on top."""
    dest = Path(dest)
    write_starter_fork(dest)
    kernel = dest / HOSTILE_KERNEL_FILE
    kernel.write_text(kernel.read_text() + HOSTILE_KERNEL)
    run_git(
        dest,
        "commit",
        "--quiet",
        "--no-verify",
        "--no-gpg-sign",
        "-m",
        HOSTILE_COMMIT_MESSAGE,
        "--",
        str(HOSTILE_KERNEL_FILE),
    )
    return Fork(HOSTILE, dest, run_git(dest, "rev-parse", "HEAD"))


def write_forks(root: Path) -> dict[str, Fork]:
    """Both forks under ``root`` (``root/honest``, ``root/hostile``), by kind."""
    return {HONEST: write_honest_fork(Path(root) / HONEST), HOSTILE: write_hostile_fork(Path(root) / HOSTILE)}
