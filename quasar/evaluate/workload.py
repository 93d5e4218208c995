"""What is benchmarked, made the same way on both sides of the sandbox.

The parent (validator) and the sandboxed child build the layer weights, each iteration's input and
the fingerprint basis from seeds with this one module, so the parent can recompute on its own
what an honest fork must have produced. It imports only ``torch`` and the standard library: the
child loads it from the harness's own copy before any fork code runs.

Determinism: weights come from a CPU generator (identical on every machine); inputs and
fingerprint bases come from a generator on the evaluation device, which the parent uses too
(the same device and the same torch build give the same numbers).
"""

from __future__ import annotations

import hashlib
import json
import math

import torch

HIDDEN_SIZE = 512
HEAD_DIM = 64
NUM_HEADS = 8
MODE = "chunk"
# The benchmark layer of QUASAR.md section 4 step 3.
LAYER_KWARGS = {"hidden_size": HIDDEN_SIZE, "head_dim": HEAD_DIM, "num_heads": NUM_HEADS, "mode": MODE}
AUTOCAST_DTYPE = torch.bfloat16

WIDTH = NUM_HEADS * HEAD_DIM
CONV_SIZE = 4
# Parameter names and shapes of QUASAR.md section 6 (1,120,840 parameters).
PARAMETER_SHAPES: dict[str, tuple[int, ...]] = {
    "q_proj.weight": (WIDTH, HIDDEN_SIZE),
    "k_proj.weight": (WIDTH, HIDDEN_SIZE),
    "v_proj.weight": (WIDTH, HIDDEN_SIZE),
    "q_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "k_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "v_conv1d.weight": (WIDTH, 1, CONV_SIZE),
    "beta_log": (NUM_HEADS,),
    "g_proj.0.weight": (HEAD_DIM, HIDDEN_SIZE),
    "g_proj.1.weight": (WIDTH, HEAD_DIM),
    "g_proj.1.bias": (WIDTH,),
    "o_norm.weight": (HEAD_DIM,),
    "o_proj.weight": (HIDDEN_SIZE, WIDTH),
}

# The output is checked on each eighth of the sequence separately (QUASAR.md section 4 step 4).
SEGMENTS = 8
# Random +-1 directions per segment in a fingerprint; see ``fingerprint``.
FINGERPRINT_DIRECTIONS = 16


def make_weights(seed: int) -> dict[str, torch.Tensor]:
    """The layer's parameters for ``seed``: float32 CPU tensors keyed by fla's parameter names.

    Distributions follow PyTorch's default initialisation (uniform ±1/sqrt(fan_in)), with
    ``beta_log = log U(1, 16)`` as fla initialises it and a norm weight and gate bias away from
    their trivial values, so every parameter influences the output.
    """
    generator = torch.Generator(device="cpu").manual_seed(seed)

    def uniform(shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        return torch.empty(shape).uniform_(low, high, generator=generator)

    weights: dict[str, torch.Tensor] = {}
    for name, shape in PARAMETER_SHAPES.items():
        if name == "beta_log":
            weights[name] = uniform(shape, 1.0, 16.0).log()
        elif name == "o_norm.weight":
            weights[name] = uniform(shape, 0.5, 1.5)
        elif name == "g_proj.1.bias":
            weights[name] = uniform(shape, -1.0, 1.0)
        else:
            fan_in = math.prod(shape[1:])
            bound = 1.0 / math.sqrt(fan_in)
            weights[name] = uniform(shape, -bound, bound)
    return weights


def _device_generator(seed: int, device: torch.device | str) -> torch.Generator:
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def make_input(seed: int, seq_len: int, device: torch.device | str) -> torch.Tensor:
    """The input ``torch.randn(1, seq_len, 512)`` (float32) for ``seed``, made on ``device``."""
    generator = _device_generator(seed, device)
    return torch.randn(1, seq_len, HIDDEN_SIZE, generator=generator, device=device, dtype=torch.float32)


def chained_seeds(input_seed: int, basis_seed: int, index: int, previous: list | None) -> tuple[int, int]:
    """The input and basis seeds of forward ``index`` of a request with seeds ``(input_seed, basis_seed)``.

    Forward 0 uses the request's seeds; forward ``i > 0`` uses seeds hashed from them, ``i`` and the
    fingerprint reported for forward ``i - 1`` (``previous``, as sent on the pipe), so its input
    exists only once that forward's output does: the forwards of a request run one after another
    and cannot be batched together. The parent rebuilds every seed from the reported fingerprints.
    """
    if index == 0:
        return input_seed, basis_seed
    text = json.dumps([input_seed, basis_seed, index, previous], separators=(",", ":"))
    digest = hashlib.sha256(text.encode()).digest()
    mask = (1 << 63) - 1
    return int.from_bytes(digest[:8], "big") & mask, int.from_bytes(digest[8:16], "big") & mask


def segment_bounds(seq_len: int, segments: int = SEGMENTS) -> list[tuple[int, int]]:
    """``segments`` contiguous, nearly equal ``[start, stop)`` token ranges covering the sequence."""
    cuts = [(i * seq_len) // segments for i in range(segments + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(segments)]


def make_basis(seed: int, seq_len: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """The fingerprint basis for ``seed``: ±1 matrix ``R [512, K]`` and ±1 token weights ``w [T]``."""
    generator = _device_generator(seed, device)
    directions = torch.randint(0, 2, (HIDDEN_SIZE, FINGERPRINT_DIRECTIONS), generator=generator, device=device)
    token_signs = torch.randint(0, 2, (seq_len,), generator=generator, device=device)
    return (directions * 2 - 1).to(torch.float32), (token_signs * 2 - 1).to(torch.float32)


def fingerprint(output: torch.Tensor, basis: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Random projections of a layer output ``[1, T, 512]``, one row of ``K`` values per eighth.

    Row ``e``, column ``j`` is ``sum over tokens t in eighth e of w_t * <out_t, R_j>``: a projection
    of the eighth onto a random ±1 pattern, so for any error ``E`` the mean square of the
    projections of ``E`` over the ``K`` columns estimates ``||E_e||²`` (pairwise-independent
    signs). One matrix product reads the output once in its own dtype (float32 accumulation);
    a NaN or infinity anywhere in an eighth makes that row non-finite. Returns float32 ``[8, K]``.
    """
    directions, token_signs = basis
    flat = output.reshape(-1, output.shape[-1])
    projected = (flat @ directions.to(flat.dtype)).to(torch.float32)
    rows = [token_signs[start:stop] @ projected[start:stop] for start, stop in segment_bounds(flat.shape[0])]
    return torch.stack(rows)


def segment_norms(output: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of each eighth of an output ``[1, T, 512]``, float32 ``[8]``."""
    flat = output.reshape(-1, output.shape[-1])
    return torch.stack(
        [torch.linalg.vector_norm(flat[start:stop], dtype=torch.float32) for start, stop in segment_bounds(flat.shape[0])]
    )
