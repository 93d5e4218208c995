"""A whole subnet in compressed time against the real submission API: does the work schedule keep up?

Starts the API (``quasar.api.app``, the protocol it ships with) in a process of its own over a fresh
SQLite file or throwaway PostgreSQL server, on an embedded dev chain, with every clock sped up
``--speedup`` times: the chain's blocks, the API's rate limits, leases and rounds, and the
validators' clocks. Then, for ``--rounds`` rounds of ``--round-blocks`` blocks:

- ``--miners`` hotkeys submit at their limit (``SUBMISSIONS_PER_HOUR``, signed, each from an
  address of its own behind the API's trusted proxy): the honest ones a kernel a little faster each
  time, claiming a little under what it runs at; ``--spammers`` of them slow but correct kernels,
  claimed honestly; ``--copiers`` of them the round's leader's kernel, as its commit (refused) and
  as the same files under a commit of their own, claiming 3% more;
- ``--validators`` validators run the validator's own loop (``quasar.validator.loop.Validator``:
  fetch, evaluate, check logits, report, set weights) with ``--workers`` devices each, the same
  code path as on GPUs but for the evaluation: a stand-in that takes ``--eval-seconds`` (simulated)
  and measures a kernel's true speed with 1% noise; logit checks pass.

After the last round the miners stop and the validators get one more round to drain the queue. Reported per round,
from the API's database and the simulation's ground truth: the queue (ready submissions a
validator has not reported on, sampled); the time from an honest submission to the first
evaluation of it or of a newer submission of its hotkey (which superseded it), median, p95 and
max; the GPU time used, of the validators' devices, and spent on submissions that could not place
(copies, and those whose upper bound, claim x multiplier, was below the leaderboard's fourth place
when their evaluation started); whether every validator evaluated every honest hotkey's newest
submission within one round (each honest submission, or a newer one of its hotkey, reported on by
each validator within a round of it); and whether the API's top four are the true top four (the
four best among the submissions that at least two validators reported on, ranked by the subnet's
rules with each kernel's true speed as its measurement).
``--without-spammers-too`` first runs the same subnet without the spammers (the same honest miners
and copiers) and compares the honest miners' median wait.

    quasar bench simulate-subnet --backend both --validators 3 --workers 8 --eval-seconds 25 \\
        --rounds 6 --speedup 40 --without-spammers-too

(a full subnet: 256 uids, the validators' and 253 miners'.) The compression has a ceiling: the API,
the validators' loops and the miners share this machine's CPU, and a chain block is 12 s divided by
``--speedup`` (the leaderboard is computed once a block). Every real second a validator's loop
waits for the CPU (to notice an evaluation ended, report it, fetch the next) is ``--speedup``
simulated seconds of a device idle. So each round also says how much of the devices' time sat idle
while the API had work for them ("idle"); where that is above ``LAG_LIMIT`` the loops, not the
GPUs, set the pace, and late pairs in such a round are reported as not shown (the machine's), not
as the schedule's: run again slower or on a quieter machine.

The world and its actors (the stand-in GPUs, the miners) are in :mod:`quasar.bench.subnet_actors`,
the figures in :mod:`quasar.bench.subnet_figures`. Traffic goes to loopback only.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import random
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import bittensor as bt
import httpx
from bittensor.sp_core import Keypair
from rich.console import Console

from quasar import config, scheduling
from quasar.api.__main__ import GIL_SWITCH_INTERVAL_S
from quasar.api.client import ApiClient
from quasar.api.db import Database
from quasar.api.devdb import TemporaryPostgres, free_port
from quasar.bench.subnet_actors import (
    BLOCK_S,
    COPY,
    HONEST,
    SPAM,
    Miner,
    Miners,
    PassingLogitChecker,
    SimClock,
    StandInEvaluator,
    World,
    new_wallet,
)
from quasar.bench.subnet_figures import RunFigures, figures_per_round, figures_table, lag_verdict, sample_queue
from quasar.chain.devchain import FINNEY, DevChain
from quasar.validator.devices import Device
from quasar.validator.loop import Validator
from quasar.validator.state import ValidatorState

FOURTH_PLACE_EVERY_S = 60.0  # simulated seconds between two samples of the leaderboard and the queue
NETUID = 24
# The port the miners publish (none is ever reached): MINER_INFERENCE_PORT's default.
MINER_PORT = int(config.OPTIONS_BY_KEY["miner_inference_port"].default)
MEMORY_DIR = Path("/dev/shm")
SUBNET_UIDS = FINNEY.max_allowed_uids


def serve_api(
    database_url: str,
    chain_path: str,
    api_hotkey: str,
    port: int,
    clock: tuple[float, float, float],
    round_blocks: int,
    submissions_per_hour: int,
) -> None:
    """The API process: the app with the simulation's clock, served as ``python -m quasar.api`` serves it."""
    import uvicorn

    from quasar.api.app import create_app
    from quasar.api.protocol import protocol_factory
    from quasar.api.service import ApiConfig

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    settings = config.resolve({}, environ={}, dotenv_path=None)
    api_config = ApiConfig(
        api_hotkey=api_hotkey,
        blocks_until_reveal=settings.blocks_until_reveal,
        reveal_window_blocks=settings.reveal_window_blocks,
        round_blocks=round_blocks,
        submissions_per_hour=submissions_per_hour,
        evaluation_lease_s=settings.evaluation_lease_s,
        trusted_proxies=("127.0.0.1",),
        allow_local_forks=False,
        tie_epsilon=settings.tie_epsilon,
        quorum_stake_share=settings.quorum_stake_share,
        quorum_min_validators=settings.quorum_min_validators,
    )
    app = create_app(api_config, DevChain(chain_path), database_url, clock=SimClock(*clock))
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        # uvicorn types ``http`` as a protocol class or a name, but only calls it to make each
        # connection's protocol (uvicorn/server.py), so a factory with the API's limits serves.
        http=protocol_factory(settings.api_max_header_bytes, settings.api_header_timeout),  # type: ignore[arg-type]
    )


