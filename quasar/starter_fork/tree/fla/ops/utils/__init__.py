"""Index helpers shared by the ops."""

from fla.ops.utils.index import prepare_chunk_indices, prepare_chunk_offsets, prepare_lens

__all__ = ["prepare_chunk_indices", "prepare_chunk_offsets", "prepare_lens"]
