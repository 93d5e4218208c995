"""One validator hotkey in several processes (VALIDATOR_ROLE): a worker and a primary share the API's
leases (never the same submission twice), the worker only evaluates and reports, the primary adds
the worker's results and sets weights that rank them. A real API on 127.0.0.1, the dev chain and
the validator's own loop; the GPU is a stand-in that measures a known speed at once."""

from __future__ import annotations

from api_fixtures import FORK, ApiServer, api_config, commit_of
from quasar import config
from quasar.api.client import ApiClient, Claim
from quasar.inference.client import LogitCheck
from quasar.validator.devices import Device
from quasar.validator.evaluator import EvaluationOutcome
from quasar.validator.loop import Validator
from quasar.validator.records import EvaluationKey, EvaluationResult
from quasar.validator.state import ValidatorState

SPEEDS = {"a": 3e5, "b": 2e5, "c": 1e5}


class Finished:
    """An evaluation that is done as soon as it starts, at the miner's known speed."""

    def __init__(self, key: EvaluationKey, device: Device, speed: float):
        self.key, self.device = key, device
        self._outcome = EvaluationOutcome(
            result=EvaluationResult(
                correct=True, measured_tokens_per_sec=speed, benchmarks={key.target_sequence_length: speed}
            )
        )

    def poll(self) -> EvaluationOutcome:
        return self._outcome

    def cancel(self) -> None:
        pass

    def kill(self) -> None:
        pass


class KnownSpeeds:
    def __init__(self, speeds: dict[str, float]):
        self.speeds = speeds
        self.started: list[str] = []

    def start(self, key: EvaluationKey, device: Device) -> Finished:
        self.started.append(key.commit_hash)
        return Finished(key, device, self.speeds[key.commit_hash])


class Passing:
    def check(self, endpoint_url: str, miner_hotkey: str) -> LogitCheck:
        return LogitCheck(passed=True, reason="stand-in")


def test_a_worker_and_a_primary_of_one_hotkey_split_the_work_and_the_primary_ranks_all_of_it(
    tmp_path, chain, wallets, database_url
):
    for name in SPEEDS:
        chain.publish_endpoint(wallets[name], "192.0.2.1", 8001)
    chain.register_wallet(wallets["stranger"])  # the subnet owner: the fourth place's unassigned share
    chain.set_owner(wallets["stranger"].hotkey.ss58_address)
    # Weights set directly and visible at once (commit-reveal is not what this test is about).
    chain.set_hyperparameters(commit_reveal_enabled=False, weights_rate_limit=0)
    api_hotkey = wallets["api"].hotkey.ss58_address
    speeds = {commit_of(n + 1): speed for n, speed in enumerate(SPEEDS.values())}
    with ApiServer(api_config(api_hotkey), chain, database_url) as server:
        for n, name in enumerate(SPEEDS):
            with ApiClient(server.url, wallets[name], api_hotkey=api_hotkey) as miner:
                miner.submit_kernel(Claim(FORK, commit_of(n + 1), SPEEDS[name]), 1_000_000)
        processes = {}
        for role in ("worker", "primary"):
            settings = config.resolve(
                {"network": "devchain", "netuid": "24", "device": "cpu", "epoch_blocks": "100", "validator_role": role},
                environ={},
                dotenv_path=None,
            )
            state = ValidatorState.open(tmp_path / f"{role}.sqlite3")
            api = ApiClient(server.url, wallets["v1"], api_hotkey=api_hotkey)
            evaluator = KnownSpeeds(speeds)
            validator = Validator(
                settings,
                chain,
                api,
                wallets["v1"],
                evaluator,
                Passing(),
                state,
                devices=[Device("gpu0", "0"), Device("gpu1", "1")] if role == "worker" else [Device("gpu0", "0")],
            )
            processes[role] = (validator, state, api, evaluator)
        try:
            worker, primary = processes["worker"][0], processes["primary"][0]
            assert worker.step().started and primary.step().started  # worker takes two, the primary the third
            for _ in range(3):
                worker_step, primary_step = worker.step(), primary.step()
                assert not worker_step.weights_set and not worker_step.failed_phases
                assert not primary_step.failed_phases
            started = processes["worker"][3].started + processes["primary"][3].started
            assert sorted(started) == sorted(speeds)  # every submission evaluated once, by one process
            assert len(processes["worker"][3].started) == 2
            # The primary ranks the worker's results with its own.
            ranked = {record.submission.hotkey for record in processes["primary"][1].scored()}
            assert ranked == {wallets[name].hotkey.ss58_address for name in SPEEDS}
            chain.advance(100)
            assert primary.step().weights_set and not worker.step().weights_set
            weights = chain.weights()[chain.neuron(wallets["v1"].hotkey.ss58_address).uid]
            uid = {name: chain.neuron(wallets[name].hotkey.ss58_address).uid for name in (*SPEEDS, "stranger")}
            assert [weights[uid[name]] for name in (*SPEEDS, "stranger")] == [0.6, 0.25, 0.1, 0.05]
        finally:
            for _, state, api, _ in processes.values():
                state.close()
                api.close()
