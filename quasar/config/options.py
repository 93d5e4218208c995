"""The table of settings (settings/, one file per --help group): each one's environment variable,
flag, parser, default and meaning, the group --help lists it under, and the processes that read
it (ROLES).

An entry of a group's file: ``[key]`` then ``env`` (the variable), ``flag`` (and ``aliases``,
other spellings), ``kind`` (how its text is parsed: values.py's PARSERS, with ``low``, ``high``
or ``choices`` where the kind takes them), ``default`` (as it would appear in .env), ``brief``
(a few words for one line of --help) and ``help`` (its whole meaning, for .env.example). A
setting of kind ``secret`` is never logged."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quasar.config.values import parse_seq_lens, parser_for


@dataclass(frozen=True)
class Option:
    """One setting: where it is read from, how it is parsed, and what it means."""

    key: str
    env: str | None
    flag: str | None
    parse: Callable[[str], Any]
    default: str
    help: str  # the whole meaning, as .env.example says it
    secret: bool = False
    aliases: tuple[str, ...] = ()  # other spellings of ``flag``
    group: str = ""  # the heading it is listed under in --help (one of GROUPS)
    brief: str = ""  # its meaning in a few words, for one line of --help at 80 columns


# The headings of --help, in the order they are shown; each is one file of settings/.
GROUPS = (
    "wallet",
    "chain",
    "process",
    "submission API",
    "miner",
    "inference server",
    "evaluation",
    "reference model",
    "logit check",
    "scoring",
    "validator",
)
SETTINGS_DIR = Path(__file__).with_name("settings")
_ENTRY_FIELDS = {"env", "flag", "kind", "low", "high", "choices", "default", "brief", "help", "aliases"}


def group_file(group: str, folder: Path = SETTINGS_DIR) -> Path:
    """The file of ``group``'s settings: its name in lower case, spaces as underscores."""
    return folder / (group.lower().replace(" ", "_") + ".toml")


def load_group(path: Path, group: str) -> list[Option]:
    """The settings of one group's file, in its order; ValueError naming the file, entry and field
    for an unknown field, a missing one or a kind without its bounds."""
    options = []
    for key, entry in tomllib.loads(path.read_text()).items():
        unknown = set(entry) - _ENTRY_FIELDS
        if unknown:
            raise ValueError(f"{path.name} [{key}]: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            parse = parser_for(entry["kind"], entry.get("low"), entry.get("high"), entry.get("choices", ()))
            options.append(
                Option(
                    key,
                    entry.get("env"),
                    entry.get("flag"),
                    parse,
                    entry["default"],
                    entry["help"],
                    secret=entry["kind"] == "secret",
                    aliases=tuple(entry.get("aliases", ())),
                    group=group,
                    brief=entry["brief"],
                )
            )
        except KeyError as missing:
            raise ValueError(f"{path.name} [{key}]: missing field {missing}") from None
        except ValueError as error:
            raise ValueError(f"{path.name} [{key}]: {error}") from None
    return options


def load_options(folder: Path = SETTINGS_DIR) -> tuple[Option, ...]:
    """Every setting of ``folder``'s group files, group by group in :data:`GROUPS` order;
    ValueError for a file that is no group's, a missing group file, or a key in two files."""
    expected = {group_file(group, folder).name: group for group in GROUPS}
    strays = sorted(path.name for path in folder.glob("*.toml") if path.name not in expected)
    if strays:
        raise ValueError(f"{folder}: {', '.join(strays)} name no group of GROUPS ({', '.join(expected)})")
    options: list[Option] = []
    for group in GROUPS:
        path = group_file(group, folder)
        if not path.is_file():
            raise ValueError(f"{folder}: the group {group!r} has no file {path.name}")
        options += load_group(path, group)
    keys = [option.key for option in options]
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise ValueError(f"{folder}: {', '.join(repeated)} defined in more than one file")
    return tuple(options)


OPTIONS = load_options()

OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}
# The lengths an evaluation benchmarks besides the target unless told otherwise (EVAL_SEQ_LENS).
DEFAULT_SEQ_LENS: tuple[int, ...] = parse_seq_lens(OPTIONS_BY_KEY["eval_seq_lens"].default)
# The reference model of docs/rules.md section 4, what every logit check on a public network is
# against: REFERENCE_MODEL's default.
REFERENCE_MODEL_ID: str = OPTIONS_BY_KEY["reference_model"].default


def _group_keys(group: str) -> tuple[str, ...]:
    """The keys of ``group``'s settings, in its file's order."""
    return tuple(option.key for option in OPTIONS if option.group == group)


_WALLET = ("wallet_name", "wallet_hotkey", "wallet_path")
_CHAIN = ("network", "chain_endpoint", "netuid", "devchain_path", "devchain_block_time")
# The process settings an evaluation reads, and every setting of the evaluation group.
_EVALUATION = ("device", "pytorch_cuda_alloc_conf", *_group_keys("evaluation"))
_MINER = _group_keys("miner")
_API_SERVER = tuple(key for key in _group_keys("submission API") if key != "validator_api_url")

# The settings each process reads (what its --help lists); a process not named here lists them all.
ROLES: dict[str, tuple[str, ...]] = {
    "miner": (
        *_WALLET,
        "wallet_miner_name",
        *_CHAIN,
        "debug",
        "validator_api_url",
        "api_hotkey",
        *_MINER,
        "miner_inference_port",
        *_EVALUATION,
    ),
    "validator": (
        *_WALLET,
        "wallet_validator_name",
        *_CHAIN,
        "allow_local_forks",
        "debug",
        "validator_api_url",
        "api_hotkey",
        *_EVALUATION,
        "reference_model",
        "hf_hub_offline",
        "reference_dtype",
        *_group_keys("logit check"),
        "tie_epsilon",
        "validator_data_dir",
        "validator_role",
        "epoch_blocks",
    ),
    "inference": (
        *_WALLET,
        "wallet_miner_name",
        *_CHAIN,
        "debug",
        *_group_keys("inference server"),
        "device",
        "pytorch_cuda_alloc_conf",
        "reference_model",
        "hf_hub_offline",
        "reference_dtype",
    ),
    "api": (*_WALLET, *_CHAIN, "allow_local_forks", "debug", *_API_SERVER, "tie_epsilon"),
    "evaluate": ("debug", *_EVALUATION),
}
