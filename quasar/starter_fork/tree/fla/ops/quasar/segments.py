"""Where each program of the chunked kernels works: spans of tokens inside one sequence.

The kernels run one program per (span, head), a span being one chunk (the WY pass) or one
segment of chunks (the scan passes). Sequences of equal length (no ``cu_seqlens``) need no table:
span ``i`` is span ``i % per_sequence`` of sequence ``i // per_sequence``, so no index tensors are
built on the host for them. Packed sequences (``cu_seqlens``) use fla's index tables: one row
(sequence, span inside it) per span, and each sequence's first span.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fla.ops.utils.index import prepare_chunk_indices
from fla.ops.utils.index import prepare_chunk_offsets


@triton.jit
def span_of(i_s, cu_seqlens, span_indices, seq_len, per_sequence, SPAN: tl.constexpr, IS_VARLEN: tl.constexpr):
    """Span ``i_s``: its sequence's first row in the packed tensor, that sequence's length and the
    span's first token inside it."""
    if IS_VARLEN:
        i_n = tl.load(span_indices + i_s * 2)
        i_g = tl.load(span_indices + i_s * 2 + 1)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        T = (tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos).to(tl.int32)
    else:
        i_n = i_s // per_sequence
        i_g = i_s % per_sequence
        bos = i_n.to(tl.int64) * seq_len
        T = seq_len
    return bos, T, i_g * SPAN


@triton.jit
def spans_of_sequence(i_n, span_offsets, per_sequence, IS_VARLEN: tl.constexpr):
    """The first span of sequence ``i_n`` and the one after its last."""
    if IS_VARLEN:
        first = tl.load(span_offsets + i_n).to(tl.int64)
        last = tl.load(span_offsets + i_n + 1).to(tl.int64)
    else:
        first = i_n.to(tl.int64) * per_sequence
        last = first + per_sequence
    return first, last


class Spans:
    """The spans of ``span`` tokens of a batch of ``batch`` sequences of ``length`` tokens (or of the
    packed sequences of ``cu_seqlens``): their count, and the tables or the sizes the kernels take."""

    def __init__(self, cu_seqlens: torch.Tensor | None, batch: int, length: int, span: int):
        self.is_varlen = cu_seqlens is not None
        if self.is_varlen:
            self.indices = prepare_chunk_indices(cu_seqlens, span)
            self.offsets = prepare_chunk_offsets(cu_seqlens, span)
            self.per_sequence = self.seq_len = 0
            self.count = self.indices.shape[0]
        else:
            self.indices = self.offsets = None
            self.per_sequence = triton.cdiv(length, span)
            self.seq_len = length
            self.count = batch * self.per_sequence
