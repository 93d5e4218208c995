"""How the local network runs: its subnet, lengths, timings and the defaults for CPU or CUDA
(docs/localnet.md)."""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass
from pathlib import Path

from quasar import config
from quasar.chain.base import SubnetHyperparameters
from quasar.chain.subtensor_rules import FINNEY
from quasar.config import DEFAULT_SEQ_LENS
from quasar.errors import QuasarError
from quasar.forks import ForkError, normalize_fork_url
from quasar.localnet.forks import HONEST, HOSTILE, HOSTILE_EXACT_UP_TO

HOST = "127.0.0.1"
NETUID = 24
BLOCK_TIME_S = 0.2
# The validator sets weights every EPOCH_BLOCKS (one second at BLOCK_TIME_S).
EPOCH_BLOCKS = 5
# The local network's subnet: finney's rules, with a tempo of 4 s and a weights rate limit of one
# EPOCH_BLOCKS at BLOCK_TIME_S (finney's 72 s and 20 s there would make a round minutes longer).
LOCALNET_HYPERPARAMETERS = dataclasses.replace(FINNEY, tempo=20, weights_rate_limit=EPOCH_BLOCKS)
HYPERPARAMETER_SETS = {"localnet": LOCALNET_HYPERPARAMETERS, "finney": FINNEY}
# One API round spans the whole demo (10 minutes at BLOCK_TIME_S), so its leaderboard holds both miners.
ROUND_BLOCKS = 3000
VALIDATOR_STAKE = 1e4
CPU_TARGET, CPU_SEQ_LENS = 128, (64, 128)
CUDA_TARGET, CUDA_SEQ_LENS = 65536, DEFAULT_SEQ_LENS
# The hostile miner targets the length its kernel is exact at, and checks only that.
HOSTILE_TARGET = HOSTILE_EXACT_UP_TO
# Seconds of timed runs per length (EVAL_TIMED_SECONDS; on CUDA its default): on CPU the harness's
# minimum of timed runs already takes longer, so asking for more only makes the demo slower, not its
# figures meaningful.
CPU_TIMED_SECONDS = 0.5
CUDA_TIMED_SECONDS = float(config.OPTIONS_BY_KEY["eval_timed_seconds"].default)
# The share of their recommended claim the miners submit (CLAIM_SHARE; on CUDA its default): on CPU
# the miner and the validator time on the same few busy cores at different moments, and measured 11%
# apart, past the claim check's 10%, and 37% apart with a test suite's other worker busy beside them
# (a 2-core CI machine); a GPU's timings hold still.
CPU_CLAIM_SHARE = 0.5
CUDA_CLAIM_SHARE = float(config.OPTIONS_BY_KEY["claim_share"].default)
# Seconds to wait for the validator's report before giving up (--round-timeout).
CPU_ROUND_TIMEOUT_S, CUDA_ROUND_TIMEOUT_S = 1800.0, 900.0
# The miners run one cycle (evaluate the fork's head, submit) and then wait: a day between cycles.
MINER_INTERVAL_S = 86400
UPSTREAM = config.OPTIONS_BY_KEY["upstream_repo"].default
START_TIMEOUT_S = 180.0
MARKER = ".quasar-localnet"
LOCK_NAME = "localnet.lock"
WALLET_HOTKEY = "default"
OWNER, API, VALIDATOR = "owner", "api", "validator"
MINERS = {HONEST: "miner-honest", HOSTILE: "miner-hostile"}


class LocalnetError(QuasarError, RuntimeError):
    """The local network cannot start or run; the message says what and where to look."""


@dataclass(frozen=True)
class LocalnetOptions:
    """How to run the local network."""

    data_dir: Path
    device: str  # "cpu" or "cuda"
    reference_model: str  # a hub id or folder; "" = REFERENCE_MODEL if cached, else the stand-in
    stand_in_model: bool  # use the tiny stand-in even when the real model is cached
    target: int
    seq_lens: tuple[int, ...]
    round_timeout_s: float
    timed_seconds: float = CUDA_TIMED_SECONDS
    claim_share: float = CUDA_CLAIM_SHARE
    block_time_s: float = BLOCK_TIME_S
    epoch_blocks: int = EPOCH_BLOCKS
    hyperparameters: SubnetHyperparameters = LOCALNET_HYPERPARAMETERS


def default_options(
    data_dir: Path,
    device: str,
    reference_model: str = "",
    stand_in_model: bool = False,
    target: int | None = None,
    seq_lens: tuple[int, ...] | None = None,
    round_timeout_s: float | None = None,
    hyperparameters: str = "localnet",
) -> LocalnetOptions:
    """Options with the defaults for ``device``: small lengths on CPU (not a benchmark), the
    validator's usual lengths and a 64k target on CUDA; the subnet's hyperparameters by name
    (:data:`HYPERPARAMETER_SETS`). Raises :class:`LocalnetError` when the validator would run no
    length that shows the hostile fork wrong."""
    cpu = device == "cpu"
    options = LocalnetOptions(
        hyperparameters=HYPERPARAMETER_SETS[hyperparameters],
        data_dir=Path(data_dir),
        device=device,
        reference_model=reference_model,
        stand_in_model=stand_in_model,
        target=target if target is not None else (CPU_TARGET if cpu else CUDA_TARGET),
        seq_lens=seq_lens if seq_lens is not None else (CPU_SEQ_LENS if cpu else CUDA_SEQ_LENS),
        round_timeout_s=round_timeout_s
        if round_timeout_s is not None
        else (CPU_ROUND_TIMEOUT_S if cpu else CUDA_ROUND_TIMEOUT_S),
        timed_seconds=CPU_TIMED_SECONDS if cpu else CUDA_TIMED_SECONDS,
        claim_share=CPU_CLAIM_SHARE if cpu else CUDA_CLAIM_SHARE,
    )
    if not any(length > HOSTILE_TARGET for length in options.seq_lens):
        shown = ", ".join(str(length) for length in options.seq_lens) or "none"
        raise LocalnetError(
            f"the validator's lengths (--seq-lens: {shown}) need one above {HOSTILE_TARGET} tokens: "
            f"the hostile miner's kernel is exact up to {HOSTILE_TARGET} (its target, all it checks), "
            "so only a longer length shows it wrong"
        )
    return options


def evaluated_lengths(options: LocalnetOptions) -> tuple[int, ...]:
    """Every length the validator runs in this network: its own, and both miners' targets."""
    return tuple(sorted({*options.seq_lens, options.target, HOSTILE_TARGET}))


def check_data_dir(data_dir: Path) -> None:
    """Raise :class:`LocalnetError` where the miners' forks cannot live under ``data_dir``: the
    GitHub stand-in serves them from its ``github`` folder as ``file://`` URLs, and the submission
    API refuses a local fork's path with a space, a non-ASCII character or another that the URL
    escapes (quasar/forks.py), so every submission of the round would be refused."""
    root = data_dir.resolve()
    try:
        normalize_fork_url(f"{(root / 'github').as_uri()}/owner/repository.git", allow_local=True)
    except ForkError:
        plain = {*string.ascii_letters, *string.digits, *"._/-"}
        odd = ", ".join(repr(char) for char in sorted(set(str(root)) - plain))
        raise LocalnetError(
            f"the data folder {root} has characters the submission API refuses in a local fork's path "
            f"({odd}): the miners' forks are served from its github folder as file:// URLs, so every "
            "submission would be refused; pass --data-dir with a path of letters, digits and . _ / - "
            "(e.g. /tmp/quasar-localnet)"
        ) from None
