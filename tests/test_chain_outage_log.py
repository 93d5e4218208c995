"""A chain endpoint out of reach for hours (a public node down, or the operator's own): each read is
tried again after a back-off, and pm2 keeps every line of it."""

from __future__ import annotations

import logging

import pytest

from quasar.api.devdb import free_port
from quasar.chain.base import ChainError
from quasar.chain.bittensor_chain import BittensorChain


def test_a_node_out_of_reach_is_said_once_per_read_not_at_every_retry(caplog):
    """Twenty reads of the metagraph, each tried four times, on a port nothing listens on (the SDK's
    own connection), within seconds: the retry is said once (again only every 10 minutes), not
    three lines a read (a validator reads it every step: 2 MB a day through a node's outage)."""
    caplog.set_level(logging.INFO, logger="quasar.chain")
    chain = BittensorChain("finney", 24, f"ws://127.0.0.1:{free_port()}", sleep=lambda seconds: None)
    for _ in range(20):
        with pytest.raises(ChainError):
            chain.metagraph()
    # The SDK's own lines of each try are below WARNING, which the processes' logging keeps it at.
    said = [record.getMessage() for record in caplog.records if record.name.startswith("quasar.")]
    assert len(said) == 1 and said[0].startswith("read the metagraph on ws://127.0.0.1:"), (len(said), said[:2])
