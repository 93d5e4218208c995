"""What a validator logs per evaluation at the default level: pm2 keeps every line, and a validator
of 8 GPUs evaluates about 600 submissions an hour on a busy subnet (docs/validator.md, "Logs")."""

from __future__ import annotations

import logging
from contextlib import contextmanager

from api_fixtures import FORK, ApiServer, api_config, commit_of
from quasar import config
from quasar.api.client import ApiClient, Claim
from quasar.validator.devices import Device
from quasar.validator.loop import Validator
from quasar.validator.state import ValidatorState
from tests.evaluate_runs import worker_evaluation_of_the_starter_fork
from tests.test_validator_hosts import KnownSpeeds, Passing

MINERS = ("a", "b", "c")


@contextmanager
def validator_of_three_submissions(tmp_path, chain, wallets, database_url, epoch_blocks: str):
    """A validator (a stand-in GPU timing each commit at a known speed, logit checks passing) on an
    API where each of the three miners has submitted; yields (state, validator)."""
    for name in MINERS:
        chain.publish_endpoint(wallets[name], "192.0.2.1", 8001)
    api_hotkey = wallets["api"].hotkey.ss58_address
    speeds = {commit_of(n + 1): 1e5 * (n + 1) for n in range(len(MINERS))}
    settings = config.resolve(
        {"network": "devchain", "netuid": "24", "device": "cpu", "epoch_blocks": epoch_blocks},
        environ={},
        dotenv_path=None,
    )
    with (
        ApiServer(api_config(api_hotkey), chain, database_url) as server,
        ValidatorState.open(tmp_path / "state.sqlite3") as state,
        ApiClient(server.url, wallets["v1"], api_hotkey=api_hotkey) as api,
    ):
        for n, name in enumerate(MINERS):
            with ApiClient(server.url, wallets[name], api_hotkey=api_hotkey) as miner:
                miner.submit_kernel(Claim(FORK, commit_of(n + 1), 1e5), 1_000_000)
        validator = Validator(
            settings, chain, api, wallets["v1"], KnownSpeeds(speeds), Passing(), state, devices=[Device("gpu0", "0")]
        )
        yield state, validator


def test_an_evaluation_is_one_line_at_info_from_fetch_to_report(tmp_path, chain, wallets, database_url, caplog):
    """Three submissions fetched, evaluated (a stand-in GPU), logit-checked and reported: one INFO
    line each, its result; the fetch, the passed check and the report are DEBUG. Four lines an
    evaluation were 0.7 KB, 13 MB a day for a validator of 8 GPUs."""
    caplog.set_level(logging.INFO, logger="quasar")
    with validator_of_three_submissions(tmp_path, chain, wallets, database_url, "100000") as (_, validator):
        validator.step()  # weights at the first step (nothing ranked yet); then only the evaluations
        caplog.clear()
        for _ in range(8):
            validator.step()
        assert validator.idle
    said = [record.getMessage() for record in caplog.records if record.name.startswith("quasar.validator")]
    assert len(said) == len(MINERS) and all(line.startswith("evaluation of ") for line in said), said


def test_a_validators_worker_writes_no_line_per_evaluation_unless_debugging(tmp_path, capfd):
    """The evaluation's worker process writes to the validator's stderr (pm2's log): its clone,
    import check, per-length figures and verdict were six lines and 1.2 KB an evaluation, which
    the validator's one result line and its report to the API already carry."""
    worker_evaluation_of_the_starter_fork(tmp_path)
    written = capfd.readouterr().err
    assert " INFO " not in written, written


def test_weights_unchanged_since_the_last_epoch_are_one_line_not_their_table_again(
    tmp_path, chain, wallets, database_url, caplog
):
    """The same three results ranked at four epochs: the weights table is logged the first time,
    then each setting is one line naming the block whose table still holds. The local network sets
    weights every second: its table every second was 68 MB a day in its validator.log."""
    chain.register_wallet(wallets["stranger"])
    chain.set_owner(wallets["stranger"].hotkey.ss58_address)
    chain.set_hyperparameters(commit_reveal_enabled=False, weights_rate_limit=0)
    with validator_of_three_submissions(tmp_path, chain, wallets, database_url, "10") as (state, validator):
        while not validator.idle or not list(state.scored()):
            validator.step()
        caplog.set_level(logging.INFO, logger="quasar.validator.weight_setting")
        caplog.clear()  # the first weights, whose table is logged, if an earlier test left INFO on
        for _ in range(4):
            chain.advance(10)
            assert validator.step().weights_set
    said = [record.getMessage() for record in caplog.records if record.name == "quasar.validator.weight_setting"]
    assert len(said) == 4 and sum("QUASAR weights" in line for line in said) == 1, said
    assert all("the same ranking as at block" in line for line in said[1:]), said