def run(backend: str, args: argparse.Namespace, spammers: int, console: Console) -> RunFigures:
    """One simulation on ``backend`` with ``spammers`` spamming hotkeys (0 or ``args.spammers``)."""
    round_s = args.round_blocks * BLOCK_S
    with tempfile.TemporaryDirectory(prefix="quasar-sim-") as folder:
        workdir = Path(folder)
        postgres = TemporaryPostgres(durable=False).start() if backend == "postgresql" else None
        try:
            database_url = postgres.create_database("quasar_sim") if postgres else f"sqlite:///{workdir}/api.sqlite3"
            Database(database_url).upgrade()
            chain = DevChain(workdir / "devchain.sqlite3", netuid=NETUID, block_time_s=BLOCK_S / args.speedup)
            api_key = Keypair.create_from_seed(secrets.token_bytes(32))
            wallets = [new_wallet(workdir / "wallets", f"validator{n}") for n in range(args.validators)]
            for wallet in wallets:  # equal stakes
                chain.register_wallet(wallet, stake=1e4, validator_permit=True)
            honest = args.miners - args.spammers - args.copiers  # the same honest miners with or without spam
            crowd_kinds = [(SPAM, i) for i in range(spammers)] + [(COPY, i) for i in range(args.copiers)]
            crowd_kinds += [(HONEST, i) for i in range(honest)]
            miners = []
            for n, (kind, i) in enumerate(crowd_kinds):
                name = f"{kind}{i}"
                own = random.Random(f"{args.seed}-{name}")  # the same miner in every run
                key = Keypair.create_from_seed(own.randbytes(32))
                chain.register(key.ss58_address, key.ss58_address)
                chain.publish_endpoint(key, f"192.0.2.{n % 250 + 1}", MINER_PORT)
                speed = 1e6 * math.exp(own.gauss(0, 0.35)) * (0.05 if kind == SPAM else 1.0)
                miners.append(Miner(name, kind, key, f"10.{n // 250}.{n % 250}.1", speed, random.Random(own.random())))
            clock = SimClock(time.time(), time.time(), args.speedup)
            port = free_port()
            server = multiprocessing.get_context("spawn").Process(
                target=serve_api,
                args=(
                    database_url,
                    str(chain.path),
                    api_key.ss58_address,
                    port,
                    (clock.start, clock.real_start, clock.speedup),
                    args.round_blocks,
                    args.submissions_per_hour,
                ),
                daemon=True,
            )
            server.start()
            url = f"http://127.0.0.1:{port}"
            wait_for_api(url, server)
            world = World()
            settings = config.resolve(
                {"network": "devchain", "netuid": str(NETUID), "device": "cpu", "epoch_blocks": str(args.round_blocks)},
                environ={},
                dotenv_path=None,
            )
            validators: list[Validator] = []
            # The validators' state files in memory where the host has it: their fsyncs are not what
            # this simulation measures, and 24 devices finishing every second of compressed time make
            # a hundred of them a second.
            states = Path(
                tempfile.mkdtemp(prefix="quasar-sim-validators-", dir=MEMORY_DIR if MEMORY_DIR.is_dir() else workdir)
            )
            started_validators = threading.Barrier(args.validators + 1)

            def validate(index: int, wallet: bt.Wallet) -> None:
                """One validator's loop, in a thread of its own (its state file is this thread's)."""
                with (
                    ValidatorState.open(states / f"validator{index}.sqlite3") as state,
                    ApiClient(url, wallet, api_hotkey=api_key.ss58_address, timeout=60) as api,
                ):
                    validator = Validator(
                        settings,
                        chain,
                        api,
                        wallet,
                        StandInEvaluator(
                            world, clock, args.eval_seconds, random.Random(index), wallet.hotkey.ss58_address
                        ),
                        PassingLogitChecker(),
                        state,
                        devices=[Device(f"gpu{n}", str(n)) for n in range(args.workers)],
                        clock=clock,
                        interval_s=clock.real_seconds(1.0),
                    )
                    validators.append(validator)
                    started_validators.wait()
                    validator.run_forever()

            loops = [
                threading.Thread(target=validate, args=(index, wallet), name=f"validator{index}", daemon=True)
                for index, wallet in enumerate(wallets)
            ]
            for loop in loops:
                loop.start()
            started_validators.wait()
            console.print(
                f"[bold]{backend}[/]: {len(miners)} miners ({spammers} spamming, {args.copiers} copying), "
                f"{args.validators} validators x {args.workers} workers, {args.eval_seconds:g} s "
                f"evaluations, {args.rounds} rounds of {args.round_blocks} blocks, {args.speedup:g}x"
            )
            database = Database(database_url)
            block = chain.current_block()  # the first round starts now
            chain.advance(args.round_blocks - block % args.round_blocks)
            first_round = chain.current_block() // args.round_blocks
            started = time.monotonic()
            end = clock() + args.rounds * round_s
            crowd = Miners(miners, url, api_key.ss58_address, world, clock, 3600.0 / args.submissions_per_hour)
            submitting = threading.Thread(target=crowd.run, args=(end,), name="miners")
            submitting.start()
            queue: dict[int, list[tuple[float, dict[str, int]]]] = defaultdict(list)
            fourth_places: dict[int, list[tuple[float, float | None]]] = defaultdict(list)
            leaderboards: dict[int, list[str]] = {}
            public = ApiClient(url)
            validator_hotkeys = [wallet.hotkey.ss58_address for wallet in wallets]
            while clock() < end + round_s:  # then a round for the validators to drain the queue
                current = chain.current_block() // args.round_blocks
                if clock() < end:
                    queue[current - first_round].append(
                        (clock(), sample_queue(database, validator_hotkeys, current - 1))
                    )
                board = public.leaderboard()
                fourth_places[board.round_id - first_round].append(
                    (clock(), scheduling.fourth_place(entry.weighted_score for entry in board.entries))
                )
                time.sleep(clock.real_seconds(FOURTH_PLACE_EVERY_S))
            submitting.join()
            crowd.close()
            for validator in validators:
                validator.request_stop()
            for loop in loops:
                loop.join(timeout=60)
            for offset in range(args.rounds):
                board = public.leaderboard(first_round + offset)
                leaderboards[offset] = [entry.hotkey for entry in board.entries[:4]]
            public.close()
            shutil.rmtree(states, ignore_errors=True)
            wall_s = time.monotonic() - started
            figures, waits = figures_per_round(
                database,
                world,
                validator_hotkeys,
                args.workers,
                first_round,
                args.rounds,
                round_s,
                args.eval_seconds,
                leaderboards,
                queue,
                fourth_places,
            )
            database.dispose()
            server.terminate()
            server.join(timeout=30)
        finally:
            if postgres:
                postgres.stop()
    return RunFigures(
        backend=backend,
        miners=len(miners),
        spammers=spammers,
        copiers=args.copiers,
        validators=args.validators,
        workers=args.workers,
        eval_seconds=args.eval_seconds,
        round_blocks=args.round_blocks,
        speedup=args.speedup,
        wall_s=wall_s,
        rounds=figures,
        refused_copies=world.refused_copies,
        miner_errors=dict(crowd.errors),
        honest_wait_median_min=statistics.median(waits) if waits else None,
    )


