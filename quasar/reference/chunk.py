"""The QuasarAttention recurrence in exact chunked (WY) form: fast enough to check a whole 1M sequence.

QuasarAttention is the delta rule with per-token step ``alpha_t`` and scale 1 (docs/rules.md section
6). Over a chunk of C = 64 tokens with keys ``K``, values ``V``, queries ``Q`` (rows are tokens),
``D = diag(alpha)`` and the state ``S`` before the chunk, the per-token "new values"
``V'_t = alpha_t (v_t - S_{t-1}^T k_t)`` satisfy

    V' = D V - D K S - strict_tril(D K K^T) V'
    =>  (I + strict_tril(D K K^T)) V' = D V - D K S
    =>  V' = U - W S    with  [W | U] = (I + strict_tril(D K K^T))^-1 [D K | D V]

and then ``O = Q S + tril_incl(Q K^T) V'`` and ``S <- S + K^T V'``. This is an identity, not an
approximation: ``I + strict_tril(.)`` is unit lower triangular, always invertible, and
``solve_triangular(..., unitriangular=True)`` is forward substitution, i.e. the token-by-token
recurrence inside the chunk carried out for all chunks at once. The result differs from
``naive_quasar`` by rounding only (about 1e-15 relative in float64).

The chunk-to-chunk map ``S <- (I - K^T W) S + K^T U`` is affine in ``S``; its matrices are
computed for many chunks at once, and the states before every chunk come from a scan of those
maps in log2(chunks) batched products (``_states_after_chunks``). Intra-chunk work runs over
blocks of chunks, which bounds memory at any length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from quasar.reference.naive import check_quasar_inputs, compute_dtype_for, quasar_alpha

CHUNK_SIZE = 64

# (chunk, batch*head) pairs handled per block: about 16 KiB of fp32 per pair and intermediate,
# so a block holds roughly 2 GiB of intermediates on a GPU and 0.5 GiB on a CPU.
CHUNK_HEADS_PER_BLOCK_CUDA = 16384
CHUNK_HEADS_PER_BLOCK_CPU = 4096


@contextlib.contextmanager
def float32_matmul_precision(precision: str = "highest") -> Iterator[None]:
    """Run float32 matrix products at ``precision`` inside the ``with`` ("highest": full float32,
    no TF32 or bf16 passes); restored on exit (the setting is process-wide).

    Set explicitly, "highest" also overrules ``torch.set_float32_matmul_precision("high")``
    elsewhere in the process (a benchmark harness, say) and TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1,
    which NVIDIA's PyTorch containers set: on an H100 it made a tiny Qwen2's float32 logits differ
    from the CPU's by 0.11 (benchmarks/RESULTS.md), more than the logit check allows.
    """
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(previous)


def _to_chunks(x: torch.Tensor, start: int, stop: int, n_chunks: int, dtype: torch.dtype) -> torch.Tensor:
    """Tokens ``[start, stop)`` of ``x [B, T, H, D]`` as ``[n_chunks, B*H, C, D]``, zero-padded at the end."""
    batch, _, heads, dim = x.shape
    segment = x[:, start:stop].to(dtype)
    missing = n_chunks * CHUNK_SIZE - (stop - start)
    if missing:
        segment = F.pad(segment, (0, 0, 0, 0, 0, missing))
    segment = segment.reshape(batch, n_chunks, CHUNK_SIZE, heads, dim)
    return segment.permute(1, 0, 3, 2, 4).reshape(n_chunks, batch * heads, CHUNK_SIZE, dim)


def _from_chunks(x: torch.Tensor, batch: int, heads: int) -> torch.Tensor:
    """Inverse layout of ``_to_chunks``: ``[n_chunks, B*H, C, D]`` to ``[B, n_chunks*C, H, D]``."""
    n_chunks, _, chunk, dim = x.shape
    x = x.view(n_chunks, batch, heads, chunk, dim).permute(1, 0, 3, 2, 4)
    return x.reshape(batch, n_chunks * chunk, heads, dim)


def _states_after_chunks(transition: torch.Tensor, offset: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """The state after each chunk ``[N, BH, D_k, D_v]``, from each chunk's map ``S -> M_i S + c_i``
    (``transition [N, BH, D_k, D_k]``, ``offset [N, BH, D_k, D_v]``) and the state before the first.

    An inclusive scan of the maps (Hillis-Steele): after the pass of step ``s``, entry ``i`` is the
    composition of the maps of chunks ``i - 2s + 1`` to ``i`` (from the first chunk where that is
    before it), composing ``(M_b, c_b)`` after ``(M_a, c_a)`` as ``(M_b M_a, M_b c_a + c_b)``. So
    log2(N) batched products replace N dependent ones (a 1M-token sequence has 15,625 chunks, whose
    one-by-one loop took 0.6 s of launches on an H100 per forward), with the same result up to
    rounding.
    """
    maps, offsets = transition, offset
    step = 1
    while step < maps.shape[0]:
        offsets = torch.cat([offsets[:step], torch.matmul(maps[step:], offsets[:-step]).add_(offsets[step:])])
        maps = torch.cat([maps[:step], torch.matmul(maps[step:], maps[:-step])])
        step *= 2
    return torch.matmul(maps, state).add_(offsets)


def _run_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor, state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs of a block of chunks and the state after it.

    ``q, k: [N, BH, C, D_k]``, ``v: [N, BH, C, D_v]``, ``beta: [BH]``, ``state: [BH, D_k, D_v]``.
    Zero-padded tokens have ``k = 0``, hence ``alpha = 0`` and zero rows in ``W``, ``U`` and
    ``K^T``: they change neither the state nor any earlier token's output.
    """
    n_chunks, rows, chunk, d_k = k.shape
    d_v = v.shape[-1]
    alpha = quasar_alpha(k, beta[:, None]).reshape(n_chunks * rows, chunk, 1)
    q, k, v = (x.reshape(n_chunks * rows, chunk, x.shape[-1]) for x in (q, k, v))
    k_t = k.transpose(1, 2)
    # strict_tril(D K K^T); with unitriangular=True the solver takes the diagonal as 1 (never read).
    lower = torch.bmm(k, k_t).mul_(alpha).tril_(-1)
    w_u = torch.linalg.solve_triangular(lower, torch.cat([k, v], dim=-1).mul_(alpha), upper=False, unitriangular=True)
    del lower
    w, u = w_u[..., :d_k], w_u[..., d_k:]
    eye = torch.eye(d_k, dtype=k.dtype, device=k.device)
    # S <- (I - K^T W) S + K^T U  is  S <- S + K^T (U - W S), the spec's update.
    transition = torch.baddbmm(eye, k_t, w, alpha=-1).view(n_chunks, rows, d_k, d_k)
    offset = torch.bmm(k_t, u).view(n_chunks, rows, d_k, d_v)
    after = _states_after_chunks(transition, offset, state)
    del transition, offset
    final_state = after[-1].clone()
    starts = torch.cat([state[None], after[:-1]]).reshape(n_chunks * rows, d_k, d_v)
    del after
    v_new = torch.baddbmm(u, w, starts, alpha=-1)  # V' = U - W S
    del w_u, w, u
    o = torch.baddbmm(torch.bmm(q, starts), torch.bmm(q, k_t).tril_(), v_new)  # Q S + tril_incl(Q K^T) V'
    return o.view(n_chunks, rows, chunk, d_v), final_state


