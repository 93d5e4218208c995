"""Build the miner from settings and run it (what ``quasar miner`` does).

Start-up, in order, each failure a clear message and exit status 1: the GitHub settings, the
evaluation sandbox (or MINER_ALLOW_UNSANDBOXED), the wallet's hotkey, the device, the address to
publish, the workspace lock, the chain (registration is checked, the inference endpoint published,
the API found), the fork on GitHub (created when missing), the workspace clone and the saved
state. Then the loop runs until SIGINT or SIGTERM (pm2 stop), which stop it cleanly: a candidate
being evaluated is rolled back and the lock released. Before each cycle the endpoint on chain is
compared with the one to publish, and published again where they differ.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading

import httpx

from quasar.chain.wallets import WalletError, open_wallet
from quasar.config import Settings
from quasar.config.values import PUBLIC_NETWORKS
from quasar.errors import QuasarError
from quasar.evaluate.options import CPU_MAX_SEQ_LEN
from quasar.signals import stop_on_signals

logger = logging.getLogger(__name__)

# Secret settings the miner reads once; removed from its environment so no child inherits them.
SECRET_VARIABLES = ("GITHUB_TOKEN", "AGENT_API_KEY")


class MinerSetupError(QuasarError, RuntimeError):
    """The miner cannot start; the message says what to fix."""


def outward_address() -> str:
    """This machine's address on the route to the internet (no packet is sent), or 127.0.0.1."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            return probe.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def published_endpoint(settings: Settings) -> tuple[str, int]:
    """The address and port the miner publishes for its inference server: AXON_EXTERNAL_IP (else this
    machine's outward address) and AXON_EXTERNAL_PORT (else MINER_INFERENCE_PORT, where the server
    listens). On finney, test and archive an address that is not public (private, loopback, link-local,
    shared, unspecified) is refused with :class:`MinerSetupError`: validators there cannot reach it."""
    host = settings.axon_external_ip or outward_address()
    port = settings.axon_external_port or settings.miner_inference_port
    address = ipaddress.ip_address(host)
    if settings.network in PUBLIC_NETWORKS and not address.is_global:
        source = "AXON_EXTERNAL_IP" if settings.axon_external_ip else "this machine's outward address"
        kind = "a loopback address" if address.is_loopback else "not a public address"
        raise MinerSetupError(
            f"{source} {host} is {kind}: validators on {settings.network} could not reach the inference server "
            f"there. Set AXON_EXTERNAL_IP to this machine's public IP address; behind NAT, forward a public TCP port "
            f"to this machine's MINER_INFERENCE_PORT ({settings.miner_inference_port}) and set AXON_EXTERNAL_PORT to it"
        )
    return str(address), port


def remote_url(git_remote_base: str, full_name: str) -> str:
    """The git URL of repository OWNER/NAME under ``git_remote_base`` (also the fork URL submitted)."""
    return f"{git_remote_base.rstrip('/')}/{full_name}.git"


