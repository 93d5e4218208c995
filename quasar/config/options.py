"""The one table of settings (settings.toml): each one's environment variable, flag, parser,
default and meaning, the group --help lists it under, and the processes that read it (ROLES)."""

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


# The table itself is data: settings.toml beside this file, one entry per setting.
SETTINGS_TABLE = Path(__file__).with_name("settings.toml")
_ENTRY_FIELDS = {"env", "flag", "kind", "low", "high", "choices", "default", "group", "brief", "help", "secret",
                 "aliases"}


def load_options(path: Path = SETTINGS_TABLE) -> tuple[Option, ...]:
    """The settings of ``path`` (settings.toml's format), in its order; ValueError naming the entry
    and field for an unknown field, a missing one or a kind without its bounds."""
    table = tomllib.loads(path.read_text())
    options = []
    for key, entry in table.items():
        unknown = set(entry) - _ENTRY_FIELDS
        if unknown:
            raise ValueError(f"{path.name} [{key}]: unknown field(s) {', '.join(sorted(unknown))}")
        try:
            parse = parser_for(entry["kind"], entry.get("low"), entry.get("high"), entry.get("choices", ()))
            options.append(Option(key, entry.get("env"), entry.get("flag"), parse, entry["default"], entry["help"],
                                  secret=entry.get("secret", False), aliases=tuple(entry.get("aliases", ())),
                                  group=entry["group"], brief=entry["brief"]))
        except KeyError as missing:
            raise ValueError(f"{path.name} [{key}]: missing field {missing}") from None
        except ValueError as error:
            raise ValueError(f"{path.name} [{key}]: {error}") from None
    return tuple(options)


OPTIONS = load_options()

OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}
# The lengths an evaluation benchmarks besides the target unless told otherwise (EVAL_SEQ_LENS).
DEFAULT_SEQ_LENS: tuple[int, ...] = parse_seq_lens(OPTIONS_BY_KEY["eval_seq_lens"].default)

# The headings of --help, in the order they are shown.
GROUPS = ("wallet", "chain", "process", "submission API", "miner", "inference server", "evaluation",
          "reference model", "logit check", "scoring", "validator")

_WALLET = ("wallet_name", "wallet_hotkey", "wallet_path")
_CHAIN = ("network", "chain_endpoint", "netuid", "devchain_path", "devchain_block_time")
_EVALUATION = ("device", "pytorch_cuda_alloc_conf", "eval_seq_lens", "eval_timeout", "eval_timed_seconds",
               "eval_load_timeout", "sandbox_memory_mb", "sandbox_cgroup")
_MINER = tuple(option.key for option in OPTIONS if option.group == "miner")
_API_SERVER = tuple(option.key for option in OPTIONS
                    if option.group == "submission API" and option.key != "validator_api_url")

# The settings each process reads (what its --help lists); a process not named here lists them all.
ROLES: dict[str, tuple[str, ...]] = {
    "miner": (*_WALLET, "wallet_miner_name", *_CHAIN, "debug", "validator_api_url", "api_hotkey", *_MINER,
              "miner_inference_port", *_EVALUATION),
    "validator": (*_WALLET, "wallet_validator_name", *_CHAIN, "allow_local_forks", "debug", "validator_api_url", "api_hotkey",
                  *_EVALUATION,
                  "reference_model", "hf_hub_offline", "reference_dtype",
                  *(option.key for option in OPTIONS if option.group == "logit check"),
                  "tie_epsilon", "validator_data_dir", "validator_role", "epoch_blocks"),
    "inference": (*_WALLET, "wallet_miner_name", *_CHAIN, "debug",
                  *(option.key for option in OPTIONS if option.group == "inference server"),
                  "device", "pytorch_cuda_alloc_conf", "reference_model", "hf_hub_offline", "reference_dtype"),
    "api": (*_WALLET, *_CHAIN, "allow_local_forks", "debug", *_API_SERVER, "tie_epsilon"),
    "evaluate": ("debug", *_EVALUATION),
}
