"""The parts of a local network, each started in order: wallets, the dev chain, the submission
API, the reference model, the inference servers, the validator, the forks behind a GitHub
stand-in and the miners; and stopped. What each part does is in docs/localnet.md;
:class:`~quasar.localnet.network.LocalNetwork` follows the round they play."""

from __future__ import annotations

import dataclasses
import functools
import secrets
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import httpx

import quasar
from quasar import config
from quasar.config import DEV_NETWORK
from quasar.localnet.forks import HONEST, HOSTILE, Fork, write_forks
from quasar.localnet.github_standin import GitHubStandIn
from quasar.localnet.host import child_environment, distinct_free_ports, make_wallet
from quasar.localnet.options import (
    API,
    HOST,
    HOSTILE_TARGET,
    MINER_INTERVAL_S,
    MINERS,
    NETUID,
    OWNER,
    START_TIMEOUT_S,
    UPSTREAM,
    VALIDATOR,
    VALIDATOR_STAKE,
    WALLET_HOTKEY,
    LocalnetError,
    LocalnetOptions,
)
from quasar.localnet.processes import Child, Children, wait_until

if TYPE_CHECKING:
    import bittensor

    from quasar.chain.devchain import DevChain


class Progress(Protocol):
    """Where the network reports what it is doing (the command line shows it on stderr)."""

    def step(self, text: str) -> None:
        """A new step begins (the previous one is done)."""

    def detail(self, text: str) -> None:
        """How the current step is going; where no live display is possible (a log, a pipe), a new
        line only when ``text`` changes."""


