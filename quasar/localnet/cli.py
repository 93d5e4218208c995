"""``quasar localnet`` (``python -m quasar.localnet``, ``./START_LOCALNET.sh``): run a whole QUASAR
subnet on this machine.

Starts the dev chain, the submission API, a GitHub stand-in, the validator neuron and two miner
neurons (one on an honest fork, one on a hostile fork), lets the miners evaluate and submit and
the validator evaluate both, and prints the miners' verdicts, the API's leaderboard and the
weights the validator set on chain. Evaluates on CUDA when torch sees a GPU,
otherwise on CPU at small lengths (not a benchmark). Progress goes to stderr.

``--once`` stops after the first round (exit status 0); otherwise the network keeps running
(submit your own fork to the printed API) until Ctrl-C. ``--json`` prints only the summary as a
JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from quasar.chain.subtensor_rules import FINNEY
from quasar.config.cli import seq_lens_type
from quasar.config.values import format_seq_lens
from quasar.evaluate.options import MIN_SEQ_LEN
from quasar.localnet.options import (
    CPU_ROUND_TIMEOUT_S,
    CPU_SEQ_LENS,
    CPU_TARGET,
    CUDA_ROUND_TIMEOUT_S,
    CUDA_SEQ_LENS,
    CUDA_TARGET,
    HOSTILE_TARGET,
    LOCALNET_HYPERPARAMETERS,
    NETUID,
)
from quasar.log import setup_logging
from quasar.signals import stop_on_signals
from quasar.terminal import WrappingParser, shell_command, wrapped

DEFAULT_DATA_DIR = Path("localnet-data")
SUMMARY_FILE = "summary.json"
PIPED_WIDTH = 160


class Display:
    """Progress on stderr: a spinner with the current step on a terminal, timestamped lines otherwise."""

    def __init__(self, console: Console):
        self.console = console
        self.started = time.monotonic()
        self.current: str | None = None
        self.step_started = self.started
        self.last_detail: str | None = None
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        if console.is_terminal:
            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
            )
            self.progress.start()

    def step(self, text: str) -> None:
        self._finish(ok=True)
        self.current, self.step_started, self.last_detail = text, time.monotonic(), None
        if self.progress is not None:
            self.task = self.progress.add_task(text, total=None)
        else:
            self.console.print(f"[{time.monotonic() - self.started:6.1f}s] {text}", highlight=False)

    def detail(self, text: str) -> None:
        if self.progress is not None and self.task is not None:
            self.progress.update(self.task, description=f"{self.current}\n  {text}")
        elif text != self.last_detail:
            self.console.print(f"[{time.monotonic() - self.started:6.1f}s]   {text}", highlight=False)
        self.last_detail = text

    def say(self, text: str, style: str = "") -> None:
        """Print a message: on a terminal wrapped at words within 80 columns, a path longer than a
        line whole on its own (the terminal would split a word of it, or the path); elsewhere (a
        pipe, pm2) on one line."""
        self.console.print(Text(self._fitted(text), style=style))

    def _fitted(self, text: str, indent: str = "") -> str:
        return wrapped(text, self.console.width, indent) if self.console.is_terminal else text

    def _finish(self, ok: bool) -> None:
        if self.current is None:
            return
        if self.progress is not None and self.task is not None:
            self.progress.remove_task(self.task)
            mark, colour = ("✓", "green") if ok else ("✗", "red")
            took = f"({time.monotonic() - self.step_started:.1f} s)"
            line = Text(self._fitted(f"{mark} {self.current} {took}", indent="  "))
            line.stylize(colour, 0, 1)
            line.stylize("dim", len(line) - len(took))
            self.console.print(line)
            self.task = None
        self.current = None

    def close(self, ok: bool) -> None:
        self._finish(ok)
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


# ``--seq-lens``: lengths the evaluation can run (``64,128``); empty means none.
seq_lens = seq_lens_type(MIN_SEQ_LEN)


def detect_device(asked: str) -> str:
    """``cuda`` when asked for or (``auto``) when torch sees a CUDA device, else ``cpu``."""
    if asked != "auto":
        return asked
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def build_parser(prog: str = "quasar localnet") -> argparse.ArgumentParser:
    parser = WrappingParser(
        prog=prog,
        description="Run a whole QUASAR subnet on this machine (./START_LOCALNET.sh): the dev chain, the submission "
        "API, a GitHub stand-in, the validator neuron and two miner neurons (one on an honest fork, one "
        "on a hostile fork). Prints the miners' verdicts, the API's leaderboard and the weights the "
        "validator set on chain. Evaluates on CUDA when torch sees a GPU, otherwise on CPU at small "
        "lengths (not a benchmark). Progress goes to stderr.",
        epilog="Without --once the network keeps running after the first round (submit your own fork to the "
        "printed API) until Ctrl-C.",
    )
    parser.add_argument("--once", action="store_true", help="exit (status 0) after the first round")
    parser.add_argument("--json", action="store_true", help="print only the summary, as JSON, on stdout")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DATA_DIR,
        help="folder for the network's files: chain, API database, wallets, forks and their GitHub "
        "stand-in, the miners' workspaces, logs; emptied at each start (default ./localnet-data)",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="where the miners and the validator evaluate (default: cuda when torch sees a GPU, else cpu)",
    )
    parser.add_argument(
        "--reference-model",
        default="",
        help="model for logit checks: a folder or a cached Hugging Face id (default: "
        "REFERENCE_MODEL's default when cached, else a tiny random stand-in)",
    )
    parser.add_argument(
        "--stand-in-model",
        action="store_true",
        help="use the tiny random stand-in model even when the real one is cached",
    )
    parser.add_argument(
        "--target",
        type=int,
        default=None,
        help=f"the honest miner's target sequence length (default {CPU_TARGET} on CPU, {CUDA_TARGET} on CUDA; "
        f"the hostile miner targets {HOSTILE_TARGET})",
    )
    parser.add_argument(
        "--seq-lens",
        type=seq_lens,
        default=None,
        metavar="LIST",
        help="lengths the validator (and the honest miner) run besides the target (default "
        f"{format_seq_lens(CPU_SEQ_LENS)} on CPU, {format_seq_lens(CUDA_SEQ_LENS)} on CUDA); one must "
        f"exceed {HOSTILE_TARGET}, or nothing shows the hostile fork wrong",
    )
    parser.add_argument(
        "--round-timeout",
        type=float,
        default=None,
        metavar="SECONDS",
        help=f"give up when the validator has not reported by then (default {CPU_ROUND_TIMEOUT_S:g} on CPU, "
        f"{CUDA_ROUND_TIMEOUT_S:g} on CUDA)",
    )
    parser.add_argument(
        "--hyperparameters",
        choices=("localnet", "finney"),
        default="localnet",
        help="the subnet's hyperparameters: finney's defaults for a new subnet (a round takes minutes: "
        f"tempo {FINNEY.tempo} blocks, weights rate limit {FINNEY.weights_rate_limit}), or finney's with a "
        f"tempo of {LOCALNET_HYPERPARAMETERS.tempo} blocks and a weights rate limit of "
        f"{LOCALNET_HYPERPARAMETERS.weights_rate_limit} (default)",
    )
    parser.add_argument("--debug", action="store_true", help="log the local network's own debug messages")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "quasar localnet") -> int:
    """Run the network; exit status 0 (after the first round with --once, or when stopped), 1 on an error."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    if args.target is not None and args.target < MIN_SEQ_LEN:
        parser.error(f"--target must be at least {MIN_SEQ_LEN}, got {args.target}")
    setup_logging(args.debug, quiet=True)
    stop = threading.Event()
    stop_on_signals(stop)

    from quasar.chain import ChainError
    from quasar.localnet.forks import ForkWriteError
    from quasar.localnet.host import data_dir_lock, own_data_dir_entries, reset_data_dir
    from quasar.localnet.network import LocalNetwork
    from quasar.localnet.options import LocalnetError, check_data_dir, default_options, evaluated_lengths
    from quasar.localnet.processes import ChildFailed
    from quasar.starter_fork import StarterForkError

    # Messages are wrapped by the display alone (paths in them stay whole); piped tables get room.
    err = Console(stderr=True, soft_wrap=True)
    out = Console()
    if not out.is_terminal:
        out = Console(width=PIPED_WIDTH)
    display = Display(err)
    ok = False
    try:
        device = detect_device(args.device)
        options = default_options(
            args.data_dir,
            device,
            args.reference_model,
            args.stand_in_model,
            args.target,
            args.seq_lens,
            args.round_timeout,
            args.hyperparameters,
        )
        lengths = ", ".join(f"{length:,}" for length in evaluated_lengths(options))
        if device == "cpu":
            display.say(
                f"No CUDA device: the validator evaluates on CPU at small lengths (T = {lengths}). "
                "CPU figures are not benchmarks; on a GPU machine this runs on CUDA.",
                style="yellow",
            )
        else:
            display.say(f"Evaluating on CUDA at T = {lengths}.")
        check_data_dir(options.data_dir)
        own_data_dir_entries(options.data_dir.resolve())
        with data_dir_lock(options.data_dir.resolve()):
            reset_data_dir(options.data_dir.resolve())
            network = LocalNetwork(options, display, stop)
            display.say(f"Data, wallets and logs: {network.data_dir}")
            try:
                network.start()
                summary = network.wait_for_round()
                display.step("round done")
                if args.once:
                    network.stop()
                display.close(ok=True)
                _emit(summary, args.json, out, network)
                if args.once:
                    ok = True
                    return 0
                github = network.github
                assert github is not None  # started with the network, stopped only by stop()
                err.print(running_text(network, github), markup=False, highlight=False)
                network.watch(lambda new: _emit(new, args.json, out, network))
            finally:
                network.stop()
    except KeyboardInterrupt:
        display.close(ok=False)
        err.print("stopped")
        return 0 if not args.once else 130
    except (LocalnetError, ChildFailed, TimeoutError, ChainError, StarterForkError, ForkWriteError) as error:
        display.close(ok=False)
        display.say(f"error: {error}", style="red")
        return 1
    finally:
        display.close(ok=ok)
    return 0


