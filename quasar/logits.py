"""Logit verification (docs/rules.md §4 step 6): the reference model, challenges and the comparison.

A validator draws a :class:`Challenge` (random token-id prompt, generation length, decode step),
a miner's inference server runs greedy decoding with the KV cache and returns its tokens and the
full-vocabulary logits at that step, and the validator checks them with :func:`verify_generation`
against its own run of the same model. Step 1 is the logits right after the prompt (the ones the
first generated token is chosen from); step k the logits the k-th token is chosen from.

The validator scores the miner's logits on the miner's own token path (one teacher-forced forward
pass over prompt + returned tokens) and checks that every returned token is a greedy choice of the
reference within the tolerance that the logit thresholds allow. So an honest miner whose hardware
rounds a near-tie the other way is not failed, while a miner must still run the model: the logits
at step k depend on every earlier token.

This module needs only torch and transformers (no bittensor, no web server), so the GPU checks
can import it on a bare CUDA machine.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import math
import os
import random
import secrets
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from quasar.config import OPTIONS_BY_KEY, REFERENCE_MODEL_ID
from quasar.errors import QuasarError
from quasar.evaluate.gpus import missing_gpu_here
from quasar.hub_model import ModelLoadError, download, find_cached, first_line, hub_cache, hub_reachable
from quasar.log import library_progress_bars
from quasar.reference.chunk import float32_matmul_precision

log = logging.getLogger(__name__)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}

# Challenges use at least this many prompt tokens: a few tokens of context give a logit vector
# that depends on every layer, and any length works for the protocol.
CHALLENGE_MIN_PROMPT_LEN = 8


class ChallengeError(QuasarError, ValueError):
    """A generation request is out of range for the model (empty prompt, bad id, bad step...)."""


@dataclass(frozen=True)
class TokenRange:
    """The ordinary token ids: ``[0, end)`` without ``excluded`` (special ids inside the range)."""

    end: int
    excluded: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"token range [0, {self.end}) without {sorted(self.excluded)} is empty")

    @property
    def size(self) -> int:
        return self.end - len([i for i in self.excluded if 0 <= i < self.end])

    def __contains__(self, token_id: object) -> bool:
        return isinstance(token_id, int) and 0 <= token_id < self.end and token_id not in self.excluded

    def draw(self, rng: random.Random) -> int:
        """One id, uniform over the range (rejection sampling: ``excluded`` is a handful of ids)."""
        while True:
            token_id = rng.randrange(self.end)
            if token_id not in self.excluded:
                return token_id


def _config_special_ids(*configs) -> set[int]:
    ids: set[int] = set()
    for config in configs:
        if config is None:
            continue
        for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
            value = getattr(config, name, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            ids.update(v for v in values if isinstance(v, int) and v >= 0)
    return ids


def ordinary_token_range(special_ids: Iterable[int], embedding_rows: int) -> TokenRange:
    """The ids a challenge prompt may use, from the model's special ids and embedding size.

    Models that append their special tokens after the base vocabulary (Qwen2.5: ``<|endoftext|>``
    is 151643, the embedding has 151936 rows of which 151665 and up are unused padding) end the
    ordinary range at the first special id in the upper half of the table; special ids placed at
    the bottom (Llama 2: bos 1, eos 2) are excluded one by one. For Qwen2.5 this gives exactly
    the tokenizer's 151,643 base tokens, without needing the tokenizer.
    """
    specials = {i for i in special_ids if 0 <= i < embedding_rows}
    upper = [i for i in specials if i >= embedding_rows // 2]
    end = min(upper) if upper else embedding_rows
    return TokenRange(end, frozenset(i for i in specials if i < end))


@dataclass(frozen=True)
class Generation:
    """What one greedy run returns: the generated ids and the float32 logits at the asked step."""

    tokens: tuple[int, ...]
    logits: torch.Tensor


@dataclass
class ReferenceModel:
    """A causal LM in eval mode without gradients, with what requests are checked against."""

    name: str
    module: torch.nn.Module
    device: torch.device
    dtype: torch.dtype
    vocab_size: int
    ordinary_tokens: TokenRange
    max_positions: int | None
    # Float32 matrix products at this precision whatever the process or its environment set
    # (quasar/reference/chunk.py: float32_matmul_precision); "high" lets a test measure TF32.
    matmul_precision: str = "highest"

    @property
    def dtype_name(self) -> str:
        return next(name for name, value in DTYPES.items() if value == self.dtype)

    @functools.cached_property
    def cache_keyword(self) -> str:
        """The name under which this model's forward takes the KV cache and its output returns it."""
        return cache_keyword(self.module.forward)

    def generate(self, prompt_ids: Sequence[int], gen_len: int, logits_at_step: int) -> Generation:
        """Greedy decoding with the KV cache; see :func:`generate_with_logits`."""
        return generate_with_logits(self, prompt_ids, gen_len, logits_at_step)

    @contextlib.contextmanager
    def forwards(self) -> Iterator[None]:
        """Where this model's forwards run: without gradients, at its float32 matmul precision."""
        with torch.inference_mode(), float32_matmul_precision(self.matmul_precision):
            yield