def _device_name(device: str) -> str | None:
    """The CUDA device's name (the tuning strategy's per-GPU key), or None on CPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    from quasar.evaluate.gpus import GpuOrderError, missing_gpu_here, use_pci_bus_order

    try:
        use_pci_bus_order(os.environ)  # its benchmarks' sandboxes name the GPU in PCI bus order
    except GpuOrderError as error:
        raise MinerSetupError(str(error)) from None
    no_gpu = missing_gpu_here(device)
    if no_gpu is not None:
        raise MinerSetupError(
            f"DEVICE={device} but {no_gpu} (check the driver and CUDA_VISIBLE_DEVICES); "
            "set DEVICE=cpu only to try the miner out"
        )
    return torch.cuda.get_device_name(torch.device(device))


def _check_settings(settings: Settings) -> None:
    if not settings.github_token:
        raise MinerSetupError("GITHUB_TOKEN is not set: put a GitHub token that may fork and push in .env")
    if not settings.github_username:
        raise MinerSetupError("GITHUB_USERNAME is not set: put the GitHub account that owns the fork in .env")
    if settings.device == "cpu" and not settings.target_sequence_length:
        raise MinerSetupError(
            f"DEVICE=cpu: set TARGET_SEQUENCE_LENGTH (at most {CPU_MAX_SEQ_LEN}); CPU runs only try the miner out"
        )
    if settings.agent_api_url and not settings.agent_model:
        raise MinerSetupError("AGENT_API_URL is set but AGENT_MODEL is empty: name the model the endpoint serves")
    _check_sandbox(settings)


def _check_sandbox(settings: Settings) -> None:
    """Without the evaluation sandbox every candidate's benchmark would fail, unless the miner is
    allowed to run its candidates without it (MINER_ALLOW_UNSANDBOXED)."""
    from quasar.evaluate.sandbox import sandbox_unavailable

    why = sandbox_unavailable()
    if not why:
        return
    if not settings.miner_allow_unsandboxed:
        raise MinerSetupError(
            f"the evaluation sandbox cannot be built on this host: {why}; set MINER_ALLOW_UNSANDBOXED=true "
            "to benchmark candidates without it (their code then runs as this user, with its files and network)"
        )
    logger.warning("benchmarking candidates WITHOUT the sandbox (MINER_ALLOW_UNSANDBOXED): %s", why)


class EndpointKeeper:
    """Keeps ``wallet``'s inference endpoint ``host:port`` on ``chain``: each call compares the one
    on chain with it and publishes it when they differ, so a hotkey pruned and registered again
    while the miner runs (its new uid has no endpoint) gets it back at the next cycle. It logs only
    what changed: a publication, a failure (each time: it needs fixing), the hotkey leaving the
    subnet."""

    def __init__(self, chain, wallet, endpoint: tuple[str, int]):
        self.chain = chain
        self.wallet = wallet
        self.hotkey = wallet.hotkey.ss58_address
        self.host, self.port = endpoint
        self._registered: bool | None = None  # as last seen; None before the first look

    def __call__(self) -> None:
        from quasar.chain import ChainError, Endpoint

        try:
            neuron = self.chain.neuron(self.hotkey)
            if neuron is None and self._registered is not False:
                logger.warning(
                    "hotkey %s is not registered on subnet %d: its inference endpoint is published once it is",
                    self.hotkey,
                    self.chain.netuid,
                )
            self._registered = neuron is not None
            if neuron is None or neuron.endpoint == Endpoint(self.host, self.port):
                return
            self.chain.publish_endpoint(self.wallet, self.host, self.port)
        except ChainError as error:
            logger.error(
                "cannot publish the inference endpoint %s:%d on chain: %s (validators cannot check this "
                "miner's logits until it is published; retrying every cycle)",
                self.host,
                self.port,
                error,
            )
            return
        logger.info(
            "published the inference endpoint %s:%d for uid %d on subnet %d",
            self.host,
            self.port,
            neuron.uid,
            self.chain.netuid,
        )


def _check_services(settings: Settings, client, hotkey: str) -> None:
    """Warn when the submission API or this miner's own inference server does not answer: a server
    of another hotkey on MINER_INFERENCE_PORT (a second miner of one .env) fails every logit check.
    A clock off the API's is an error: the API refuses every submission, and an inference server on
    this host refuses validators' checks, which fails them (docs/miner.md)."""
    from quasar import auth
    from quasar.api.client import ApiClientError

    try:
        health = client.health()
        logger.info("submission API %s is up (chain block %d)", client.base_url, health.current_block)
        offset = client.clock_offset()
        refused: list[str] = []
        if auth.clock_refused(offset):
            refused.append("the API refuses this miner's submissions")
        # Validators whose clocks agree with the API's sign with its clock.
        if offset is not None and auth.clock_refused(-offset, halved=True):
            refused.append(
                f"an inference server on this host refuses logit checks of validators whose clocks are up to "
                f"{auth.CLOCK_MARGIN_S:g} s ahead of the API's or {auth.CLOCK_AGE_MARGIN_S:g} s behind, failing them"
            )
        if offset is not None and refused:
            logger.error(
                "%s: %s (requests signed over %g s ahead of the receiver's clock or %g s behind it are refused, "
                "401); sync this host's clock %s",
                auth.clock_offset_text(offset, "the submission API's"),
                ", and ".join(refused),
                auth.ALLOWED_CLOCK_SKEW_S,
                auth.MAX_REQUEST_AGE_S,
                auth.CLOCK_CURE,
            )
    except ApiClientError as error:
        logger.warning(
            "the submission API at %s does not answer (%s); submissions are retried every cycle", client.base_url, error
        )
    url = f"http://127.0.0.1:{settings.miner_inference_port}/health"
    try:
        response = httpx.get(url, timeout=5)
        response.raise_for_status()
        served = response.json().get("hotkey")
    except (httpx.HTTPError, ValueError, AttributeError):
        logger.warning(
            "no miner inference server answers on %s: start ./START_MINER_INFERENCE.sh, or validators "
            "will fail this miner's logit check",
            url,
        )
        return
    if served is not None and served != hotkey:
        logger.warning(
            "the inference server on %s serves hotkey %s, not this miner's %s: validators will fail this "
            "miner's logit check; give each miner on this host its own MINER_INFERENCE_PORT (its own .env, "
            "QUASAR_DOTENV) and start its own ./START_MINER_INFERENCE.sh",
            url,
            served,
            hotkey,
        )


