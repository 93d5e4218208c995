"""Resolving the settings of one process: default < ``.env`` < environment < flag."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values

from quasar.config.options import OPTIONS, OPTIONS_BY_KEY, Option
from quasar.config.values import DEV_NETWORK, PUBLIC_NETWORKS
from quasar.errors import QuasarError
from quasar.log import log_when_set_up

logger = logging.getLogger(__name__)


class SettingsError(QuasarError, ValueError):
    """A setting has a value that cannot be used; the message names the setting and its source."""


@dataclass(frozen=True)
class Settings:
    """The resolved settings of one process. Secrets are left out of ``repr``."""

    wallet_name: str
    wallet_miner_name: str
    wallet_validator_name: str
    wallet_hotkey: str
    wallet_path: str
    network: str
    chain_endpoint: str
    netuid: int
    debug: bool
    validator_api_url: str
    miner_inference_port: int
    github_token: str = field(repr=False)
    github_username: str
    target_sequence_length: int | None
    agent_iterations: int
    optimization_interval: float
    github_api_url: str
    upstream_repo: str
    git_remote_base: str
    workspace_root: str
    submission_mode: str
    min_improvement: float
    claim_share: float
    agent_api_url: str
    agent_model: str
    agent_api_key: str = field(repr=False)
    agent_timeout: float
    axon_external_ip: str
    axon_external_port: int | None
    git_author_name: str
    git_author_email: str
    miner_allow_unsandboxed: bool
    reference_model: str
    hf_hub_offline: bool
    device: str
    pytorch_cuda_alloc_conf: str
    reference_dtype: str
    logits_min_cosine: float
    logits_max_abs_diff: float
    logits_timeout: float
    logits_max_prompt_len: int
    logits_max_gen_len: int
    allow_private_endpoints: bool
    inference_host: str
    inference_max_prompt_len: int
    inference_max_gen_len: int
    inference_queue_size: int
    inference_max_connections_per_client: int
    tie_epsilon: float
    database_url: str
    api_host: str
    api_port: int
    api_workers: int
    api_hotkey: str
    api_max_header_bytes: int
    api_header_timeout: float
    trusted_proxies: tuple[str, ...]
    blocks_until_reveal: int
    reveal_window_blocks: int
    round_blocks: int
    submissions_per_hour: int
    quorum_stake_share: float
    quorum_min_validators: int
    evaluation_lease_s: float
    allow_local_forks: bool
    devchain_path: str
    devchain_block_time: float
    validator_data_dir: str
    validator_role: str
    epoch_blocks: int
    eval_seq_lens: tuple[int, ...]
    eval_timeout: float
    eval_timed_seconds: float
    eval_load_timeout: float
    sandbox_memory_mb: int
    sandbox_cgroup: str
    triton_seed_dir: str

    def wallet_name_for(self, role: str) -> str:
        """The wallet name for ``role`` ("miner" or "validator"): ``--wallet.name`` wins."""
        if self.wallet_name:
            return self.wallet_name
        if role == "miner":
            return self.wallet_miner_name
        if role == "validator":
            return self.wallet_validator_name
        raise ValueError(f"unknown role {role!r}")

    @property
    def local_forks_allowed(self) -> bool:
        """Whether fork URLs may be local paths or file:// URLs: on the embedded dev chain, or where
        ALLOW_LOCAL_FORKS says so (docs/rules.md section 3)."""
        return self.network == DEV_NETWORK or self.allow_local_forks

    @property
    def private_endpoints_allowed(self) -> bool:
        """Whether the logit check connects to miners at loopback, private or link-local addresses:
        off the public networks (the dev chain, a local subtensor), or where ALLOW_PRIVATE_ENDPOINTS
        says so (docs/rules.md section 4)."""
        return self.network not in PUBLIC_NETWORKS or self.allow_private_endpoints

    @property
    def wallet_dir(self) -> Path:
        return Path(os.path.expanduser(self.wallet_path))

    def secrets(self) -> list[str]:
        """Values that must never appear in logs (used by the logging redaction filter)."""
        return [getattr(self, o.key) for o in OPTIONS if o.secret and getattr(self, o.key)]

    def public_items(self) -> list[tuple[str, str]]:
        """(setting, value) pairs safe to print: secrets show only whether they are set."""
        items = []
        for option in OPTIONS:
            value = getattr(self, option.key)
            shown = ("set" if value else "not set") if option.secret else ("" if value is None else str(value))
            items.append((option.env or option.key, shown))
        return items


# The checkout this package runs from (an editable install's), where .env.example and a .env live.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Variables libraries read from the process environment (Hugging Face's hub and cache, CUDA's
# GPUs): a .env setting them reaches them too, below the environment's own, in every process (the
# inference server's START script exports no .env; CUDA reads them when it starts, after this).
LIBRARY_VARIABLES = ("HF_HUB_OFFLINE", "HF_HOME", "HF_ENDPOINT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


# Settings an older QUASAR read and this one does not, with what does their work now: an .env
# written from an older .env.example still sets them, and the operator is told rather than left
# relying on a setting that does nothing (README, 'Upgrading').
RETIRED_SETTINGS = {
    "AXON_PORT": "the port published on chain is AXON_EXTERNAL_PORT (empty: MINER_INFERENCE_PORT, where the "
    "inference server listens); move its value there if a router forwards that port, then remove AXON_PORT",
}


# Names the .env file to read in place of the current folder's or the checkout's; set empty, none
# is read (the local network's children, whose settings all come as flags).
DOTENV_VARIABLE = "QUASAR_DOTENV"


def default_dotenv_path() -> Path | None:
    """The .env to read: the file ``QUASAR_DOTENV`` names (none where it is set empty), else the
    current folder's, else the checkout's (a command started from another folder reads the same
    settings as one started in the checkout)."""
    named = os.environ.get(DOTENV_VARIABLE)
    if named is not None:
        if not named:
            return None
        path = Path(named).expanduser()
        if not path.is_file():
            raise SettingsError(
                f"{DOTENV_VARIABLE} names {named}, which is not a file: name a .env file there, or set it empty "
                "to read none"
            )
        return path
    here = Path.cwd() / ".env"
    return here if here.is_file() else PROJECT_ROOT / ".env"


def resolve(
    flags: Mapping[str, str | None] | argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike | None | Literal["default"] = "default",
) -> Settings:
    """Resolve every setting: default < ``.env`` < ``environ`` < ``flags``.

    ``flags`` maps setting keys to raw strings (None = not given), or is the namespace from a
    parser built with :func:`add_arguments`. ``environ`` defaults to ``os.environ``, into which the
    .env's :data:`LIBRARY_VARIABLES` the environment does not set are then put.
    ``dotenv_path``: :func:`default_dotenv_path` by default; None reads no .env. A setting of
    :data:`RETIRED_SETTINGS` in the .env or ``environ`` is logged as a warning naming what replaced it.
    """
    if isinstance(flags, argparse.Namespace):
        flags = vars(flags)
    flags = flags or {}
    exported = environ is None
    environ = os.environ if environ is None else environ
    if dotenv_path == "default":
        dotenv_path = default_dotenv_path()
    dotenv: dict[str, str | None] = {}
    if dotenv_path is not None and Path(dotenv_path).is_file():
        dotenv = dotenv_values(dotenv_path)
    if exported:
        for name in LIBRARY_VARIABLES:
            if name not in os.environ and dotenv.get(name) is not None:
                os.environ[name] = str(dotenv[name])

    for name, instead in RETIRED_SETTINGS.items():
        # The .env is named first: the START scripts export it, and there is the line to remove.
        source = str(dotenv_path) if dotenv.get(name) is not None else "environment" if name in environ else None
        if source is not None:
            log_when_set_up(logger, logging.WARNING, "%s (from %s) is no longer read: %s", name, source, instead)

    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw, source = _raw_and_source(option, flags, environ, dotenv, dotenv_path)
        try:
            values[option.key] = option.parse(raw)
        except ValueError as error:
            raise SettingsError(f"{_named(option, source)}: {error}") from None
    return Settings(**values)


def _raw_and_source(
    option: Option,
    flags: Mapping[str, str | None],
    environ: Mapping[str, str],
    dotenv: Mapping[str, str | None],
    dotenv_path: str | os.PathLike | None,
) -> tuple[Any, str]:
    """``option``'s raw value and where it came from: the flag, the environment, the .env, the default."""
    raw: Any = option.default
    source = "default"
    if option.env and dotenv.get(option.env) is not None:
        raw, source = dotenv[option.env], f"{dotenv_path}"
    if option.env and option.env in environ:
        raw, source = environ[option.env], "environment"
    if flags.get(option.key) is not None:
        raw, source = flags[option.key], "command line"
    return raw, source


