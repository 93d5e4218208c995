"""Settings for every QUASAR process, read in one place.

Precedence, later wins: built-in default < ``.env`` file < process environment < command-line flag.
Flags use the usual Bittensor spelling (``--wallet.name``, ``--subtensor.network``, ``--netuid``…);
environment names are those of the miner guide (``NETUID``, ``SUBTENSOR_NETWORK``…). Every option
below is documented, with its default, in ``.env.example`` (a test keeps the two in step).

A bad value raises :class:`SettingsError` naming the setting and where the value came from.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from dotenv import dotenv_values

# Bittensor's own network names, plus our embedded one-machine chain ("devchain", so it never
# collides with Bittensor's "local", which means a subtensor node on this machine).
BITTENSOR_NETWORKS = ("finney", "test", "local", "archive")
DEV_NETWORK = "devchain"
NETWORKS = BITTENSOR_NETWORKS + (DEV_NETWORK,)


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the setting and its source."""


# --- value parsers: each takes the raw string and returns the typed value or raises ValueError ---


def _parse_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip().replace("_", ""))
        except ValueError:
            raise ValueError(f"expected an integer, got {raw!r}") from None
        if value < low or (high is not None and value > high):
            bound = f"between {low} and {high}" if high is not None else f"at least {low}"
            raise ValueError(f"must be {bound}, got {value}")
        return value

    return parse


def _parse_optional_int(low: int) -> Callable[[str], int | None]:
    parse_int = _parse_int(low)

    def parse(raw: str) -> int | None:
        return None if raw.strip() == "" else parse_int(raw)

    return parse


def _parse_float(low: float) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"expected a number, got {raw!r}") from None
        if not value >= low:
            raise ValueError(f"must be at least {low}, got {raw}")
        return value

    return parse


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _parse_share(raw: str) -> float:
    """A share in (0, 1]."""
    value = _parse_float(0.0)(raw)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"must be above 0 and at most 1, got {raw}")
    return value


def _parse_bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"expected true or false, got {raw!r}")


def _parse_str(raw: str) -> str:
    return raw.strip()


def _parse_network(raw: str) -> str:
    value = raw.strip()
    if value in NETWORKS:
        return value
    raise ValueError(f"unknown network {value!r}; expected one of {', '.join(NETWORKS)}")


def _parse_chain_endpoint(raw: str) -> str:
    value = raw.strip()
    if value and urlparse(value).scheme not in ("ws", "wss"):
        raise ValueError(f"expected a ws:// or wss:// URL, got {value!r}")
    return value


def _parse_http_url(raw: str) -> str:
    value = raw.strip().rstrip("/")
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ValueError(f"expected an http:// or https:// URL, got {raw!r}")
    return value


_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def _parse_device(raw: str) -> str:
    value = raw.strip()
    if not _DEVICE.match(value):
        raise ValueError(f"expected cpu, cuda or cuda:N, got {raw!r}")
    return value


_DTYPES = ("float32", "bfloat16", "float16")


def _parse_dtype(raw: str) -> str:
    value = raw.strip()
    if value not in _DTYPES:
        raise ValueError(f"expected one of {', '.join(_DTYPES)}, got {raw!r}")
    return value


def _parse_name(raw: str) -> str:
    """Wallet and user names: no path separators, so a name never escapes the wallet folder."""
    value = raw.strip()
    if not value or "/" in value or "\\" in value or value in (".", ".."):
        raise ValueError(f"expected a plain name, got {raw!r}")
    return value


def _parse_optional_name(raw: str) -> str:
    return "" if raw.strip() == "" else _parse_name(raw)


_REPO_SLUG = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")


def _parse_repo_slug(raw: str) -> str:
    """A GitHub repository as ``OWNER/REPO``."""
    value = raw.strip()
    if not _REPO_SLUG.match(value) or value.split("/")[1] in (".", ".."):
        raise ValueError(f"expected OWNER/REPO, got {raw!r}")
    return value


def _parse_git_remote_base(raw: str) -> str:
    """Where git remotes live: an http(s) URL, or ``file:///DIR`` (local bare repositories)."""
    value = raw.strip().rstrip("/")
    if value.startswith("file:///"):
        return value
    return _parse_http_url(value)


