"""Build the :class:`~quasar.chain.Chain` a process's settings ask for."""

from __future__ import annotations

from quasar.chain.base import Chain
from quasar.config import DEV_NETWORK, Settings


def connect(settings: Settings) -> Chain:
    """The chain of ``settings.network``: the embedded dev chain for ``devchain``, otherwise the
    Bittensor network (or ``settings.chain_endpoint``, a ws URL, when set) through the SDK."""
    if settings.network == DEV_NETWORK:
        from quasar.chain.devchain import DevChain

        return DevChain(settings.devchain_path, netuid=settings.netuid, block_time_s=settings.devchain_block_time)
    from quasar.chain.bittensor_chain import BittensorChain

    return BittensorChain(settings.network, settings.netuid, settings.chain_endpoint)