def print_figures(figures: RunFigures, console: Console) -> None:
    console.print(figures_table(figures))
    verdict = lag_verdict(figures)
    if verdict:
        console.print(verdict)


def wait_for_api(url: str, server: multiprocessing.process.BaseProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not server.is_alive():
            raise SystemExit("the API process exited")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"the API did not answer within {timeout_s:g} s")


def main(argv: list[str] | None = None, prog: str = "quasar bench simulate-subnet") -> int:
    """Run the simulation (module docstring) and print its figures per round."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql", "both"), default="sqlite")
    parser.add_argument(
        "--miners",
        type=int,
        default=None,
        help="hotkeys submitting, spammers and copiers included (default: the rest of a full "
        "subnet's 256 uids beside the validators)",
    )
    parser.add_argument("--spammers", type=int, default=10, help="hotkeys submitting slow kernels at the limit")
    parser.add_argument("--copiers", type=int, default=5, help="hotkeys copying the round's leader")
    parser.add_argument("--validators", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8, help="devices (GPUs) per validator")
    parser.add_argument("--eval-seconds", type=float, default=25.0, help="simulated seconds one evaluation takes")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--round-blocks", type=int, default=int(config.OPTIONS_BY_KEY["round_blocks"].default))
    parser.add_argument(
        "--submissions-per-hour",
        type=int,
        metavar="N",
        default=int(config.OPTIONS_BY_KEY["submissions_per_hour"].default),
    )
    parser.add_argument("--speedup", type=float, default=40.0, help="simulated seconds per real second")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--without-spammers-too",
        action="store_true",
        help="also run without the spammers first, and compare the honest miners' median wait",
    )
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)
    if args.miners is None:
        args.miners = SUBNET_UIDS - args.validators
    if args.miners + args.validators > SUBNET_UIDS:
        parser.error(f"a subnet holds {SUBNET_UIDS} uids: --miners and --validators together at most that")
    # The validators' and the API's own lines (a superseded submission's refused report, ...) are
    # the subnet working as it should: the figures say what it did.
    logging.getLogger("quasar").setLevel(logging.ERROR)
    if args.spammers + args.copiers >= args.miners:
        parser.error("--miners must leave room for honest miners beside the spammers and copiers")
    # Many threads (the validators' loops, the miners) share this process: hand the interpreter
    # over as often as the API's own processes do, so none waits on the others for long.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    console = Console()
    results = []
    for backend in ("sqlite", "postgresql") if args.backend == "both" else (args.backend,):
        if args.without_spammers_too:
            baseline = run(backend, args, 0, console)
            print_figures(baseline, console)
            results.append(baseline)
        figures = run(backend, args, args.spammers, console)
        print_figures(figures, console)
        console.print(
            f"{figures.refused_copies} copies of a leader's commit refused; miner errors: "
            f"{figures.miner_errors or 'none'}; {figures.wall_s:.0f} s of wall time"
        )
        if args.without_spammers_too and baseline.honest_wait_median_min and figures.honest_wait_median_min:
            delay = figures.honest_wait_median_min / baseline.honest_wait_median_min - 1
            console.print(
                f"the spammers delayed honest miners' median first evaluation by {delay:+.1%} "
                f"({baseline.honest_wait_median_min:.1f} -> {figures.honest_wait_median_min:.1f} min)"
            )
        results.append(figures)
    if args.json:
        args.json.write_text(json.dumps([asdict(item) for item in results], indent=1))
    return 0