def running_text(network, github) -> str:
    """What a network left running (without --once) says: where its API, dashboard, wallets,
    miners' work and logs are, and the miners' status command, the chain's flags and the dev
    chain's own command (which names the file --path) to copy."""
    chain = f"--subtensor.network devchain --devchain.path {network.chain_path} --netuid {NETUID}"
    status = f"quasar status --wallet.path {network.wallet_dir} --wallet.name miner-hostile --wallet.hotkey default"
    return (
        f"\nThe local network keeps running; Ctrl-C stops it.\n"
        f"  submission API  {network.api_url}\n"
        f"  API hotkey      {network.hotkey('api')}\n"
        f"  dashboard       {network.dashboard_url}\n"
        f"  GitHub stand-in {github.api_url}\n"
        f"  repositories    {github.root}\n"
        f"  wallets         {network.wallet_dir}\n"
        f"  miners' work    {network.miners_dir}\n"
        f"  logs            {network.logs_dir}\n"
        f"  a miner's status:\n{shell_command(f'{status} {chain}', '    ')}\n"
        f"  the chain, for other commands:\n{shell_command(chain, '    ')}\n"
        f"  the chain itself (quasar devchain --help lists more):\n"
        f"{shell_command(f'quasar devchain --path {network.chain_path} neurons', '    ')}"
    )


def _emit(summary, as_json: bool, out: Console, network) -> None:
    """Print the summary (tables or JSON) and keep it in the data folder as JSON."""
    from quasar.localnet.summary import render_summary

    data = summary.to_json()
    (network.data_dir / SUMMARY_FILE).write_text(json.dumps(data, indent=2) + "\n")
    if as_json:
        print(json.dumps(data), flush=True)
    else:
        render_summary(summary, out, network.uid_names())
