"""``quasar inference serve`` (``python -m quasar.inference serve``): run the miner inference server
with the reference model.

Settings come from quasar.config (flag > environment > .env > default): the wallet whose hotkey
validators address (``--wallet.name``/``--wallet.hotkey``), the chain that says who holds a
validator permit (``--subtensor.network``, ``--netuid``), the model (``--reference-model``,
``--device``, ``--reference-dtype``) and the server (``--inference.host``, ``--inference.port``,
``--inference.max-prompt-len``, ``--inference.max-gen-len``, ``--inference.queue-size``,
``--inference.max-connections-per-client``).
The miner neuron publishes this server's port on chain; this command only serves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from quasar import config
from quasar.log import setup_logging
from quasar.terminal import WrappingParser

log = logging.getLogger("quasar.inference")


def serve(settings: config.Settings) -> int:
    """Load the wallet's hotkey, the chain and the model once, then serve until stopped."""
    import uvicorn

    from quasar.chain import ChainError, said_with_cure
    from quasar.chain.factory import connect
    from quasar.chain.wallets import WalletError, open_wallet
    from quasar.config.values import PUBLIC_NETWORKS
    from quasar.evaluate.gpus import GpuOrderError, use_pci_bus_order
    from quasar.inference.server import InferenceLimits, create_inference_app, server_options
    from quasar.logits import ModelLoadError, check_reference_settings, check_reference_shape, load_reference_model

    # Each step's error says what failed; any of them ends the command. What needs no network (the
    # device, a local model folder, the wallet) is checked first, as the miner's start does.
    try:
        if settings.device.startswith("cuda"):
            use_pci_bus_order(os.environ)  # DEVICE and CUDA_VISIBLE_DEVICES in nvidia-smi's numbering
        check_reference_settings(settings.reference_model, settings.device)
        hotkey = open_wallet(settings, "miner").hotkey.ss58_address
        chain = connect(settings)
        if not chain.is_registered(hotkey):
            log.warning(
                "hotkey %s is not registered on subnet %d: validators will not find this server", hotkey, chain.netuid
            )
        model = load_reference_model(settings.reference_model, settings.device, settings.reference_dtype)
        if settings.network in PUBLIC_NETWORKS:  # a local network takes any model, its stand-in included
            check_reference_shape(model, settings.network)
        limits = InferenceLimits(
            settings.inference_max_prompt_len,
            settings.inference_max_gen_len,
            settings.inference_queue_size,
            max_connections_per_client=settings.inference_max_connections_per_client,
        )
        # Its per-block cache reads the chain's block time (a ChainError).
        app = create_inference_app(model, chain, hotkey, limits)
    except (WalletError, ChainError, ModelLoadError, GpuOrderError) as error:
        log.error("%s%s", "chain: " if isinstance(error, ChainError) else "", said_with_cure(error))
        return 1
    log.info(
        "serving %s (%s on %s) for hotkey %s on %s:%d",
        model.name,
        model.dtype_name,
        model.device,
        hotkey,
        settings.inference_host,
        settings.miner_inference_port,
    )
    # The request line, headers and body are limited in size and time (server_options). A line per
    # request only with --logging.debug: anyone on the internet may send requests, and each line
    # would grow the log (pm2's files) at their pace; the server logs every inference itself.
    uvicorn.run(
        app,
        host=settings.inference_host,
        port=settings.miner_inference_port,
        log_config=None,
        access_log=settings.debug,
        **server_options(limits),
    )
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "quasar inference") -> int:
    """Serve until stopped; exit status 1 when the wallet, the chain or the model cannot be loaded."""
    parser = WrappingParser(prog=prog, description="Run the miner inference server with the reference model.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the miner inference server")
    config.add_arguments(serve_parser, "inference")
    _, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    return serve(settings)