def run_miner(settings: Settings) -> int:
    """Run the miner with ``settings`` until stopped; returns the exit status."""
    for name in SECRET_VARIABLES:
        os.environ.pop(name, None)
    try:
        return _run(settings)
    except (MinerSetupError, WalletError) as error:
        logger.error("%s", error)
        return 1
    except OSError as error:  # a file it cannot write at start (a full or read-only disk); cycles catch their own
        logger.error("the miner stops: %s", error)
        return 1
    except KeyboardInterrupt:
        logger.info("miner stopped")
        return 0


def _run(settings: Settings) -> int:
    _check_settings(settings)

    from quasar.api.client import ApiClient
    from quasar.api.lookup import ApiFollower, ApiNotFound, find_api
    from quasar.chain import ChainError, ChainUnreachable, btcli
    from quasar.chain.factory import connect
    from quasar.evaluate import options_from_settings
    from quasar.miner.github import (
        Git,
        GitError,
        GitHubClient,
        GitHubError,
        write_askpass,
    )
    from quasar.miner.loop import Evaluator, LoopConfig, Miner
    from quasar.miner.state import MinerStateError, StateStore
    from quasar.miner.status import VerdictWatcher
    from quasar.miner.strategies import AgentStrategy, TuningStrategy
    from quasar.miner.submission import Submitter
    from quasar.miner.workspace import ForkClone, Workspace, WorkspaceError

    wallet = open_wallet(settings, "miner")
    hotkey = wallet.hotkey.ss58_address
    device_name = _device_name(settings.device)
    endpoint = published_endpoint(settings)
    try:
        workspace = Workspace(settings.workspace_root, hotkey)
        workspace.acquire()
    except WorkspaceError as error:
        raise MinerSetupError(str(error)) from None
    try:
        logger.info(
            "miner %s (wallet %s/%s) on %s netuid %d; workspace %s",
            hotkey,
            settings.wallet_name_for("miner"),
            settings.wallet_hotkey,
            settings.network,
            settings.netuid,
            workspace.path,
        )
        try:
            chain = connect(settings)
            if not chain.is_registered(hotkey):
                logger.warning(
                    "hotkey %s is not registered on subnet %d: the API refuses its submissions until it is (%s)",
                    hotkey,
                    chain.netuid,
                    btcli.registration_hint(settings, settings.wallet_name_for("miner"), hotkey),
                )
            api = find_api(settings, chain)
        except ChainUnreachable as error:
            raise MinerSetupError(f"chain: {error.with_cure}") from None
        except ChainError as error:
            raise MinerSetupError(f"chain: {error}") from None
        except ApiNotFound as error:
            raise MinerSetupError(str(error)) from None
        logger.info("submission API: %s (from %s)", api.url, api.source)
        keep_endpoint = EndpointKeeper(chain, wallet, endpoint)
        keep_endpoint()

        github = GitHubClient(settings.github_api_url, settings.github_token)
        try:
            fork = github.ensure_fork(settings.github_username, settings.upstream_repo)
        except GitHubError as error:
            raise MinerSetupError(str(error)) from None
        finally:
            github.close()
        url = remote_url(settings.git_remote_base, fork.repository.full_name)
        git = Git(
            write_askpass(workspace.askpass),
            settings.github_username,
            settings.github_token,
            settings.git_author_name or settings.github_username,
            settings.git_author_email or f"{settings.github_username}@users.noreply.github.com",
        )
        clone = ForkClone(workspace.fork, git, url, fork.repository.default_branch)
        try:
            clone.sync()
        except GitError as error:
            raise MinerSetupError(f"cannot set up the workspace clone of {url}: {error}") from None
        store = StateStore(workspace.state_file)
        try:
            state = store.load(hotkey)
        except MinerStateError as error:
            raise MinerSetupError(str(error)) from None
        state.fork_url = url
        store.save(state)
        # Saved first: of two miners starting at once on one fork, at least one sees the other.
        other = workspace.live_miner_on_fork(url)
        if other is not None:
            raise MinerSetupError(
                f"the miner of hotkey {other} is running on the fork {url} too: each would refuse the other's "
                "pushes to its branch; give each hotkey's miner its own GitHub account (GITHUB_USERNAME and "
                "GITHUB_TOKEN in its own .env, QUASAR_DOTENV)"
            )

        client = ApiClient(api.url, wallet, api_hotkey=api.hotkey)
        _check_services(settings, client, hotkey)
        follow_api = ApiFollower(settings, chain, client, api)

        def before_cycle() -> None:
            keep_endpoint()
            follow_api()

        strategies: list = [TuningStrategy(device_name)]
        if settings.agent_api_url:
            strategies.append(
                AgentStrategy(
                    settings.agent_api_url, settings.agent_model, settings.agent_api_key, settings.agent_timeout
                )
            )
        else:
            logger.info("AGENT_API_URL is empty: the agent strategy is off; tuning only")
        # The validators' evaluation settings, so the miner sees what a validator will see.
        options = options_from_settings(settings, allow_unsandboxed=settings.miner_allow_unsandboxed)
        evaluator = Evaluator(options, workspace.reports)
        submitter = Submitter(
            client,
            chain,
            state,
            store,
            settings.submission_mode,
            url,
            publish=clone.push,
            min_gain=settings.min_improvement,
        )
        config = LoopConfig(
            iterations=settings.agent_iterations,
            interval_s=settings.optimization_interval,
            min_improvement=settings.min_improvement,
            target_seq_len=settings.target_sequence_length,
            claim_share=settings.claim_share,
        )

        miner = Miner(
            clone,
            strategies,
            evaluator,
            submitter,
            state,
            store,
            config,
            before_cycle=before_cycle,
            verdicts=VerdictWatcher(client, hotkey),
        )
        stop = threading.Event()
        stop_on_signals(stop)
        logger.info(
            "mining: %d candidate(s) per cycle, %gs between cycles, %s submissions",
            config.iterations,
            config.interval_s,
            settings.submission_mode,
        )
        miner.run(stop)
        logger.info("miner stopped")
        return 0
    finally:
        workspace.release()
