"""The kernels' tunables, read from ``tuning.json`` beside this file.

The contract (what a tuner such as the miner's ``step2_kernel_tuning.py`` may write), every key
optional, defaults in :data:`DEFAULTS`:

``segment_chunks``    chunks of 64 tokens per segment of the two-level scan (power of two, 1..256):
                      more means fewer segment programs and a shorter sequential combine.
``wy_warps``          num_warps of the WY kernel (pass 0: W and U of every chunk).
``wy_inverse``        how the WY kernel inverts a chunk's 16-row diagonal blocks: "substitution"
                      (15 dependent row steps) or "product" ((I - L)(I + L^2)(I + L^4)(I + L^8),
                      six tensor-core dots).
``wy_maxnreg``        registers per thread the WY kernel may use: 0 (the compiler's choice) or a
                      cap at which an SM (65,536 registers) holds one more of its programs at 1,
                      2 or 4 warps; fewer registers, more programs per SM, some spills.
``segment_warps``     num_warps of the segment kernel (pass 1: segment-local state and transition).
``split_transition``  pass 1 computes a segment's state and its transition in two programs
                      (true/false): twice the programs, half the sequential work each.
``output_warps``      num_warps of the output kernel (pass 3: states and outputs).
``num_stages``        software-pipelining depth of passes 1 and 3 (1..4).
``combine_block_v``   value columns per program of the sequential combine (pass 2): 16, 32 or 64.
``combine_warps``     num_warps of the combine kernel.
``precision``         tensor-core operands for bf16 inputs: "bf16" (fast) or "tf32" (closer).
``fused_conv``        "q": the core's output pass convolves q (+ SiLU) itself as it loads it from
                      the input projections, and the conv kernel writes only k and v; "": the conv
                      kernel writes all three.
``fused_conv_min_tokens`` the layer's tiles shorter than this keep the conv kernel for q: their
                      output pass has too few programs to hide the extra loads (0: every tile).
``layer_tile_tokens`` the layer runs its projections, convolutions and core this many tokens at
                      a time (multiple of 64), carrying the states; bounds peak memory.
``devices``           tunings for particular chips: an object mapping a fragment of a CUDA
                      device's name (``"H200"``, found case-insensitively in
                      ``torch.cuda.get_device_name()``) to an object of the keys above, which
                      apply over the file's own on that chip (the first fragment that matches).

Unknown keys or bad values raise ValueError naming the key, so a typo never goes unnoticed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

TUNING_FILE = Path(__file__).with_name("tuning.json")


@dataclasses.dataclass(frozen=True)
class QuasarTuning:
    """One set of tunables (see the module docstring for each field)."""

    segment_chunks: int = 32
    wy_warps: int = 2
    wy_inverse: str = "product"
    wy_maxnreg: int = 168
    segment_warps: int = 4
    split_transition: bool = False
    output_warps: int = 4
    num_stages: int = 2
    combine_block_v: int = 16
    combine_warps: int = 4
    precision: str = "bf16"
    fused_conv: str = "q"
    fused_conv_min_tokens: int = 65_536
    layer_tile_tokens: int = 65_536


DEFAULTS = QuasarTuning()

_ALLOWED = {
    "segment_chunks": {1, 2, 4, 8, 16, 32, 64, 128, 256},
    "wy_warps": {1, 2, 4, 8, 16},
    "wy_inverse": {"substitution", "product"},
    "wy_maxnreg": {0, 128, 136, 144, 152, 168, 184, 200, 224},
    "segment_warps": {1, 2, 4, 8, 16},
    "split_transition": {True, False},
    "output_warps": {1, 2, 4, 8, 16},
    "num_stages": {1, 2, 3, 4},
    "combine_block_v": {16, 32, 64},
    "combine_warps": {1, 2, 4, 8},
    "precision": {"bf16", "tf32"},
    "fused_conv": {"", "q"},
    "fused_conv_min_tokens": {0, 4096, 16384, 32768, 65536, 131072},
}


def _check_tunables(values: object, source: str) -> dict:
    """``values`` if it is an object of known tunables with allowed values; else ValueError."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: expected a JSON object of tunables, got {type(values).__name__}")
    fields = {f.name for f in dataclasses.fields(QuasarTuning)}
    for key, value in values.items():
        if key not in fields:
            raise ValueError(f"{source}: unknown tunable {key!r} (known: {', '.join(sorted(fields))})")
        if key == "layer_tile_tokens":
            if not isinstance(value, int) or isinstance(value, bool) or value < 64 or value % 64:
                raise ValueError(f"{source}: layer_tile_tokens must be a positive multiple of 64; got {value!r}")
        elif value not in _ALLOWED[key] or isinstance(value, bool) != (key == "split_transition"):
            raise ValueError(f"{source}: {key} must be one of {sorted(_ALLOWED[key])}; got {value!r}")
    return values


def parse_tuning(values: dict, source: str = "tuning", device: str | None = None) -> QuasarTuning:
    """A :class:`QuasarTuning` from a dict, for the CUDA device named ``device`` (its ``devices``
    entry, if one matches, over the rest); ValueError names the bad key and its value."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: expected a JSON object of tunables, got {type(values).__name__}")
    chips = values.get("devices", {})
    tunables = _check_tunables({key: value for key, value in values.items() if key != "devices"}, source)
    if not isinstance(chips, dict):
        raise ValueError(f"{source}: devices must map device-name fragments to tunables; got {chips!r}")
    chosen: dict = {}
    for fragment, overrides in chips.items():
        if not fragment.strip():
            raise ValueError(f"{source}: devices has an empty device-name fragment")
        _check_tunables(overrides, f"{source}: devices[{fragment!r}]")
        if not chosen and device is not None and fragment.lower() in device.lower():
            chosen = overrides
    return dataclasses.replace(DEFAULTS, **{**tunables, **chosen})


def device_name_of(tensor) -> str | None:
    """The name of the CUDA device ``tensor`` is on (what ``devices`` matches), None off CUDA."""
    if tensor.device.type != "cuda":
        return None
    import torch

    return torch.cuda.get_device_name(tensor.device)


@functools.cache
def load_tuning(path: str | None = None, device: str | None = None) -> QuasarTuning:
    """The tunables of ``path`` (default ``tuning.json`` beside this file; defaults if absent) for
    the CUDA device named ``device`` (:func:`device_name_of`; None: the file's own)."""
    file = Path(path) if path is not None else TUNING_FILE
    if not file.exists():
        return DEFAULTS
    try:
        values = json.loads(file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{file}: not valid JSON ({error})") from None
    return parse_tuning(values, str(file), device)