def _named(option: Option, source: str) -> str:
    """``--netuid (from command line)``, ``NETUID (from environment)``: the name the reader gave it."""
    named = option.flag if source == "command line" else (option.env or option.key)
    return f"{named} (from {source})"


def named_setting(key: str, flags: Mapping[str, str | None] | None = None) -> str:
    """Setting ``key`` named as a refusal of its value names it, by where :func:`resolve` reads the
    value from (``flags``, this process's environment, the .env it reads): ``--device (from command
    line)``, ``DEVICE (from environment)``, ``DEVICE (from /home/m/quasar/.env)``. For a refusal
    :func:`resolve` cannot make: a value of the right form that this host cannot serve. (A
    :data:`LIBRARY_VARIABLES` setting that :func:`resolve` put into the environment from the .env
    is named as the environment's.)"""
    dotenv_path = default_dotenv_path()
    dotenv = dotenv_values(dotenv_path) if dotenv_path is not None and Path(dotenv_path).is_file() else {}
    option = OPTIONS_BY_KEY[key]
    return _named(option, _raw_and_source(option, flags or {}, os.environ, dotenv, dotenv_path)[1])


def settings_keys() -> list[str]:
    """Names of the Settings fields (used by tests to keep OPTIONS and Settings in step)."""
    return [f.name for f in fields(Settings)]