def cache_keyword(forward: Callable[..., Any]) -> str:
    """``cache`` where the model's forward has that parameter, else ``past_key_values``.

    transformers 5.24 renamed the KV cache from ``past_key_values`` to ``cache`` (in forward's
    arguments and in its output) and warns on the old name, which it drops in 5.40; 4.x knows only
    the old one. The suite supports both (pyproject.toml: ``transformers>=4.56,<6``).
    """
    return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"


def offline_mode(environ=None) -> bool:
    """True when ``HF_HUB_OFFLINE`` or ``TRANSFORMERS_OFFLINE`` asks for the local cache only."""
    environ = os.environ if environ is None else environ
    return any(
        environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def _looks_like_path(name: str) -> bool:
    """Hub ids are ``name`` or ``owner/name``; anything else with a slash is meant as a folder."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"bfloat16"``/``"float16"`` (or the torch dtype itself) as a torch dtype."""
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; expected one of {', '.join(DTYPES)}")
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _hub_snapshot(name: str) -> Path:
    """The cache folder holding every file of hub model ``name``: the cached snapshot when whole,
    else downloaded (refused at once in offline mode, or when the hub cannot be reached at all)."""
    cached = find_cached(name)
    if cached is not None and not cached[1]:
        return cached[0]
    if cached is not None:
        state = f"its cached copy {cached[0]} lacks {', '.join(cached[1])} (a download cut off)"
    else:
        state = f"it is not in the local Hugging Face cache {hub_cache()}"
    fetch = (
        f"Download it with `hf download {name}` on a machine with internet, or point REFERENCE_MODEL "
        "at a local folder holding config.json and the weights."
    )
    if offline_mode():
        raise ModelLoadError(f"cannot load reference model {name!r}: {state} and offline mode is on. {fetch}")
    # A download against a closed network retries for half a minute, a screen of warnings, before failing.
    reachable, target = hub_reachable()
    if not reachable:
        raise ModelLoadError(f"cannot load reference model {name!r}: {state} and {target} cannot be reached. {fetch}")
    log.info("reference model %s: %s; downloading it from %s", name, state, target)
    return download(name)


def check_reference_settings(name_or_path: str, device: str | torch.device = "cpu") -> Path | None:
    """What :func:`load_reference_model` refuses before it reads a file or reaches a network: a
    device this host lacks, and a local folder that does not exist or has no config.json. Returns
    that folder (None for a hub id). Raises :class:`ModelLoadError`. A start calls it before it
    reaches the chain, so that a local mistake is said at once, not after the chain's tries."""
    no_gpu = missing_gpu_here(str(torch.device(device)))
    if no_gpu is not None:
        raise ModelLoadError(f"DEVICE is {device} but {no_gpu}; set DEVICE=cpu or fix the driver")
    local = Path(name_or_path).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise ModelLoadError(
                f"reference model folder {local} has no config.json; "
                "point REFERENCE_MODEL at a folder saved with save_pretrained"
            )
        return local
    if _looks_like_path(name_or_path):
        raise ModelLoadError(
            f"reference model folder {local} does not exist; "
            "point REFERENCE_MODEL at a local folder or a Hugging Face model id"
        )
    return None


def load_reference_model(
    name_or_path: str,
    device: str | torch.device = "cpu",
    dtype: str | torch.dtype = OPTIONS_BY_KEY["reference_dtype"].default,
) -> ReferenceModel:
    """Load a causal LM (a Hugging Face id or a local folder) on ``device`` in ``dtype``.

    A hub id is read from its snapshot in the local Hugging Face cache when that holds every file,
    else downloaded into it (quasar/hub_model.py), never when ``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``
    is set. Raises :class:`ModelLoadError` naming the model and the fix.
    Remote code is never trusted: the architecture must be one transformers ships.
    """
    from safetensors import SafetensorError  # heavy imports, only where a model is loaded
    from transformers import AutoModelForCausalLM

    torch_dtype = resolve_dtype(dtype)
    torch_device = torch.device(device)
    local = check_reference_settings(name_or_path, torch_device)
    source = str(local if local is not None else _hub_snapshot(name_or_path))
    try:
        # transformers' annotations of the model's methods (to, get_*_embeddings) are looser than it.
        with library_progress_bars(shown=sys.stderr.isatty()):
            module: Any = AutoModelForCausalLM.from_pretrained(
                source, dtype=torch_dtype, local_files_only=True, trust_remote_code=False
            )
    except (OSError, ValueError, SafetensorError) as error:
        # A weights file cut short (a copy or a write interrupted) is a SafetensorError.
        reason = first_line(error)
        if local is not None:
            where, fix = "its folder", "The folder must hold config.json and the weights written by save_pretrained."
        else:
            where = f"the Hugging Face cache ({source})"
            repo = Path(source).parents[1]  # models--OWNER--NAME, above snapshots/COMMIT
            fix = f"A file of the cached copy is damaged: remove {repo} and start again to download it."
        raise ModelLoadError(f"cannot load reference model {name_or_path!r} from {where}: {reason}. {fix}") from None
    module.to(torch_device).eval().requires_grad_(False)
    rows = module.get_input_embeddings().num_embeddings
    vocab_size = module.get_output_embeddings().out_features
    if rows != vocab_size:
        raise ModelLoadError(
            f"reference model {name_or_path!r} has {rows} input embedding rows but "
            f"{vocab_size} output logits; only models with one vocabulary are supported"
        )
    specials = _config_special_ids(module.config, getattr(module, "generation_config", None))
    ordinary = ordinary_token_range(specials, rows)
    max_positions = getattr(module.config, "max_position_embeddings", None)
    log.info(
        "reference model %s loaded on %s in %s (vocabulary %d, ordinary ids %d)",
        name_or_path,
        torch_device,
        torch_dtype,
        vocab_size,
        ordinary.size,
    )
    return ReferenceModel(
        name=name_or_path,
        module=module,
        device=torch_device,
        dtype=torch_dtype,
        vocab_size=vocab_size,
        ordinary_tokens=ordinary,
        max_positions=max_positions if isinstance(max_positions, int) else None,
    )


# The reference model's shape (its config.json): what a validator checks against and a miner serves
# on a public network.
REFERENCE_SHAPE: dict[str, object] = {
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
}


def check_reference_shape(model: ReferenceModel, network: str) -> None:
    """Refuse, for a public ``network``, a model whose architecture or vocabulary is not the
    reference's (:data:`REFERENCE_SHAPE`): every logit check against the validators' model would
    fail. Raises :class:`ModelLoadError` listing each difference."""
    config = model.module.config
    found = {key: getattr(config, key, None) for key in REFERENCE_SHAPE}
    found["vocab_size"] = model.vocab_size  # the logits' width, what a check compares
    differences = [
        f"{key} {found[key]} (the reference's {value})" for key, value in REFERENCE_SHAPE.items() if found[key] != value
    ]
    if differences:
        raise ModelLoadError(
            f"reference model {model.name!r} is not {REFERENCE_MODEL_ID}'s architecture: {', '.join(differences)}. "
            f"Every logit check on {network} is against {REFERENCE_MODEL_ID}, so each would fail: set "
            f"REFERENCE_MODEL to {REFERENCE_MODEL_ID} or a folder holding it."
        )


def check_request(
    prompt_ids: Sequence[int],
    gen_len: int,
    logits_at_step: int,
    vocab_size: int,
    max_positions: int | None = None,
) -> None:
    """Raise :class:`ChallengeError` naming the field when a request cannot be run on the model."""
    if len(prompt_ids) == 0:
        raise ChallengeError("prompt: must hold at least one token id")
    for index, token_id in enumerate(prompt_ids):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise ChallengeError(f"prompt[{index}]: token id {token_id!r} is outside the vocabulary [0, {vocab_size})")
    if gen_len < 1:
        raise ChallengeError(f"gen_len: must be at least 1, got {gen_len}")
    if not 1 <= logits_at_step <= gen_len:
        raise ChallengeError(f"logits_at_step: must be between 1 and gen_len ({gen_len}), got {logits_at_step}")
    if max_positions is not None and len(prompt_ids) + gen_len > max_positions:
        raise ChallengeError(
            f"prompt length {len(prompt_ids)} + gen_len {gen_len} exceeds the model's "
            f"context of {max_positions} positions"
        )


def _ids(token_ids: Sequence[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([list(token_ids)], dtype=torch.long, device=device)


def generate_with_logits(
    model: ReferenceModel, prompt_ids: Sequence[int], gen_len: int, logits_at_step: int
) -> Generation:
    """Greedy-decode ``gen_len`` tokens with the KV cache; return them and the step's logits.

    Exactly ``gen_len`` tokens are generated (no stop at end-of-text), so every run of one
    request does the same work. The logits are the full vocabulary, as float32 on the CPU.
    """
    check_request(prompt_ids, gen_len, logits_at_step, model.vocab_size, model.max_positions)
    tokens: list[int] = []
    captured: torch.Tensor | None = None
    with model.forwards():
        output = model.module(input_ids=_ids(prompt_ids, model.device), use_cache=True, logits_to_keep=1)
        cache = model.cache_keyword
        for step in range(1, gen_len + 1):
            step_logits = output.logits[0, -1]
            if step == logits_at_step:
                captured = step_logits.float().cpu()
            tokens.append(int(torch.argmax(step_logits)))
            if step < gen_len:
                cached = {cache: getattr(output, cache)}
                output = model.module(input_ids=_ids(tokens[-1:], model.device), use_cache=True, **cached)
    assert captured is not None  # check_request guarantees 1 <= logits_at_step <= gen_len
    return Generation(tuple(tokens), captured)


def generate_without_cache(
    model: ReferenceModel, prompt_ids: Sequence[int], gen_len: int, logits_at_step: int
) -> Generation:
    """The slow, obviously-correct twin of :func:`generate_with_logits`: a full forward per step."""
    check_request(prompt_ids, gen_len, logits_at_step, model.vocab_size, model.max_positions)
    sequence = list(prompt_ids)
    captured: torch.Tensor | None = None
    with model.forwards():
        for step in range(1, gen_len + 1):
            step_logits = model.module(input_ids=_ids(sequence, model.device), use_cache=False).logits[0, -1]
            if step == logits_at_step:
                captured = step_logits.float().cpu()
            sequence.append(int(torch.argmax(step_logits)))
    assert captured is not None
    return Generation(tuple(sequence[len(prompt_ids) :]), captured)


def path_logits(model: ReferenceModel, prompt_ids: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
    """Logits at steps 1..len(tokens) along a given token path, in one teacher-forced pass.

    Row ``k - 1`` holds the logits that the k-th token of ``tokens`` would be chosen from.
    Returns float32 on the CPU, shape ``[len(tokens), vocab]``.
    """
    check_request(prompt_ids, max(len(tokens), 1), 1, model.vocab_size, model.max_positions)
    if not tokens:
        raise ChallengeError("tokens: the path must hold at least one token")
    sequence = list(prompt_ids) + list(tokens[:-1])
    with model.forwards():
        logits = model.module(
            input_ids=_ids(sequence, model.device), use_cache=False, logits_to_keep=len(tokens)
        ).logits[0]
    return logits.float().cpu()


@dataclass(frozen=True)
class ChallengeLimits:
    """Bounds a validator draws challenges within."""

    max_prompt_len: int
    max_gen_len: int
    min_prompt_len: int = CHALLENGE_MIN_PROMPT_LEN

    def __post_init__(self) -> None:
        if not 1 <= self.min_prompt_len <= self.max_prompt_len:
            raise ValueError(f"prompt length bounds [{self.min_prompt_len}, {self.max_prompt_len}] are empty")
        if self.max_gen_len < 1:
            raise ValueError(f"max_gen_len must be at least 1, got {self.max_gen_len}")


@dataclass(frozen=True)
class Challenge:
    """One logit-verification request: a token-id prompt, how many tokens, which step's logits."""

    prompt: tuple[int, ...]
    gen_len: int
    logits_at_step: int

    def payload(self) -> dict:
        """The JSON body of ``POST /inference``."""
        return {"prompt": list(self.prompt), "gen_len": self.gen_len, "logits_at_step": self.logits_at_step}


def draw_challenge(tokens: TokenRange, limits: ChallengeLimits, rng: random.Random | None = None) -> Challenge:
    """A random challenge; ``rng`` defaults to the OS's cryptographic source (a miner cannot predict it)."""
    rng = secrets.SystemRandom() if rng is None else rng
    prompt_len = rng.randint(limits.min_prompt_len, limits.max_prompt_len)
    gen_len = rng.randint(1, limits.max_gen_len)
    return Challenge(
        prompt=tuple(tokens.draw(rng) for _ in range(prompt_len)),
        gen_len=gen_len,
        logits_at_step=rng.randint(1, gen_len),
    )


@dataclass(frozen=True)
class LogitThresholds:
    """Pass iff cosine ≥ ``min_cosine`` and max |diff| ≤ ``max_abs_diff`` (docs/rules.md §4 step 6)."""

    min_cosine: float = float(OPTIONS_BY_KEY["logits_min_cosine"].default)
    max_abs_diff: float = float(OPTIONS_BY_KEY["logits_max_abs_diff"].default)


@dataclass(frozen=True)
class LogitComparison:
    """The verdict on one logit vector; ``cosine``/``max_abs_diff`` are None when not computable."""

    cosine: float | None
    max_abs_diff: float | None
    passed: bool
    reason: str


def _as_vector(values) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        return values.detach().to("cpu", torch.float64)
    return torch.as_tensor(values, dtype=torch.float64)


def compare_logits(reference, candidate, min_cosine: float, max_abs_diff: float) -> LogitComparison:
    """Compare two logit vectors (tensors or number sequences) in float64 against the thresholds."""
    ref, cand = _as_vector(reference), _as_vector(candidate)
    if ref.shape != cand.shape or ref.dim() != 1:
        return LogitComparison(None, None, False, f"logits have shape {tuple(cand.shape)}, expected {tuple(ref.shape)}")
    bad = (~torch.isfinite(cand)).nonzero()
    if len(bad):
        return LogitComparison(
            None, None, False, f"logits hold {len(bad)} non-finite values (first at index {int(bad[0])})"
        )
    if not torch.isfinite(ref).all():
        return LogitComparison(None, None, False, "the reference logits are not finite")
    norms = float(ref.norm()) * float(cand.norm())
    if norms == 0.0:
        return LogitComparison(None, float((ref - cand).abs().max()), False, "logits are all zero")
    cosine = float(ref @ cand) / norms
    diff = float((ref - cand).abs().max())
    passed = cosine >= min_cosine and diff <= max_abs_diff
    verdict = (
        f"cosine {cosine:.6f} {'≥' if cosine >= min_cosine else '<'} {min_cosine}, "
        f"max |diff| {diff:.4g} {'≤' if diff <= max_abs_diff else '>'} {max_abs_diff}"
    )
    return LogitComparison(cosine, diff, passed, verdict)


def verify_generation(
    reference: ReferenceModel,
    challenge: Challenge,
    tokens: Sequence[int],
    logits,
    thresholds: LogitThresholds,
) -> LogitComparison:
    """Judge a miner's answer to ``challenge``: its tokens and its logits at the challenge's step.

    Each returned token must be a greedy choice of the reference within ``2 × max_abs_diff``
    (the most two logit vectors that each pass the diff bound can disagree on a top-2 gap), and
    the logits at the step must pass :func:`compare_logits` against the reference on that path.
    """
    if len(tokens) != challenge.gen_len:
        return LogitComparison(
            None, None, False, f"returned {len(tokens)} tokens, expected gen_len {challenge.gen_len}"
        )
    for index, token_id in enumerate(tokens):
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < reference.vocab_size:
            return LogitComparison(
                None,
                None,
                False,
                f"tokens[{index}]: {token_id!r} is outside the vocabulary [0, {reference.vocab_size})",
            )
    expected = path_logits(reference, challenge.prompt, tokens)
    tolerance = 2 * thresholds.max_abs_diff
    for index, token_id in enumerate(tokens):
        best = int(torch.argmax(expected[index]))
        gap = float(expected[index, best] - expected[index, token_id])
        if gap > tolerance:
            return LogitComparison(
                None,
                None,
                False,
                f"token at step {index + 1} is {token_id}, not a greedy choice: the reference "
                f"picks {best}, which scores {gap:.4g} higher (tolerance {tolerance:.4g})",
            )
    return compare_logits(
        expected[challenge.logits_at_step - 1], logits, thresholds.min_cosine, thresholds.max_abs_diff
    )


def cosine_reference(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity in plain Python (``math.fsum``): the slow twin of :func:`compare_logits`."""
    dot = math.fsum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b)))