@torch.no_grad()
def chunk_quasar_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    *,
    chunks_per_block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QuasarAttention in exact chunked form; same contract as ``naive_quasar``.

    Args:
        q, k: ``[B, T, H, D_k]``; v: ``[B, T, H, D_v]``; any T (a partial last chunk is padded).
        beta: ``[H]``, already softplus'd.
        initial_state: optional ``[B, H, D_k, D_v]`` state before the first token.
        output_final_state: also return the state after the last token.
        chunks_per_block: chunks whose intra-chunk work is done at once (bounds memory); by
            default as many as fit a fixed budget of (chunk, batch*head) pairs.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, T, H, D_v]`` in ``q``'s dtype; ``final_state``
        ``[B, H, D_k, D_v]`` in the compute dtype (float64 for float64 inputs, else float32),
        or ``None`` unless asked for. Forward only (no autograd).
    """
    check_quasar_inputs(q, k, v, beta, initial_state)
    if chunks_per_block is not None and chunks_per_block < 1:
        raise ValueError(f"chunks_per_block: expected a positive integer, got {chunks_per_block}")
    dtype = compute_dtype_for(q.dtype)
    batch, length, heads, d_k = q.shape
    d_v = v.shape[-1]
    if initial_state is None:
        state = torch.zeros(batch * heads, d_k, d_v, dtype=dtype, device=q.device)
    else:
        state = initial_state.to(dtype).reshape(batch * heads, d_k, d_v).clone()
    if chunks_per_block is None:
        budget = CHUNK_HEADS_PER_BLOCK_CUDA if q.device.type == "cuda" else CHUNK_HEADS_PER_BLOCK_CPU
        chunks_per_block = max(1, budget // (batch * heads))
    beta_per_row = beta.to(dtype).repeat(batch)  # row b*H + h of the chunk layout has head h
    o = torch.empty(batch, length, heads, d_v, dtype=q.dtype, device=q.device)
    n_chunks = -(-length // CHUNK_SIZE)
    with float32_matmul_precision():
        for first in range(0, n_chunks, chunks_per_block):
            count = min(chunks_per_block, n_chunks - first)
            start, stop = first * CHUNK_SIZE, min((first + count) * CHUNK_SIZE, length)
            q_c, k_c, v_c = (_to_chunks(x, start, stop, count, dtype) for x in (q, k, v))
            o_c, state = _run_block(q_c, k_c, v_c, beta_per_row, state)
            o[:, start:stop] = _from_chunks(o_c, batch, heads)[:, : stop - start]
    final_state = state.reshape(batch, heads, d_k, d_v) if output_final_state else None
    return o, final_state