def _parse_optional_http_url(raw: str) -> str:
    return "" if raw.strip() == "" else _parse_http_url(raw)


def _parse_optional_ip(raw: str) -> str:
    """An IPv4 or IPv6 address (the chain stores addresses, not names); empty means none."""
    value = raw.strip()
    if not value:
        return ""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise ValueError(f"expected an IPv4 or IPv6 address (the chain stores no host names), got {raw!r}") from None


def _parse_choice(*choices: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def _parse_database_url(raw: str) -> str:
    value = raw.strip()
    if not value.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg2://")):
        raise ValueError("expected sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE")
    # A password here would end up in process listings and logs: it belongs in PGPASSWORD or ~/.pgpass.
    if urlparse(value).password is not None:
        raise ValueError("must not contain a password; put it in PGPASSWORD or ~/.pgpass")
    return value


def _parse_ip_networks(raw: str) -> tuple[str, ...]:
    """Comma-separated IP addresses or CIDR networks (e.g. ``127.0.0.1,10.0.0.0/8``)."""
    networks = []
    for part in filter(None, (item.strip() for item in raw.split(","))):
        try:
            networks.append(str(ipaddress.ip_network(part, strict=False)))
        except ValueError:
            raise ValueError(f"expected IP addresses or CIDR networks, got {part!r}") from None
    return tuple(networks)


def _parse_seq_lens(raw: str) -> tuple[int, ...]:
    """Comma-separated sequence lengths (``512,1024,2048``); empty means none."""
    lengths = []
    for part in filter(None, (item.strip().replace("_", "") for item in raw.split(","))):
        if not part.isdigit() or int(part) < 1:
            raise ValueError(f"expected comma-separated positive integers, got {part!r}")
        lengths.append(int(part))
    return tuple(lengths)


@dataclass(frozen=True)
class Option:
    """One setting: where it is read from, how it is parsed, and what it means."""

    key: str
    env: str | None
    flag: str | None
    parse: Callable[[str], Any]
    default: str
    help: str
    secret: bool = False
    aliases: tuple[str, ...] = ()  # other spellings of ``flag``


# The single table of settings. ``default`` is written as it would appear in .env.
OPTIONS: tuple[Option, ...] = (
    # Chain and identity (Bittensor spelling on the command line).
    Option("wallet_name", "WALLET_NAME", "--wallet.name", _parse_optional_name, "",
           "wallet (coldkey) name; empty means WALLET_MINER_NAME or WALLET_VALIDATOR_NAME by role"),
    Option("wallet_miner_name", "WALLET_MINER_NAME", None, _parse_name, "quasar_miner",
           "wallet name the miner uses when --wallet.name is not given"),
    Option("wallet_validator_name", "WALLET_VALIDATOR_NAME", None, _parse_name, "quasar_validator",
           "wallet name the validator uses when --wallet.name is not given"),
    Option("wallet_hotkey", "WALLET_HOTKEY", "--wallet.hotkey", _parse_name, "default",
           "hotkey name inside the wallet"),
    Option("wallet_path", "WALLET_PATH", "--wallet.path", _parse_str, "~/.bittensor/wallets",
           "folder holding the wallets"),
    Option("network", "SUBTENSOR_NETWORK", "--subtensor.network", _parse_network, "finney",
           "chain: finney, test, local (a subtensor node here), archive, or devchain (embedded one-machine chain)"),
    Option("chain_endpoint", "SUBTENSOR_CHAIN_ENDPOINT", "--subtensor.chain_endpoint",
           _parse_chain_endpoint, "", "ws:// or wss:// URL of a subtensor node; overrides the network's default"),
    Option("netuid", "NETUID", "--netuid", _parse_int(0, 65535), "24",
           "subnet id of QUASAR on the chosen network"),
    Option("debug", "LOGGING_DEBUG", "--logging.debug", _parse_bool, "false",
           "log at debug level"),
    # Services.
    Option("validator_api_url", "VALIDATOR_API_URL", "--api.url", _parse_optional_http_url, "",
           "base URL of the submission API; empty = the URL the subnet owner published on chain"),
    Option("miner_inference_port", "MINER_INFERENCE_PORT", "--inference.port", _parse_int(1, 65535),
           "8001", "port the miner inference server (the miner's axon) listens on: open it to the internet (TCP)",
           aliases=("--axon.port",)),
    # Miner.
    Option("github_token", "GITHUB_TOKEN", None, _parse_str, "",
           "GitHub token the miner uses to fork and push (never logged, never stored in .git/config)",
           secret=True),
    Option("github_username", "GITHUB_USERNAME", None, _parse_optional_name, "",
           "GitHub account that owns the miner's fork"),
    Option("target_sequence_length", "TARGET_SEQUENCE_LENGTH", "--target-sequence-length",
           _parse_optional_int(1), "",
           "sequence length the miner is ranked at; empty lets the miner pick the best its GPU holds"),
    Option("agent_iterations", "AGENT_ITERATIONS", "--agent-iterations", _parse_int(0), "100",
           "optimization candidates the miner tries per cycle"),
    Option("optimization_interval", "OPTIMIZATION_INTERVAL", "--optimization-interval",
           _parse_float(0.0), "300", "seconds the miner waits between optimization cycles"),
    Option("github_api_url", "GITHUB_API_URL", None, _parse_http_url, "https://api.github.com",
           "GitHub REST API the miner forks through"),
    Option("upstream_repo", "UPSTREAM_REPO", None, _parse_repo_slug, "troy12x/flash-linear-attention",
           "OWNER/REPO the miner forks when GITHUB_USERNAME has no fork of it yet"),
    Option("git_remote_base", "GIT_REMOTE_BASE", None, _parse_git_remote_base, "https://github.com",
           "base of git remotes: the fork is cloned from and pushed to BASE/OWNER/REPO (file:///DIR for local bare repos)"),
    Option("workspace_root", "WORKSPACE_ROOT", "--workspace.root", _parse_str, "~/.quasar/miner",
           "folder of the miner's workspaces, one per hotkey (its fork's clone, state and lock)"),
    Option("submission_mode", "SUBMISSION_MODE", "--submission.mode", _parse_choice("direct", "commit-reveal"),
           "direct", "direct (submit at once) or commit-reveal (commit a hash, push and reveal after BLOCKS_UNTIL_REVEAL)"),
    Option("min_improvement", "MIN_IMPROVEMENT", "--min-improvement", _parse_float(0.0), "0.02",
           "relative speed-up over the best a candidate needs to be kept and resubmitted (keep above benchmark noise)"),
    Option("claim_share", "CLAIM_SHARE", "--claim-share", _parse_share, "1.0",
           "share of the evaluation's recommended claim the miner submits; below 1 leaves room for a slower validator GPU"),
    Option("agent_api_url", "AGENT_API_URL", "--agent.url", _parse_optional_http_url, "",
           "OpenAI-compatible API (e.g. http://127.0.0.1:8080/v1) the agent strategy asks for kernel edits; empty = no agent"),
    Option("agent_model", "AGENT_MODEL", "--agent.model", _parse_str, "", "model name the agent strategy asks for"),
    Option("agent_api_key", "AGENT_API_KEY", None, _parse_str, "",
           "bearer key for AGENT_API_URL, if it needs one (never logged)", secret=True),
    Option("agent_timeout", "AGENT_TIMEOUT", None, _parse_float(1.0), "300",
           "seconds the agent strategy waits for one reply"),
    Option("axon_external_ip", "AXON_EXTERNAL_IP", "--axon.external_ip", _parse_optional_ip, "",
           "public IP address the miner publishes on chain for its inference server; empty = this machine's "
           "outward address (on finney and test a private or loopback one is refused: set this)"),
    Option("axon_external_port", "AXON_EXTERNAL_PORT", "--axon.external_port", _parse_optional_int(1), "",
           "port the miner publishes on chain; empty = MINER_INFERENCE_PORT (set it when a router forwards "
           "another public port to MINER_INFERENCE_PORT)"),
    Option("git_author_name", "GIT_AUTHOR_NAME", None, _parse_str, "",
           "author of the miner's commits; empty = GITHUB_USERNAME"),
    Option("git_author_email", "GIT_AUTHOR_EMAIL", None, _parse_str, "",
           "author email of the miner's commits; empty = GITHUB_USERNAME@users.noreply.github.com"),
    Option("miner_allow_unsandboxed", "MINER_ALLOW_UNSANDBOXED", None, _parse_bool, "false",
           "let the miner benchmark its candidates without the namespace sandbox where namespaces are unavailable"),
    # Evaluation.
    Option("reference_model", "REFERENCE_MODEL", "--reference-model", _parse_str,
           "Qwen/Qwen2.5-0.5B-Instruct", "model for logit verification: a Hugging Face id or a local folder"),
    Option("device", "DEVICE", "--device", _parse_device, "cuda",
           "torch device for benchmarks and the reference model: cuda, cuda:N or cpu"),
    Option("pytorch_cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF", None, _parse_str,
           "expandable_segments:True", "passed to PyTorch's CUDA allocator in benchmark processes"),
    # Logit verification (validator) and the miner inference server.
    Option("reference_dtype", "REFERENCE_DTYPE", "--reference-dtype", _parse_dtype, "float32",
           "dtype the reference model runs in: float32 (what validators use; see README), bfloat16 or float16"),
    Option("logits_min_cosine", "LOGITS_MIN_COSINE", "--logits.min-cosine", _parse_float(0.0), "0.99",
           "logit check passes only with cosine similarity at least this"),
    Option("logits_max_abs_diff", "LOGITS_MAX_ABS_DIFF", "--logits.max-abs-diff", _parse_float(0.0), "0.1",
           "logit check passes only with max absolute logit difference at most this"),
    Option("logits_timeout", "LOGITS_TIMEOUT", "--logits.timeout", _parse_float(0.1), "30",
           "seconds a miner's inference endpoint has to answer a logit challenge completely"),
    Option("logits_max_prompt_len", "LOGITS_MAX_PROMPT_LEN", "--logits.max-prompt-len", _parse_int(8), "128",
           "longest random prompt (token ids) a validator challenges with"),
    Option("logits_max_gen_len", "LOGITS_MAX_GEN_LEN", "--logits.max-gen-len", _parse_int(1), "32",
           "most tokens a validator asks a miner to generate in a challenge"),
    Option("inference_host", "INFERENCE_HOST", "--inference.host", _parse_str, "0.0.0.0",
           "address the miner inference server listens on"),
    Option("inference_max_prompt_len", "INFERENCE_MAX_PROMPT_LEN", "--inference.max-prompt-len",
           _parse_int(1), "2048", "longest prompt the miner inference server accepts (keep >= LOGITS_MAX_PROMPT_LEN)"),
    Option("inference_max_gen_len", "INFERENCE_MAX_GEN_LEN", "--inference.max-gen-len", _parse_int(1), "256",
           "largest gen_len the miner inference server accepts (keep >= LOGITS_MAX_GEN_LEN)"),
    Option("inference_queue_size", "INFERENCE_QUEUE_SIZE", "--inference.queue-size", _parse_int(0), "8",
           "requests the inference server holds waiting behind the one running; more get 503"),
    # Scoring.
    Option("tie_epsilon", "TIE_EPSILON", "--scoring.epsilon", _parse_float(0.0), "0.01",
           "relative margin within which weighted scores count as tied (earlier submission wins); 0 = exact ties only"),
    # Submission API and the embedded dev chain.
    Option("database_url", "DATABASE_URL", "--database-url", _parse_database_url,
           "sqlite:///data/quasar_api.sqlite3",
           "submission API database: sqlite:///PATH (kept across restarts) or postgresql://USER@HOST:PORT/DB "
           "(password in PGPASSWORD or ~/.pgpass, never here)"),
    Option("api_host", "API_HOST", "--api.host", _parse_str, "127.0.0.1",
           "address the submission API listens on (0.0.0.0 for all interfaces)"),
    Option("api_port", "API_PORT", "--api.port", _parse_int(1, 65535), "8000", "port of the submission API"),
    Option("api_workers", "API_WORKERS", "--api.workers", _parse_int(1, 64), "1",
           "processes the submission API serves with (about one per CPU core); nonces, bans and rate limits "
           "are in the database, so they hold across them"),
    Option("api_hotkey", "API_HOTKEY", "--api.hotkey", _parse_str, "",
           "ss58 address of the submission API's hotkey: signed requests name it as receiver (GET /health shows it)"),
    Option("trusted_proxies", "TRUSTED_PROXIES", "--api.trusted-proxies", _parse_ip_networks, "",
           "comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For the API believes; empty = none"),
    Option("blocks_until_reveal", "BLOCKS_UNTIL_REVEAL", "--blocks-until-reveal", _parse_int(0), "100",
           "chain blocks after a commit before it may be revealed"),
    Option("reveal_window_blocks", "REVEAL_WINDOW_BLOCKS", None, _parse_int(1), "1000",
           "chain blocks the reveal window stays open once it opens"),
    Option("round_blocks", "ROUND_BLOCKS", None, _parse_int(1), "360",
           "length of a competition round in chain blocks (round N = blocks N*ROUND_BLOCKS ...)"),
    Option("submissions_per_hour", "SUBMISSIONS_PER_HOUR", None, _parse_int(1), "10",
           "submissions (direct or commits) one hotkey may make per hour"),
    Option("evaluation_lease_s", "EVALUATION_LEASE_S", None, _parse_float(1.0), "3600",
           "seconds a validator holds a fetched submission before it is handed to that validator again"),
    Option("allow_local_forks", "ALLOW_LOCAL_FORKS", None, _parse_bool, "false",
           "accept local-path and file:// fork URLs on networks other than devchain: the API and validators then "
           "clone any path of their machine a miner names; only for a private subnet whose miners you trust"),
    Option("devchain_path", "DEVCHAIN_PATH", "--devchain.path", _parse_str, "data/devchain.sqlite3",
           "SQLite file of the embedded dev chain (network devchain)"),
    Option("devchain_block_time", "DEVCHAIN_BLOCK_TIME", "--devchain.block-time", _parse_float(0.01), "12",
           "seconds per block of a dev chain file created from now on (an existing file keeps its own)"),
    # Validator.
    Option("validator_data_dir", "VALIDATOR_DATA_DIR", "--validator.data-dir", _parse_str, "data/validator",
           "validator's folder: its state database (one per network, subnet and hotkey) and fork checkouts"),
    Option("epoch_blocks", "EPOCH_BLOCKS", "--epoch-blocks", _parse_int(1), "360",
           "chain blocks between two weight settings of the validator"),
    Option("eval_seq_lens", "EVAL_SEQ_LENS", "--eval.seq-lens", _parse_seq_lens, "512,1024,2048",
           "lengths a validator benchmarks besides each submission's target (comma-separated; empty = target only)"),
    Option("eval_timeout", "EVAL_TIMEOUT", "--eval.timeout", _parse_float(1.0), "3600",
           "seconds one evaluation (sandboxed benchmark and checks, after the clone) may take"),
    Option("eval_timed_seconds", "EVAL_TIMED_SECONDS", "--eval.timed-seconds", _parse_float(0.0), "2",
           "seconds of timed runs per length: as many runs as fit, at least 10 and at most 200"),
    Option("eval_load_timeout", "EVAL_LOAD_TIMEOUT", "--eval.load-timeout", _parse_float(1.0), "120",
           "seconds a fork has to import and build its layer in the sandbox (a real fla tree needs a few)"),
    Option("sandbox_memory_mb", "SANDBOX_MEMORY_MB", "--sandbox.memory-mb", _parse_int(256), "16384",
           "memory one evaluation's sandboxed processes may hold (its cgroup, or a watchdog where there is none)"),
    Option("sandbox_cgroup", "SANDBOX_CGROUP", "--sandbox.cgroup", _parse_str, "",
           "a cgroup v2 folder delegated to this process (memory and pids enabled for its children) to make "
           "each sandbox's cgroup in; empty = found (cgroup v1, or this process's own v2 cgroup)"),
)

OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}


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
    device: str
    pytorch_cuda_alloc_conf: str
    reference_dtype: str
    logits_min_cosine: float
    logits_max_abs_diff: float
    logits_timeout: float
    logits_max_prompt_len: int
    logits_max_gen_len: int
    inference_host: str
    inference_max_prompt_len: int
    inference_max_gen_len: int
    inference_queue_size: int
    tie_epsilon: float
    database_url: str
    api_host: str
    api_port: int
    api_workers: int
    api_hotkey: str
    trusted_proxies: tuple[str, ...]
    blocks_until_reveal: int
    reveal_window_blocks: int
    round_blocks: int
    submissions_per_hour: int
    evaluation_lease_s: float
    allow_local_forks: bool
    devchain_path: str
    devchain_block_time: float
    validator_data_dir: str
    epoch_blocks: int
    eval_seq_lens: tuple[int, ...]
    eval_timeout: float
    eval_timed_seconds: float
    eval_load_timeout: float
    sandbox_memory_mb: int
    sandbox_cgroup: str

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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every setting that has a flag to ``parser``; absent flags leave the value unset (None)."""
    group = parser.add_argument_group("settings (flag > environment > .env > default)")
    for option in OPTIONS:
        if option.flag is None:
            continue
        source = f"env {option.env}, " if option.env else ""
        if option.parse is _parse_bool:
            group.add_argument(option.flag, *option.aliases, dest=option.key, action="store_const", const="true",
                               default=None, help=f"{option.help} ({source}default {option.default})")
        else:
            group.add_argument(option.flag, *option.aliases, dest=option.key, default=None, metavar="VALUE",
                               help=f"{option.help} ({source}default {option.default!r})")


def resolve(
    flags: Mapping[str, str | None] | argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike | None = ".env",
) -> Settings:
    """Resolve every setting: default < ``.env`` < ``environ`` < ``flags``.

    ``flags`` maps setting keys to raw strings (None = not given), or is the namespace from a
    parser built with :func:`add_arguments`. ``environ`` defaults to ``os.environ``.
    """
    if isinstance(flags, argparse.Namespace):
        flags = vars(flags)
    flags = flags or {}
    environ = os.environ if environ is None else environ
    dotenv: dict[str, str | None] = {}
    if dotenv_path is not None and Path(dotenv_path).is_file():
        dotenv = dotenv_values(dotenv_path)

    values: dict[str, Any] = {}
    for option in OPTIONS:
        raw, source = option.default, "default"
        if option.env and dotenv.get(option.env) is not None:
            raw, source = dotenv[option.env], f"{dotenv_path}"
        if option.env and option.env in environ:
            raw, source = environ[option.env], "environment"
        if flags.get(option.key) is not None:
            raw, source = flags[option.key], "command line"
        try:
            values[option.key] = option.parse(raw)
        except ValueError as error:
            name = option.flag if source == "command line" else (option.env or option.key)
            raise SettingsError(f"{name} (from {source}): {error}") from None
    return Settings(**values)


def parse_args(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    dotenv_path: str | os.PathLike | None = ".env",
) -> tuple[argparse.Namespace, Settings]:
    """Parse ``argv`` with ``parser`` (which must have :func:`add_arguments` applied) and resolve.

    A bad value exits through ``parser.error`` with the message naming the setting.
    """
    namespace = parser.parse_args(argv)
    try:
        settings = resolve(namespace, environ=environ, dotenv_path=dotenv_path)
    except SettingsError as error:
        parser.error(str(error))
    return namespace, settings


def settings_keys() -> list[str]:
    """Names of the Settings fields, in order (used by tests to keep OPTIONS and Settings in step)."""
    return [f.name for f in fields(Settings)]


def env_example() -> str:
    """The text of ``.env.example``: every setting with its default and meaning."""
    lines = [
        "# QUASAR settings. Copy to .env and edit. Precedence: default < .env < environment < flag.",
        "# Regenerate with: quasar config > .env.example",
        "",
    ]
    for option in OPTIONS:
        if option.env is None:
            continue
        flag = f" (flag {' or '.join((option.flag, *option.aliases))})" if option.flag else ""
        lines.append(f"# {option.help}{flag}")
        lines.append(f"{option.env}={option.default}")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(env_example(), end="")
