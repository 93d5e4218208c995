"""The dev chain's command line: ``quasar devchain [--path FILE] COMMAND`` (or ``python -m
quasar.chain.devchain``; the file by default the DEVCHAIN_PATH setting's, as the processes read it)
with the commands ``init``, ``register``, ``deregister``, ``set-owner``, ``set-permit``,
``advance``, ``block``, ``neurons``, ``weights``, ``commits``, ``hyperparameters``,
``set-hyperparameter``, ``trim``, ``stake-threshold``, ``min-non-immune-uids``,
``max-allowed-validators``, ``allow-loopback`` and ``identity``. Its tables fit 80 columns.
"""

from __future__ import annotations

import sys

from rich.console import Console

from quasar import config
from quasar.chain.base import ChainError
from quasar.chain.devchain import DevChain
from quasar.chain.devchain_storage import DEFAULT_BLOCK_TIME_S, DEFAULT_NETUID
from quasar.chain.subtensor_rules import FINNEY, HYPERPARAMETER_NAMES
from quasar.log import setup_logging
from quasar.terminal import WrappingParser, compact_table, short_hotkey, wrapped

DESCRIPTION = (
    "The embedded local dev chain: a Bittensor-like subnet in one SQLite file, for one-machine runs and tests."
)


def _print_neurons(chain: DevChain, console: Console) -> None:
    metagraph = chain.metagraph()
    table = compact_table(f"dev subnet {chain.netuid} at block {metagraph.block}")
    table.add_column("uid", justify="right")
    table.add_column("hotkey", no_wrap=True)
    table.add_column("coldkey", no_wrap=True)
    table.add_column("stake", justify="right")
    table.add_column("permit")
    table.add_column("endpoint", overflow="fold")
    for n in metagraph.neurons:
        table.add_row(
            str(n.uid),
            short_hotkey(n.hotkey),
            short_hotkey(n.coldkey),
            f"{n.stake:g}",
            "yes" if n.validator_permit else "",
            n.endpoint.base_url.removeprefix("http://") if n.endpoint else "",
        )
    console.print(table)


def _print_weights(chain: DevChain, console: Console) -> None:
    table = compact_table(f"weights on dev subnet {chain.netuid}")
    for column in ("setter uid", "target uid", "weight"):
        table.add_column(column, justify="right")
    for setter, targets in chain.weights().items():
        for target, weight in targets.items():
            table.add_row(str(setter), str(target), f"{weight:.6f}")
    console.print(table)


# The commits `commits` lists without --all: a local network's validator commits every few blocks.
NEWEST_COMMITS = 20


def _print_commits(chain: DevChain, console: Console, every: bool) -> None:
    commits = chain.commits()
    shown = commits if every else commits[-NEWEST_COMMITS:]
    table = compact_table(f"weight commits on dev subnet {chain.netuid}")
    table.add_column("hotkey", no_wrap=True)
    table.add_column("commit block", justify="right")
    table.add_column("reveal block", justify="right")
    table.add_column("outcome", overflow="fold")
    for commit in shown:
        table.add_row(
            short_hotkey(commit.hotkey), str(commit.commit_block), str(commit.reveal_block), commit.outcome or "pending"
        )
    console.print(table)
    if len(shown) < len(commits):
        console.print(f"the newest {len(shown)} of {len(commits):,} commits; --all lists every one")


def _print_hyperparameters(chain: DevChain, console: Console) -> None:
    table = compact_table(f"hyperparameters of dev subnet {chain.netuid}")
    table.add_column("name")
    table.add_column("value", justify="right")
    table.add_column("finney's default", justify="right")
    current = chain.hyperparameters()
    for name in HYPERPARAMETER_NAMES:
        table.add_row(name, str(getattr(current, name)), str(getattr(FINNEY, name)))
    console.print(table)


def _hyperparameter_value(name: str, raw: str) -> int | bool:
    if name == "commit_reveal_enabled":
        lowered = raw.strip().lower()
        if lowered not in ("true", "false", "1", "0"):
            raise ChainError(f"{name} takes true or false, got {raw!r}")
        return lowered in ("true", "1")
    try:
        return int(raw)
    except ValueError:
        raise ChainError(f"{name} takes an integer, got {raw!r}") from None


