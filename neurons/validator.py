"""QUASAR validator: ``python -m neurons.validator --wallet.name … --wallet.hotkey … --netuid …``."""

from __future__ import annotations

import argparse
import logging
import sys

from quasar import config
from quasar.log import setup_logging

log = logging.getLogger("quasar.validator")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neurons.validator", description=__doc__)
    config.add_arguments(parser)
    _, settings = config.parse_args(parser, argv)
    setup_logging(settings.debug, secrets=settings.secrets())
    log.info("validator wallet %s/%s on %s netuid %d", settings.wallet_name_for("validator"),
             settings.wallet_hotkey, settings.network, settings.netuid)
    log.error("the validator loop is not built yet (issue 7: chain layer and neurons)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
