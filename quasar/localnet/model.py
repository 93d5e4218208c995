"""The local network's stand-in reference model: a tiny Qwen2 with random weights.

The real reference model (``REFERENCE_MODEL``'s default) needs a download; a machine that has
never fetched it (or has no internet) still runs the whole local network with this model in
its place. It is a real ``Qwen2ForCausalLM`` saved with ``save_pretrained``, so the miners'
inference servers and the validator's logit check load it through the same code path as the
real one; only its size (and so its meaning) differs. Its weights come from a fixed seed, so the
miners' copies and the validator's are the same model. The tests build it from other seeds too
(tests/tiny_qwen.py): two seeds give two models whose logits differ.
"""

from __future__ import annotations

import logging
from pathlib import Path

from quasar.log import library_progress_bars

logger = logging.getLogger(__name__)

STAND_IN_SEED = 20250101
STAND_IN_NAME = "tiny random Qwen2 (local network stand-in)"
# Ids 0..VOCAB-3 are ordinary tokens; the last two are BOS/EOS, as Qwen2.5 keeps its special
# tokens after the ordinary vocabulary (the validator draws challenges from ordinary ids only).
VOCAB = 512
BOS_ID, EOS_ID = VOCAB - 2, VOCAB - 1
# Weights of std 0.3 give logits of about the scale of a real model's, so the logit check's
# absolute threshold (LOGITS_MAX_ABS_DIFF) means roughly what it means for Qwen2.5.
INIT_STD = 0.3


def write_stand_in_model(path: str | Path, seed: int = STAND_IN_SEED) -> Path:
    """Build the stand-in model (hidden 64, 2 layers, 4 heads, 2 KV heads, no tokenizer) from
    ``seed`` and save it into ``path`` (created); returns ``path``. The same seed gives the same weights."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        tie_word_embeddings=False,
        initializer_range=INIT_STD,
    )
    # A private generator state: building the model must not move the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    with library_progress_bars(shown=False):  # the local network shows its own
        model.save_pretrained(Path(path))
    logger.info("wrote the stand-in reference model (%s, seed %d) to %s", STAND_IN_NAME, seed, path)
    return Path(path)


def hub_model_cached(name: str) -> bool:
    """True when the Hugging Face model ``name`` is complete in the local cache (no network used)."""
    from quasar.hub_model import find_cached

    cached = find_cached(name)
    return cached is not None and not cached[1]