def main(argv: list[str] | None = None, prog: str = "quasar devchain") -> int:
    parser = WrappingParser(prog=prog, description=DESCRIPTION)
    parser.add_argument(
        "--path",
        help="the dev chain's SQLite file, created when missing (default: the DEVCHAIN_PATH setting, "
        f"{config.OPTIONS_BY_KEY['devchain_path'].default})",
    )
    parser.add_argument("--netuid", type=int, default=None, help=f"subnet id for a new file (default {DEFAULT_NETUID})")
    parser.add_argument(
        "--block-time",
        type=float,
        default=None,
        help=f"seconds per block for a new file (default {DEFAULT_BLOCK_TIME_S:g})",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("init", help="create the file (no-op when it exists)")
    register = commands.add_parser("register", help="register a hotkey; prints its uid")
    register.add_argument("--hotkey", required=True, help="hotkey ss58 address")
    register.add_argument("--coldkey", required=True, help="coldkey ss58 address")
    register.add_argument("--stake", type=float, default=0.0)
    register.add_argument(
        "--validator",
        action="store_true",
        help="give it a validator permit now (each epoch keeps one only for a stake among the largest)",
    )
    deregister = commands.add_parser("deregister", help="take a hotkey off the subnet (its uid goes to the next one)")
    deregister.add_argument("--hotkey", required=True)
    owner = commands.add_parser("set-owner", help="make a hotkey (and its coldkey) the subnet owner")
    owner.add_argument("--hotkey", required=True)
    owner.add_argument("--coldkey", default=None, help="the owning coldkey (default: the hotkey's registered one)")
    permit = commands.add_parser(
        "set-permit", help="grant or revoke a validator permit now (the next epoch recomputes it from the stakes)"
    )
    permit.add_argument("--hotkey", required=True)
    permit.add_argument("--revoke", action="store_true")
    advance = commands.add_parser("advance", help="move the chain N blocks ahead")
    advance.add_argument("blocks", type=int)
    commands.add_parser("block", help="print the current block")
    commands.add_parser("neurons", help="list the neurons")
    commands.add_parser("weights", help="list the weights validators set (revealed ones, on commit-reveal)")
    commits = commands.add_parser("commits", help="list the newest weight commits and what became of them")
    commits.add_argument("--all", action="store_true", help=f"every commit, not only the newest {NEWEST_COMMITS}")
    commands.add_parser("hyperparameters", help="list the subnet's hyperparameters beside finney's defaults")
    hyperparameter = commands.add_parser("set-hyperparameter", help="change one hyperparameter")
    hyperparameter.add_argument(
        "name", choices=HYPERPARAMETER_NAMES, metavar="NAME", help="a name the hyperparameters command lists"
    )
    hyperparameter.add_argument("value", help="an integer (true or false for commit_reveal_enabled)")
    trim = commands.add_parser(
        "trim", help="shrink the subnet to N uids as the owner's trim does; prints each neuron that moved"
    )
    trim.add_argument("max_n", type=int, metavar="N", help="the new max_allowed_uids")
    trim.add_argument("--min-allowed-uids", type=int, help="first set the fewest uids a trim leaves (default 64)")
    threshold = commands.add_parser(
        "stake-threshold", help="print the chain's StakeThreshold (least stake to set weights), or set it"
    )
    threshold.add_argument("stake", nargs="?", type=float, help="the new threshold (default 0, subtensor's)")
    floor = commands.add_parser(
        "min-non-immune-uids",
        help="print the subnet's MinNonImmuneUids (a full subnet replaces an immune neuron while no more "
        "than this many are past immunity), or set it",
    )
    floor.add_argument("count", nargs="?", type=int, help="the new count (default 10, subtensor's)")
    validators = commands.add_parser(
        "max-allowed-validators",
        help="print the subnet's MaxAllowedValidators (each epoch gives this many of the largest stakes a "
        "validator permit), or set it",
    )
    validators.add_argument("count", nargs="?", type=int, help="the new count (default 64, a new subnet's)")
    loopback = commands.add_parser(
        "allow-loopback",
        help="let this file store loopback endpoints (subtensor refuses them; the local network needs them)",
    )
    loopback.add_argument("state", choices=("on", "off"))
    commands.add_parser("identity", help="print the API location published in the subnet identity")
    args = parser.parse_args(argv)
    setup_logging(quiet=True)
    if args.path is None:  # the file the processes on the dev chain use, from .env or the environment
        try:
            args.path = config.resolve().devchain_path
        except config.SettingsError as error:
            parser.error(str(error))
    console = Console()
    try:
        chain = DevChain(args.path, netuid=args.netuid, block_time_s=args.block_time)
        if args.command == "register":
            print(chain.register(args.hotkey, args.coldkey, args.stake, args.validator))
        elif args.command == "deregister":
            chain.deregister(args.hotkey)
        elif args.command == "set-owner":
            chain.set_owner(args.hotkey, args.coldkey)
        elif args.command == "set-permit":
            chain.set_validator_permit(args.hotkey, not args.revoke)
        elif args.command == "advance":
            print(chain.advance(args.blocks))
        elif args.command == "block":
            print(chain.current_block())
        elif args.command == "neurons":
            _print_neurons(chain, console)
        elif args.command == "weights":
            _print_weights(chain, console)
        elif args.command == "commits":
            _print_commits(chain, console, args.all)
        elif args.command == "hyperparameters":
            _print_hyperparameters(chain, console)
        elif args.command == "set-hyperparameter":
            chain.set_hyperparameters(**{args.name: _hyperparameter_value(args.name, args.value)})
            _print_hyperparameters(chain, console)
        elif args.command == "trim":
            if args.min_allowed_uids is not None:
                chain.set_min_allowed_uids(args.min_allowed_uids)
            for old, new in chain.trim_to_max_allowed_uids(args.max_n).items():
                if old != new:
                    print(f"uid {old} -> {new}")
        elif args.command == "stake-threshold":
            if args.stake is not None:
                chain.set_stake_threshold(args.stake)
            print(f"{chain.stake_threshold():g}")
        elif args.command == "min-non-immune-uids":
            if args.count is not None:
                chain.set_min_non_immune_uids(args.count)
            print(chain.min_non_immune_uids())
        elif args.command == "max-allowed-validators":
            if args.count is not None:
                chain.set_max_allowed_validators(args.count)
            print(chain.max_allowed_validators())
        elif args.command == "allow-loopback":
            chain.allow_loopback_axons(args.state == "on")
        elif args.command == "identity":
            location = chain.api_location()
            print("no API location published" if location is None else f"{location.url} {location.hotkey}".strip())
    except ChainError as error:
        print(wrapped(f"{prog}: error: {error}"), file=sys.stderr)
        return 1
    return 0
