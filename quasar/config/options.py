"""The one table of settings: each one's environment variable, flag, parser, default and meaning,
the group it is shown in and the processes that read it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quasar.config.values import (
    DEFAULT_SEQ_LENS,
    parse_bool,
    parse_chain_endpoint,
    parse_choice,
    parse_database_url,
    parse_device,
    parse_dtype,
    parse_float,
    parse_git_remote_base,
    parse_http_url,
    parse_int,
    parse_ip_networks,
    parse_name,
    parse_network,
    parse_optional_http_url,
    parse_optional_int,
    parse_optional_ip,
    parse_optional_name,
    parse_repo_slug,
    parse_seq_lens,
    parse_share,
    parse_str,
)


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


# The single table of settings. ``default`` is written as it would appear in .env.
OPTIONS: tuple[Option, ...] = (
    # Chain and identity (Bittensor spelling on the command line).
    Option("wallet_name", "WALLET_NAME", "--wallet.name", parse_optional_name, "",
           "wallet (coldkey) name; empty means WALLET_MINER_NAME or WALLET_VALIDATOR_NAME by role",
           group='wallet', brief='wallet (coldkey) name; empty = by role'),
    Option("wallet_miner_name", "WALLET_MINER_NAME", None, parse_name, "quasar_miner",
           "wallet name the miner uses when --wallet.name is not given",
           group='wallet', brief='wallet name of the miner'),
    Option("wallet_validator_name", "WALLET_VALIDATOR_NAME", None, parse_name, "quasar_validator",
           "wallet name the validator uses when --wallet.name is not given",
           group='wallet', brief='wallet name of the validator'),
    Option("wallet_hotkey", "WALLET_HOTKEY", "--wallet.hotkey", parse_name, "default",
           "hotkey name inside the wallet",
           group='wallet', brief='hotkey name inside the wallet'),
    Option("wallet_path", "WALLET_PATH", "--wallet.path", parse_str, "~/.bittensor/wallets",
           "folder holding the wallets",
           group='wallet', brief='folder holding the wallets'),
    Option("network", "SUBTENSOR_NETWORK", "--subtensor.network", parse_network, "finney",
           "chain: finney, test, local (a subtensor node here), archive, or devchain (embedded one-machine chain)",
           group='chain', brief='finney, test, local, archive or devchain'),
    Option("chain_endpoint", "SUBTENSOR_CHAIN_ENDPOINT", "--subtensor.chain_endpoint",
           parse_chain_endpoint, "", "ws:// or wss:// URL of a subtensor node; overrides the network's default",
           group='chain', brief='ws(s):// URL of a subtensor node'),
    Option("netuid", "NETUID", "--netuid", parse_int(0, 65535), "24",
           "subnet id of QUASAR on the chosen network",
           group='chain', brief='subnet id of QUASAR'),
    Option("debug", "LOGGING_DEBUG", "--logging.debug", parse_bool, "false",
           "log at debug level",
           group='process', brief='log at debug level'),
    # Services.
    Option("validator_api_url", "VALIDATOR_API_URL", "--api.url", parse_optional_http_url, "",
           "base URL of the submission API; empty = the URL the subnet owner published on chain",
           group='submission API', brief="the API's URL; empty = published on chain"),
    Option("miner_inference_port", "MINER_INFERENCE_PORT", "--inference.port", parse_int(1, 65535),
           "8001", "port the miner inference server (the miner's axon) listens on: open it to the internet (TCP)",
           aliases=("--axon.port",),
           group='inference server', brief='port the inference server listens on'),
    # Miner.
    Option("github_token", "GITHUB_TOKEN", None, parse_str, "",
           "GitHub token the miner uses to fork and push (never logged, never stored in .git/config)",
           secret=True,
           group='miner', brief='GitHub token to fork and push (secret)'),
    Option("github_username", "GITHUB_USERNAME", None, parse_optional_name, "",
           "GitHub account that owns the miner's fork",
           group='miner', brief='GitHub account that owns the fork'),
    Option("target_sequence_length", "TARGET_SEQUENCE_LENGTH", "--target-sequence-length",
           parse_optional_int(1), "",
           "sequence length the miner is ranked at; empty lets the miner pick the best its GPU holds",
           group='miner', brief='length to be ranked at; empty = best fit'),
    Option("agent_iterations", "AGENT_ITERATIONS", "--agent-iterations", parse_int(0), "100",
           "optimization candidates the miner tries per cycle",
           group='miner', brief='candidates tried per cycle'),
    Option("optimization_interval", "OPTIMIZATION_INTERVAL", "--optimization-interval",
           parse_float(0.0), "300", "seconds the miner waits between optimization cycles",
           group='miner', brief='seconds between optimization cycles'),
    Option("github_api_url", "GITHUB_API_URL", None, parse_http_url, "https://api.github.com",
           "GitHub REST API the miner forks through",
           group='miner', brief='GitHub REST API'),
    Option("upstream_repo", "UPSTREAM_REPO", None, parse_repo_slug, "troy12x/flash-linear-attention",
           "OWNER/REPO the miner forks when GITHUB_USERNAME has no fork of it yet",
           group='miner', brief='OWNER/REPO forked when there is no fork'),
    Option("git_remote_base", "GIT_REMOTE_BASE", None, parse_git_remote_base, "https://github.com",
           "base of git remotes: the fork is cloned from and pushed to BASE/OWNER/REPO (file:///DIR for local bare repos)",
           group='miner', brief='base URL of git remotes'),
    Option("workspace_root", "WORKSPACE_ROOT", "--workspace.root", parse_str, "~/.quasar/miner",
           "folder of the miner's workspaces, one per hotkey (its fork's clone, state and lock)",
           group='miner', brief="folder of the miner's workspaces"),
    Option("submission_mode", "SUBMISSION_MODE", "--submission.mode", parse_choice("direct", "commit-reveal"),
           "direct", "direct (submit at once) or commit-reveal (commit a hash, push and reveal after BLOCKS_UNTIL_REVEAL)",
           group='miner', brief='direct or commit-reveal'),
    Option("min_improvement", "MIN_IMPROVEMENT", "--min-improvement", parse_float(0.0), "0.02",
           "relative speed-up over the best a candidate needs to be kept and resubmitted (keep above benchmark noise)",
           group='miner', brief='speed-up a candidate needs to be kept'),
    Option("claim_share", "CLAIM_SHARE", "--claim-share", parse_share, "1.0",
           "share of the evaluation's recommended claim the miner submits; below 1 leaves room for a slower validator GPU",
           group='miner', brief='share of the recommended claim submitted'),
    Option("agent_api_url", "AGENT_API_URL", "--agent.url", parse_optional_http_url, "",
           "OpenAI-compatible API (e.g. http://127.0.0.1:8080/v1) the agent strategy asks for kernel edits; empty = no agent",
           group='miner', brief='OpenAI-compatible API of the agent'),
    Option("agent_model", "AGENT_MODEL", "--agent.model", parse_str, "", "model name the agent strategy asks for",
           group='miner', brief='model the agent strategy asks for'),
    Option("agent_api_key", "AGENT_API_KEY", None, parse_str, "",
           "bearer key for AGENT_API_URL, if it needs one (never logged)", secret=True,
           group='miner', brief='bearer key for AGENT_API_URL (secret)'),
    Option("agent_timeout", "AGENT_TIMEOUT", None, parse_float(1.0), "300",
           "seconds the agent strategy waits for one reply",
           group='miner', brief='seconds to wait for one agent reply'),
    Option("axon_external_ip", "AXON_EXTERNAL_IP", "--axon.external_ip", parse_optional_ip, "",
           "public IP address the miner publishes on chain for its inference server; empty = this machine's "
           "outward address (on finney and test a private or loopback one is refused: set this)",
           group='miner', brief='public IP published on chain'),
    Option("axon_external_port", "AXON_EXTERNAL_PORT", "--axon.external_port", parse_optional_int(1), "",
           "port the miner publishes on chain; empty = MINER_INFERENCE_PORT (set it when a router forwards "
           "another public port to MINER_INFERENCE_PORT)",
           group='miner', brief='public port published on chain'),
    Option("git_author_name", "GIT_AUTHOR_NAME", None, parse_str, "",
           "author of the miner's commits; empty = GITHUB_USERNAME",
           group='miner', brief="author of the miner's commits"),
    Option("git_author_email", "GIT_AUTHOR_EMAIL", None, parse_str, "",
           "author email of the miner's commits; empty = GITHUB_USERNAME@users.noreply.github.com",
           group='miner', brief="author email of the miner's commits"),
    Option("miner_allow_unsandboxed", "MINER_ALLOW_UNSANDBOXED", None, parse_bool, "false",
           "let the miner benchmark its candidates without the namespace sandbox where namespaces are unavailable",
           group='miner', brief='benchmark without the sandbox if needed'),
    # Evaluation.
    Option("reference_model", "REFERENCE_MODEL", "--reference-model", parse_str,
           "Qwen/Qwen2.5-0.5B-Instruct", "model for logit verification: a Hugging Face id or a local folder",
           group='reference model', brief='Hugging Face id or local folder'),
    Option("hf_hub_offline", "HF_HUB_OFFLINE", None, parse_bool, "0",
           "1: the reference model comes from the local Hugging Face cache only, never the network (fill the "
           "cache first: hf download Qwen/Qwen2.5-0.5B-Instruct); Hugging Face reads it from the environment",
           group='reference model', brief='1: from the local cache only'),
    Option("device", "DEVICE", "--device", parse_device, "cuda",
           "torch device for benchmarks and the reference model: cuda, cuda:N or cpu",
           group='process', brief='cuda, cuda:N or cpu'),
    Option("pytorch_cuda_alloc_conf", "PYTORCH_CUDA_ALLOC_CONF", None, parse_str,
           "expandable_segments:True", "passed to PyTorch's CUDA allocator in benchmark processes",
           group='process', brief='PyTorch CUDA allocator configuration'),
    # Logit verification (validator) and the miner inference server.
    Option("reference_dtype", "REFERENCE_DTYPE", "--reference-dtype", parse_dtype, "float32",
           "dtype the reference model runs in: float32 (what validators use; see README), bfloat16 or float16",
           group='reference model', brief='float32, bfloat16 or float16'),
    Option("logits_min_cosine", "LOGITS_MIN_COSINE", "--logits.min-cosine", parse_float(0.0), "0.99",
           "logit check passes only with cosine similarity at least this",
           group='logit check', brief='least cosine similarity that passes'),
    Option("logits_max_abs_diff", "LOGITS_MAX_ABS_DIFF", "--logits.max-abs-diff", parse_float(0.0), "0.1",
           "logit check passes only with max absolute logit difference at most this",
           group='logit check', brief='largest absolute difference that passes'),
    Option("logits_timeout", "LOGITS_TIMEOUT", "--logits.timeout", parse_float(0.1), "30",
           "seconds a miner's inference endpoint has to answer a logit challenge completely",
           group='logit check', brief='seconds a miner has to answer'),
    Option("logits_max_prompt_len", "LOGITS_MAX_PROMPT_LEN", "--logits.max-prompt-len", parse_int(8), "128",
           "longest random prompt (token ids) a validator challenges with",
           group='logit check', brief='longest challenge prompt (tokens)'),
    Option("logits_max_gen_len", "LOGITS_MAX_GEN_LEN", "--logits.max-gen-len", parse_int(1), "32",
           "most tokens a validator asks a miner to generate in a challenge",
           group='logit check', brief='most tokens asked for in a challenge'),
    Option("inference_host", "INFERENCE_HOST", "--inference.host", parse_str, "0.0.0.0",
           "address the miner inference server listens on",
           group='inference server', brief='address it listens on'),
    Option("inference_max_prompt_len", "INFERENCE_MAX_PROMPT_LEN", "--inference.max-prompt-len",
           parse_int(1), "2048", "longest prompt the miner inference server accepts (keep >= LOGITS_MAX_PROMPT_LEN)",
           group='inference server', brief='longest prompt accepted (tokens)'),
    Option("inference_max_gen_len", "INFERENCE_MAX_GEN_LEN", "--inference.max-gen-len", parse_int(1), "256",
           "largest gen_len the miner inference server accepts (keep >= LOGITS_MAX_GEN_LEN)",
           group='inference server', brief='largest gen_len accepted'),
    Option("inference_queue_size", "INFERENCE_QUEUE_SIZE", "--inference.queue-size", parse_int(0), "8",
           "requests the inference server holds waiting behind the one running; more get 503",
           group='inference server', brief='requests held waiting; more get 503'),
    # Scoring.
    Option("tie_epsilon", "TIE_EPSILON", "--scoring.epsilon", parse_float(0.0), "0.01",
           "relative margin within which weighted scores count as tied (earlier submission wins); 0 = exact ties only",
           group='scoring', brief='relative margin of a tie'),
    # Submission API and the embedded dev chain.
    Option("database_url", "DATABASE_URL", "--database-url", parse_database_url,
           "sqlite:///data/quasar_api.sqlite3",
           "submission API database: sqlite:///PATH (kept across restarts) or postgresql://USER@HOST:PORT/DB "
           "(password in PGPASSWORD or ~/.pgpass, never here)",
           group='submission API', brief='sqlite:///PATH or postgresql://...'),
    Option("api_host", "API_HOST", "--api.host", parse_str, "127.0.0.1",
           "address the submission API listens on (0.0.0.0 for all interfaces)",
           group='submission API', brief='address the API listens on'),
    Option("api_port", "API_PORT", "--api.port", parse_int(1, 65535), "8000", "port of the submission API",
           group='submission API', brief='port the API listens on'),
    Option("api_workers", "API_WORKERS", "--api.workers", parse_int(1, 64), "1",
           "processes the submission API serves with (about one per CPU core); nonces, bans and rate limits "
           "are in the database, so they hold across them",
           group='submission API', brief='server processes'),
    Option("api_hotkey", "API_HOTKEY", "--api.hotkey", parse_str, "",
           "ss58 address of the submission API's hotkey: signed requests name it as receiver (GET /health shows it)",
           group='submission API', brief="ss58 address of the API's hotkey"),
    Option("trusted_proxies", "TRUSTED_PROXIES", "--api.trusted-proxies", parse_ip_networks, "",
           "comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For the API believes; empty = none",
           group='submission API', brief="reverse proxies' IPs/CIDRs"),
    Option("blocks_until_reveal", "BLOCKS_UNTIL_REVEAL", "--blocks-until-reveal", parse_int(0), "100",
           "chain blocks after a commit before it may be revealed",
           group='submission API', brief='blocks from a commit to its reveal'),
    Option("reveal_window_blocks", "REVEAL_WINDOW_BLOCKS", None, parse_int(1), "1000",
           "chain blocks the reveal window stays open once it opens",
           group='submission API', brief='blocks the reveal window stays open'),
    Option("round_blocks", "ROUND_BLOCKS", None, parse_int(1), "360",
           "length of a competition round in chain blocks (round N = blocks N*ROUND_BLOCKS ...)",
           group='submission API', brief='blocks per competition round'),
    Option("submissions_per_hour", "SUBMISSIONS_PER_HOUR", None, parse_int(1), "10",
           "submissions (direct or commits) one hotkey may make per hour",
           group='submission API', brief='submissions per hotkey per hour'),
    Option("evaluation_lease_s", "EVALUATION_LEASE_S", None, parse_float(1.0), "3600",
           "seconds a validator holds a fetched submission before it is handed to that validator again",
           group='submission API', brief='seconds a validator holds a submission'),
    Option("allow_local_forks", "ALLOW_LOCAL_FORKS", None, parse_bool, "false",
           "accept local-path and file:// fork URLs on networks other than devchain: the API and validators then "
           "clone any path of their machine a miner names; only for a private subnet whose miners you trust",
           group='chain', brief='accept local fork paths off devchain'),
    Option("devchain_path", "DEVCHAIN_PATH", "--devchain.path", parse_str, "data/devchain.sqlite3",
           "SQLite file of the embedded dev chain (network devchain)",
           group='chain', brief='SQLite file of the embedded dev chain'),
    Option("devchain_block_time", "DEVCHAIN_BLOCK_TIME", "--devchain.block-time", parse_float(0.01), "12",
           "seconds per block of a dev chain file created from now on (an existing file keeps its own)",
           group='chain', brief='seconds per block of a new dev chain'),
    # Validator.
    Option("validator_data_dir", "VALIDATOR_DATA_DIR", "--validator.data-dir", parse_str, "data/validator",
           "validator's folder: its state database (one per network, subnet and hotkey) and fork checkouts",
           group='validator', brief="the validator's state and checkouts"),
    Option("epoch_blocks", "EPOCH_BLOCKS", "--epoch-blocks", parse_int(1), "360",
           "chain blocks between two weight settings of the validator",
           group='validator', brief='blocks between weight settings'),
    Option("eval_seq_lens", "EVAL_SEQ_LENS", "--eval.seq-lens", parse_seq_lens,
           ",".join(map(str, DEFAULT_SEQ_LENS)),
           "lengths a validator benchmarks besides each submission's target (comma-separated; empty = target only)",
           group='evaluation', brief='lengths benchmarked besides the target'),
    Option("eval_timeout", "EVAL_TIMEOUT", "--eval.timeout", parse_float(1.0), "3600",
           "seconds one evaluation (sandboxed benchmark and checks, after the clone) may take",
           group='evaluation', brief='seconds one evaluation may take'),
    Option("eval_timed_seconds", "EVAL_TIMED_SECONDS", "--eval.timed-seconds", parse_float(0.0), "2",
           "seconds of timed runs per length: as many runs as fit, at least 10 and at most 200",
           group='evaluation', brief='seconds of timed runs per length'),
    Option("eval_load_timeout", "EVAL_LOAD_TIMEOUT", "--eval.load-timeout", parse_float(1.0), "120",
           "seconds a fork has to import and build its layer in the sandbox (a real fla tree needs a few)",
           group='evaluation', brief='seconds a fork has to import and build'),
    Option("sandbox_memory_mb", "SANDBOX_MEMORY_MB", "--sandbox.memory-mb", parse_int(256), "16384",
           "memory one evaluation's sandboxed processes may hold (its cgroup, or a watchdog where there is none)",
           group='evaluation', brief='memory (MiB) a sandbox may hold'),
    Option("sandbox_cgroup", "SANDBOX_CGROUP", "--sandbox.cgroup", parse_str, "",
           "a cgroup v2 folder delegated to this process (memory and pids enabled for its children) to make "
           "each sandbox's cgroup in; empty = found (cgroup v1, or this process's own v2 cgroup)",
           group='evaluation', brief='delegated cgroup v2 folder; empty = found'),
)

OPTIONS_BY_KEY = {option.key: option for option in OPTIONS}

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
                  "tie_epsilon", "validator_data_dir", "epoch_blocks"),
    "inference": (*_WALLET, "wallet_miner_name", *_CHAIN, "debug",
                  *(option.key for option in OPTIONS if option.group == "inference server"),
                  "device", "pytorch_cuda_alloc_conf", "reference_model", "hf_hub_offline", "reference_dtype"),
    "api": (*_WALLET, *_CHAIN, "allow_local_forks", "debug", *_API_SERVER, "tie_epsilon"),
    "evaluate": ("debug", *_EVALUATION),
}
