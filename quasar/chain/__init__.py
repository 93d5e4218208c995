"""The chain layer: what the rest of QUASAR needs from a Bittensor chain, behind one small interface.

Implementations:
- the embedded local dev chain (network ``devchain``): a SQLite file, for one-machine runs and tests;
- the Bittensor implementation (finney, test, a local subtensor node, or a ws URL) through the
  ``bittensor`` SDK 11.

Everything else (API, inference server, neurons) talks to :class:`Chain` only.
"""

# The package's names are base's __all__, listed there once.
from quasar.chain.base import *  # noqa: F403
from quasar.chain.base import __all__ as __all__
