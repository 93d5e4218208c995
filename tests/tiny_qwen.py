"""A tiny Qwen2 causal LM with random weights, saved like a real checkpoint (no tokenizer).

Shared by the logit and inference-server tests: the saved folder is loaded by the same code that
loads ``Qwen/Qwen2.5-0.5B-Instruct``. Imports only torch and transformers, so GPU tests can use
it on a bare CUDA machine.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

TINY_VOCAB = 512
# Like Qwen2.5, the special tokens sit after the ordinary vocabulary: ids 0..509 are ordinary.
TINY_BOS, TINY_EOS = 510, 511
# Weights drawn with std 0.3 give logits of std ~2.5 and max ~7, the scale of a real model's,
# so the absolute-difference threshold means here what it means for Qwen2.5.
TINY_INIT_STD = 0.3


def make_tiny_qwen2(path: str | Path, seed: int) -> Path:
    """Build a tiny Qwen2 (hidden 64, 2 layers, 4 heads, 2 KV heads) from ``seed``; save it to ``path``."""
    config = Qwen2Config(
        vocab_size=TINY_VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=128, max_position_embeddings=1024,
        bos_token_id=TINY_BOS, eos_token_id=TINY_EOS, tie_word_embeddings=False,
        initializer_range=TINY_INIT_STD,
    )
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    finally:
        torch.random.set_rng_state(generator_state)
    path = Path(path)
    model.save_pretrained(path)
    return path
