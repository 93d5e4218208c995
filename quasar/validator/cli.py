"""``quasar validator`` (``python -m neurons.validator``): the validator neuron.

    quasar validator --wallet.name … --wallet.hotkey … --netuid …

Pulls submissions from the API (``VALIDATOR_API_URL``, else the one the subnet owner published on
chain), evaluates each in a sandbox (one at a time per GPU), checks the miner's logits, reports,
and sets weights every EPOCH_BLOCKS from its own results. At start it checks that this host can
build the evaluation sandbox, its wallet, its registration and the subnet's rules for weights
(version key, max_weight_limit, min_allowed_weights: what cannot work stops it, the rest is
logged). Ctrl-C (or SIGTERM) stops it cleanly; a restart resumes from its state file under
VALIDATOR_DATA_DIR.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence

from quasar import config
from quasar.chain import ChainUnreachable
from quasar.errors import QuasarError
from quasar.log import setup_logging
from quasar.terminal import WrappingParser

log = logging.getLogger("quasar.validator")


def run(settings: config.Settings) -> int:
    """Build the validator from ``settings`` and run it until stopped."""
    import torch

    import quasar
    from quasar.api.client import ApiClient
    from quasar.api.lookup import ApiFollower, find_api
    from quasar.chain.factory import connect
    from quasar.chain.wallets import open_wallet
    from quasar.evaluate.gpus import nvidia_gpus, use_pci_bus_order
    from quasar.evaluate.options import output_area_warning
    from quasar.validator.devices import device_warnings, evaluation_devices
    from quasar.validator.evaluator import SubprocessEvaluator
    from quasar.validator.logit_check import MinerLogitChecker
    from quasar.validator.loop import Validator
    from quasar.validator.preflight import check_registration, check_sandbox, check_subnet_rules
    from quasar.validator.state import ValidatorState
    from quasar.validator.state_files import default_state_path

    if settings.device != "cpu":
        use_pci_bus_order(os.environ)  # before CUDA starts: the reference model's cuda:0 is its first worker's GPU
    check_sandbox()
    wallet = open_wallet(settings, "validator")
    hotkey = wallet.hotkey.ss58_address
    cuda_count = torch.cuda.device_count() if settings.device != "cpu" else 0
    devices = evaluation_devices(settings.device, cuda_count, os.environ.get("CUDA_VISIBLE_DEVICES"), nvidia_gpus())
    for warning in device_warnings(settings.network, settings.device):
        log.warning("%s", warning)
    area_warning = output_area_warning(settings.eval_seq_lens, settings.sandbox_memory_mb << 20, settings.device)
    if area_warning is not None:
        log.warning("%s", area_warning)
    chain = connect(settings)
    check_registration(chain, hotkey, settings)
    check_subnet_rules(chain, settings, quasar.version_key())
    api_target = find_api(settings, chain)
    log.info("submission API: %s (from %s)", api_target.url, api_target.source)
    state_path = default_state_path(settings.validator_data_dir, settings.network, chain.netuid, hotkey)
    with (
        ValidatorState.open(state_path) as state,
        ApiClient(api_target.url, wallet, api_hotkey=api_target.hotkey) as api,
    ):
        log.info("validator state: %s", state.path)
        checker = MinerLogitChecker.from_settings(settings, wallet, devices[0].name)
        evaluator = SubprocessEvaluator.from_settings(settings, state.path.with_name(state.path.stem + "-work"))
        evaluator.discard_leftover_clones()
        follow_api = ApiFollower(settings, chain, api, api_target)
        validator = Validator(
            settings, chain, api, wallet, evaluator, checker, state, devices=devices, follow_api=follow_api
        )
        checker.sleep = validator.pause  # a stop ends the wait between a check's tries after a 503
        validator.run_forever()
    return 0


DESCRIPTION = (
    "QUASAR validator: evaluates the submissions in a sandbox, checks the miners' logits, reports to "
    "the API and sets weights from its own results."
)


def build_parser(prog: str = "quasar validator", add_help: bool = True) -> argparse.ArgumentParser:
    """The validator's command line (``add_help=False``: without -h/--help, for one who adds its own)."""
    parser = WrappingParser(prog=prog, description=DESCRIPTION, add_help=add_help)
    config.add_arguments(parser, "validator")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "quasar validator") -> int:
    """Run the validator until stopped; exit status 1 when it cannot start."""
    _, settings = config.parse_args(build_parser(prog), argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    try:
        return run(settings)
    except ChainUnreachable as error:
        log.error("%s", error.with_cure)
        return 1
    except QuasarError as error:
        log.error("%s", error)
        return 1
    except KeyboardInterrupt:
        log.info("interrupted before the validator loop started")
        return 0
