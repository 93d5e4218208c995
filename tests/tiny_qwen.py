"""The tests' tiny Qwen2 causal LM: the local network's stand-in reference model
(quasar/localnet/model.py), built from the seed a test picks and saved like a real checkpoint.

Shared by the logit, inference-server and validator tests: the saved folder is loaded by the same
code that loads ``Qwen/Qwen2.5-0.5B-Instruct``. Ids below ``TINY_BOS`` are ordinary tokens.
"""

from quasar.localnet.model import BOS_ID as TINY_BOS
from quasar.localnet.model import VOCAB as TINY_VOCAB
from quasar.localnet.model import write_stand_in_model as make_tiny_qwen2

__all__ = ["TINY_BOS", "TINY_VOCAB", "make_tiny_qwen2"]
