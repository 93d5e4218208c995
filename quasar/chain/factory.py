"""Build the :class:`~quasar.chain.Chain` a process's settings ask for."""

from __future__ import annotations

from quasar.chain.base import Chain, ChainError
from quasar.config import DEV_NETWORK, Settings


def connect(settings: Settings) -> Chain:
    """The chain of ``settings.network``: the embedded dev chain for ``devchain``."""
    if settings.network == DEV_NETWORK:
        from quasar.chain.devchain import DevChain

        return DevChain(settings.devchain_path, netuid=settings.netuid, block_time_s=settings.devchain_block_time)
    raise ChainError(
        f"network {settings.network!r}: the Bittensor chain implementation is not built yet; "
        f"use --subtensor.network {DEV_NETWORK} (the embedded dev chain) for now"
    )