class NetworkParts:
    """The parts of one local network in ``options.data_dir``; :meth:`start_parts`, :meth:`stop`."""

    def __init__(self, options: LocalnetOptions, progress: Progress):
        self.options = options
        self.progress = progress
        self.data_dir = options.data_dir.resolve()
        self.logs_dir = self.data_dir / "logs"
        self.wallet_dir = self.data_dir / "wallets"
        self.chain_path = self.data_dir / "devchain.sqlite3"
        self.api_database_url = f"sqlite:///{self.data_dir / 'api.sqlite3'}"
        self.validator_dir = self.data_dir / "validator"
        # The miners' ``WORKSPACE_ROOT``: one workspace per hotkey (clone, state, reports).
        self.miners_dir = self.data_dir / "miners"
        self.repo_root = Path(quasar.__file__).resolve().parent.parent
        self.children = Children(self.logs_dir, self.data_dir, child_environment(self.repo_root))
        self.wallets: dict[str, bittensor.Wallet] = {}
        self.uids: dict[str, int] = {}
        self._chain: DevChain | None = None
        self.api_url = ""
        self.reference_model = ""
        self.reference_note = ""
        self.forks: dict[str, Fork] = {}
        self.github: GitHubStandIn | None = None
        self.github_tokens: dict[str, str] = {}
        self.validator: Child | None = None
        self.miners: dict[str, Child] = {}

    # --- paths and names ---

    @property
    def dashboard_url(self) -> str:
        """The API's web dashboard (the round's leaderboard, miners' and submissions' pages)."""
        return f"{self.api_url}/"

    def hotkey(self, name: str) -> str:
        return self.wallets[name].hotkey.ss58_address

    def uid_names(self) -> dict[int, str]:
        return {uid: name for name, uid in self.uids.items()}

    def _chain_flags(self) -> list[str]:
        return ["--subtensor.network", DEV_NETWORK, "--devchain.path", str(self.chain_path), "--netuid", str(NETUID)]

    def _wallet_flags(self, name: str) -> list[str]:
        return ["--wallet.path", str(self.wallet_dir), "--wallet.name", name, "--wallet.hotkey", WALLET_HOTKEY]

    # --- start ---

    def start_parts(self) -> list[Child]:
        """Build the network and start every process, the miners last; returns the children started
        (:meth:`~quasar.localnet.network.LocalNetwork.start` then waits for the miners' submissions)."""
        from quasar.chain.devchain import DevChain

        options = self.options
        self.progress.step("creating wallets: owner, api, validator, miner-honest, miner-hostile")
        for name in (OWNER, API, VALIDATOR, *MINERS.values()):
            self.wallets[name] = make_wallet(self.wallet_dir, name)

        self.progress.step(f"starting the dev chain ({options.block_time_s:g} s blocks) and registering the neurons")
        self._chain = DevChain(self.chain_path, netuid=NETUID, block_time_s=options.block_time_s)
        self.chain.set_hyperparameters(**dataclasses.asdict(options.hyperparameters))
        # Every server here listens on 127.0.0.1 only, so their endpoints on chain are loopback ones,
        # which subtensor refuses: the one allowance of this dev chain file.
        self.chain.allow_loopback_axons(True)
        self.uids[OWNER] = self.chain.register_wallet(self.wallets[OWNER])
        self.chain.set_owner(self.hotkey(OWNER))
        self.uids[VALIDATOR] = self.chain.register_wallet(
            self.wallets[VALIDATOR], stake=VALIDATOR_STAKE, validator_permit=True
        )
        for name in MINERS.values():
            self.uids[name] = self.chain.register_wallet(self.wallets[name])

        api_port, *miner_ports = distinct_free_ports(1 + len(MINERS))
        inference_ports = dict(zip(MINERS.values(), miner_ports))
        self.api_url = f"http://{HOST}:{api_port}"
        self.progress.step(f"starting the submission API on {self.api_url} (SQLite); dashboard {self.dashboard_url}")
        api = self.children.start(
            "submission API",
            [
                sys.executable,
                "-m",
                "quasar.api",
                "serve",
                "--host",
                HOST,
                "--port",
                str(api_port),
                "--database-url",
                self.api_database_url,
                "--api.hotkey",
                self.hotkey(API),
                *self._chain_flags(),
            ],
            "api.log",
        )

        self.progress.step("preparing the reference model")
        self.reference_model, self.reference_note = self._reference_model()

        servers: list[Child] = []
        for kind, name in MINERS.items():
            port = inference_ports[name]
            self.progress.step(f"starting {name}'s inference server on {HOST}:{port}")
            servers.append(
                self.children.start(
                    f"{name}'s inference server",
                    [
                        sys.executable,
                        "-m",
                        "quasar.inference",
                        "serve",
                        *self._wallet_flags(name),
                        *self._chain_flags(),
                        "--reference-model",
                        self.reference_model,
                        "--device",
                        options.device,
                        "--inference.host",
                        HOST,
                        "--inference.port",
                        str(port),
                    ],
                    f"inference-{kind}.log",
                )
            )

        self.progress.step("waiting for the API, then publishing its URL on chain as the subnet owner")
        wait_until(
            lambda: self._answers(f"{self.api_url}/health"), START_TIMEOUT_S, "the submission API", [api, *servers]
        )
        self._publish_api_url()

        # Started now, it loads its model while the rest starts; it polls the API until work comes.
        self.progress.step("starting the validator (it finds the API on chain)")
        self.validator = self.children.start(
            "validator",
            [
                sys.executable,
                "-m",
                "neurons.validator",
                *self._wallet_flags(VALIDATOR),
                *self._chain_flags(),
                "--device",
                options.device,
                "--reference-model",
                self.reference_model,
                "--validator.data-dir",
                str(self.validator_dir),
                "--eval.seq-lens",
                ",".join(str(length) for length in options.seq_lens),
                "--eval.timed-seconds",
                str(options.timed_seconds),
                "--epoch-blocks",
                str(options.epoch_blocks),
            ],
            "validator.log",
        )

        self.progress.step(
            f"writing the forks and serving them from a GitHub stand-in: {UPSTREAM} is the starter "
            f"fork; {MINERS[HOSTILE]}'s fork skips the recurrence beyond {HOSTILE_TARGET} tokens"
        )
        self._start_github()

        # The miners start as an operator starts one: once the API and their inference servers answer.
        started = [api, *servers, self.validator]
        self.progress.step("waiting for the inference servers to answer")
        for name, server in zip(MINERS.values(), servers):
            port = inference_ports[name]
            health = f"http://{HOST}:{port}/health"
            wait_until(functools.partial(self._answers, health), START_TIMEOUT_S, server.name, started)
        for kind, name in MINERS.items():
            self.progress.step(f"starting {name} (python -m neurons.miner) on its {kind} fork")
            self.miners[name] = self.children.start(
                name,
                self._miner_command(kind, name, inference_ports[name]),
                f"{name}.log",
                self._miner_environment(name),
            )
        return [*started, *self.miners.values()]

    def _publish_api_url(self) -> None:
        """The API's URL and hotkey into the subnet identity, by the owner's coldkey, with the command
        a subnet owner runs (``python -m quasar.api publish-url``); its output goes to its log."""
        command = [
            sys.executable,
            "-m",
            "quasar.api",
            "publish-url",
            self.api_url,
            *self._wallet_flags(OWNER),
            *self._chain_flags(),
        ]
        log_path = self.logs_dir / "publish-url.log"
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            result = subprocess.run(
                command,
                cwd=self.data_dir,
                env=self.children.environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=START_TIMEOUT_S,
                check=False,
            )
        if result.returncode != 0:
            raise LocalnetError(
                f"publishing the API's URL on chain failed (status {result.returncode}); its log is "
                f"{log_path}:\n{log_path.read_text(errors='replace')[-2000:]}"
            )

    @staticmethod
    def _answers(url: str) -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _reference_model(self) -> tuple[str, str]:
        """The model every part loads, and a note saying which it is."""
        from quasar.localnet.model import (
            STAND_IN_NAME,
            hub_model_cached,
            write_stand_in_model,
        )

        wanted = self.options.reference_model
        if wanted:
            folder = Path(wanted).expanduser()
            if folder.exists():  # absolute: the children run in the data folder
                return str(folder.resolve()), f"reference model: {folder.resolve()}"
            if hub_model_cached(wanted):
                return wanted, f"reference model: {wanted} (from the local Hugging Face cache)"
            raise LocalnetError(
                f"reference model {wanted!r} is neither a folder nor in the local Hugging Face cache: "
                f"download it first (hf download {wanted}) or leave --reference-model out"
            )
        default = config.REFERENCE_MODEL_ID
        if not self.options.stand_in_model and hub_model_cached(default):
            return default, f"reference model: {default} (from the local Hugging Face cache)"
        path = write_stand_in_model(self.data_dir / "model")
        why = "as asked" if self.options.stand_in_model else f"{default} is not in the local Hugging Face cache"
        return str(path), (
            f"reference model: the {STAND_IN_NAME} in {path} ({why}); logit checks compare miners "
            f"against it, not against {default}"
        )

    # --- miners ---

    def _start_github(self) -> None:
        """The forks, and the GitHub stand-in serving them: the upstream holds the starter fork (the
        honest miner forks it), the hostile miner's account its hostile fork. One token per miner."""
        self.forks = write_forks(self.data_dir / "forks")
        self.github_tokens = {name: f"ghp_{secrets.token_hex(18)}" for name in MINERS.values()}
        self.github = GitHubStandIn(
            self.data_dir / "github", {token: name for name, token in self.github_tokens.items()}, fork_delay_polls=0
        )
        self.github.add_repository(UPSTREAM, self.forks[HONEST].path)
        self.github.add_repository(
            f"{MINERS[HOSTILE]}/{UPSTREAM.split('/')[1]}", self.forks[HOSTILE].path, parent=UPSTREAM
        )
        self.github.start()

    def _miner_command(self, kind: str, name: str, inference_port: int) -> list[str]:
        """``python -m neurons.miner`` for miner ``name``: one cycle, then it waits (MINER_INTERVAL_S)."""
        options = self.options
        target, seq_lens = (options.target, options.seq_lens) if kind == HONEST else (HOSTILE_TARGET, ())
        return [
            sys.executable,
            "-m",
            "neurons.miner",
            *self._wallet_flags(name),
            *self._chain_flags(),
            "--device",
            options.device,
            "--target-sequence-length",
            str(target),
            "--eval.seq-lens",
            ",".join(str(n) for n in seq_lens),
            "--eval.timed-seconds",
            str(options.timed_seconds),
            "--claim-share",
            str(options.claim_share),
            "--agent-iterations",
            "0",
            "--optimization-interval",
            str(MINER_INTERVAL_S),
            "--submission.mode",
            "direct",
            "--workspace.root",
            str(self.miners_dir),
            "--inference.port",
            str(inference_port),
            "--axon.external_ip",
            HOST,
        ]

    def _miner_environment(self, name: str) -> dict[str, str]:
        """The miner's settings that have no flag: its GitHub account and token, and the stand-in."""
        assert self.github is not None, "_start_github() first"
        return {
            "GITHUB_TOKEN": self.github_tokens[name],
            "GITHUB_USERNAME": name,
            "GITHUB_API_URL": self.github.api_url,
            "GIT_REMOTE_BASE": self.github.file_base,
            "UPSTREAM_REPO": UPSTREAM,
        }

    # --- running and stopping ---

    @property
    def chain(self) -> DevChain:
        """The dev chain, once :meth:`start_parts` has made it."""
        assert self._chain is not None, "the local network's chain is used before it was started"
        return self._chain

    def check_running(self) -> None:
        """Raise ChildFailed if any child has exited."""
        for child in self.children.running:
            child.check_running()

    def stop(self) -> None:
        """Stop every child, the validator first (it puts a running evaluation back cleanly)."""
        if self.validator is not None and self.validator in self.children.running:
            self.progress.step("stopping the validator")
            self.children.stop(self.validator)
        if self.children.running:
            self.progress.step("stopping the miners, the inference servers and the API")
        self.children.stop_all()
        if self.github is not None:
            self.github.stop()
            self.github = None
