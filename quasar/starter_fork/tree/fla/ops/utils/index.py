"""Chunk bookkeeping for variable-length batches (``cu_seqlens``)."""

from __future__ import annotations

import torch


def prepare_lens(cu_seqlens: torch.Tensor) -> torch.Tensor:
    """Length of each sequence of a ``cu_seqlens`` offsets tensor ``[N + 1]``."""
    return cu_seqlens[1:] - cu_seqlens[:-1]


def prepare_chunk_indices(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """One row ``(sequence index, chunk index inside that sequence)`` per chunk, in order.

    Chunks never cross a sequence boundary: a sequence of length L has ceil(L / chunk_size)
    chunks, the last one possibly short. Returns an int32 tensor ``[NT, 2]`` on the device
    of ``cu_seqlens``.
    """
    chunks_per_sequence = (prepare_lens(cu_seqlens) + chunk_size - 1) // chunk_size
    total = int(chunks_per_sequence.sum())
    sequence = torch.repeat_interleave(torch.arange(len(chunks_per_sequence), device=cu_seqlens.device), chunks_per_sequence)
    first_chunk = torch.cumsum(chunks_per_sequence, 0) - chunks_per_sequence
    chunk = torch.arange(total, device=cu_seqlens.device) - first_chunk[sequence]
    return torch.stack([sequence, chunk], 1).to(torch.int32)


def prepare_chunk_offsets(cu_seqlens: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Index of each sequence's first chunk in the global chunk order, plus the total: int32 ``[N + 1]``."""
    chunks_per_sequence = (prepare_lens(cu_seqlens) + chunk_size - 1) // chunk_size
    zero = chunks_per_sequence.new_zeros(1)
    return torch.cat([zero, torch.cumsum(chunks_per_sequence, 0)]).to(torch.int32)
