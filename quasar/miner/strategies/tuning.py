"""The tuning strategy: search the tunables a fork's kernels expose, for the GPU at hand.

The contract with the fork
--------------------------
``fla/ops/quasar/tuning.json`` is a flat JSON object of tunables the kernels read at import
(the starter fork's ``fla/ops/quasar/tuning.py`` does: every key optional, defaults in its
``QuasarTuning`` dataclass, an unknown key or value is an error there). The tuner writes it.

What may be searched, and each tunable's default, the tuner learns without running fork code:

1. from ``fla/ops/quasar/tuning_space.json``, when the fork ships one::

       {"defaults": {"segment_chunks": 16, "combine_block_v": 16},
        "choices":  {"segment_chunks": [8, 16, 32, 64], "combine_block_v": [16, 32, 64]}}

2. otherwise by reading ``fla/ops/quasar/tuning.py`` as text (never importing it): the literal
   defaults of its ``@dataclass`` class, and a module-level dict literal mapping those names to
   sets or lists of allowed values (the starter fork's ``_ALLOWED``).

Only tunables with both a default and a list of choices are searched. Every choice must be
correct for the kernels (the harness checks anyway) but may be slower.

Tunings per chip: ``tuning.json`` may hold ``"devices": {fragment: {name: value}}``, whose first
fragment found (case-insensitively) in the GPU's name applies over the file's own values on that
GPU (the starter fork's contract). On a GPU one of them matches, the search starts from that
entry's values and writes its changes into it: a change at the top level would not take effect
there, and the other chips keep their tunings.

The search: greedy coordinate descent from the configuration in use (defaults overlaid with
``tuning.json``). Each proposal changes one tunable to another choice, nearest values first; a
change that is faster is committed and becomes the new base, and the search goes on from there.
A configuration (on the same kernel code and GPU) is never evaluated twice; when every
neighbour of the best has been tried, the strategy has nothing left and returns None.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quasar import astparse
from quasar.errors import QuasarError
from quasar.imports import QUASAR_DIR
from quasar.miner.strategies.base import Attempt, Candidate

logger = logging.getLogger(__name__)

TUNING_FILE = f"{QUASAR_DIR}/tuning.json"
DEVICES = "devices"
SPACE_FILE = f"{QUASAR_DIR}/tuning_space.json"
TUNING_SOURCE = f"{QUASAR_DIR}/tuning.py"
MAX_CHOICES = 64
_SCALARS = (bool, int, float, str)


class TuningFileError(QuasarError, ValueError):
    """A tuning file does not follow the contract; the message names the file and the field."""


@dataclass(frozen=True)
class TuningSpace:
    """What may be tuned: each tunable's default and its choices (only names that have both)."""

    defaults: dict[str, Any]
    choices: dict[str, list[Any]]
    source: str

    def current(self, written: dict[str, Any], device: str | None = None) -> dict[str, Any]:
        """The configuration in use on ``device``: the defaults overlaid with what ``tuning.json``
        holds, and with its entry for that device (:func:`chip_entry`), if one matches."""
        values = {**self.defaults, **{name: value for name, value in written.items() if name != DEVICES}}
        fragment = chip_entry(written, device)
        return values if fragment is None else {**values, **written[DEVICES][fragment]}


def _sorted_choices(name: str, values: Any, where: str) -> list[Any]:
    if not isinstance(values, (list, tuple, set, frozenset)) or not values or len(values) > MAX_CHOICES:
        raise TuningFileError(f"{where}: choices of {name!r} must be a list of 1 to {MAX_CHOICES} values")
    if not all(isinstance(value, _SCALARS) for value in values):
        raise TuningFileError(f"{where}: choices of {name!r} must be numbers, strings or booleans")
    kinds = {type(value) for value in values}
    unique = list(dict.fromkeys(values))
    return sorted(unique) if len(kinds) == 1 else unique


def parse_space(text: str) -> TuningSpace:
    """Parse ``tuning_space.json`` (see the module docstring); raises :class:`TuningFileError`."""
    try:
        document = json.loads(text)
    except ValueError as error:
        raise TuningFileError(f"{SPACE_FILE} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise TuningFileError(f"{SPACE_FILE} must be a JSON object with 'defaults' and 'choices'")
    defaults, choices = document.get("defaults"), document.get("choices")
    if not isinstance(defaults, dict):
        raise TuningFileError(f"{SPACE_FILE}: field 'defaults' must be an object of name: value")
    if not isinstance(choices, dict):
        raise TuningFileError(f"{SPACE_FILE}: field 'choices' must be an object of name: [values]")
    missing = sorted(set(choices) - set(defaults))
    if missing:
        raise TuningFileError(f"{SPACE_FILE}: choices.{missing[0]} has no default in 'defaults'")
    parsed = {name: _sorted_choices(name, values, SPACE_FILE) for name, values in choices.items()}
    return TuningSpace(dict(defaults), parsed, SPACE_FILE)


def _is_dataclass_decorator(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return (isinstance(target, ast.Name) and target.id == "dataclass") or (
        isinstance(target, ast.Attribute) and target.attr == "dataclass"
    )


def read_source_space(source: str) -> TuningSpace | None:
    """The space a ``tuning.py`` declares in literals (module docstring, point 2), or None."""
    try:
        tree = astparse.parse(source)
    except SyntaxError:
        return None
    defaults: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and any(_is_dataclass_decorator(d) for d in node.decorator_list):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value is not None:
                    try:
                        defaults[item.target.id] = ast.literal_eval(item.value)
                    except ValueError:
                        continue
            if defaults:
                break
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict):
            continue
        try:
            literal = ast.literal_eval(value)
        except ValueError:
            continue
        if (
            literal
            and set(literal) <= set(defaults)
            and all(isinstance(v, (set, frozenset, list, tuple)) for v in literal.values())
        ):
            try:
                choices = {name: _sorted_choices(name, values, TUNING_SOURCE) for name, values in literal.items()}
            except TuningFileError:
                continue
            return TuningSpace(defaults, choices, TUNING_SOURCE)
    return None


def read_space(repo: Path) -> TuningSpace | None:
    """The fork's tuning space (tuning_space.json, else tuning.py), or None when it declares none."""
    space_file = Path(repo) / SPACE_FILE
    if space_file.is_file():
        return parse_space(space_file.read_text(encoding="utf-8"))
    source = Path(repo) / TUNING_SOURCE
    if source.is_file():
        return read_source_space(source.read_text(encoding="utf-8"))
    return None


def chip_entry(written: dict[str, Any], device: str | None) -> str | None:
    """The fragment of ``written``'s ``devices`` that applies on the GPU named ``device``: the first
    found in the name, case-insensitively (None: no such entry, or no GPU)."""
    chips = written.get(DEVICES)
    if device is None or not isinstance(chips, dict):
        return None
    for fragment, values in chips.items():
        if fragment.strip() and fragment.lower() in device.lower():
            return fragment if isinstance(values, dict) else None
    return None


def with_change(written: dict[str, Any], device: str | None, name: str, value: Any) -> dict[str, Any]:
    """``written`` with ``name`` set to ``value`` where it takes effect on ``device``: in the
    device's entry when one matches, else at the top level."""
    fragment = chip_entry(written, device)
    if fragment is None:
        return {**written, name: value}
    chips = {**written[DEVICES], fragment: {**written[DEVICES][fragment], name: value}}
    return {**written, DEVICES: chips}


def read_written(repo: Path) -> dict[str, Any]:
    """What ``tuning.json`` holds now ({} when absent); raises :class:`TuningFileError`."""
    path = Path(repo) / TUNING_FILE
    if not path.is_file():
        return {}
    try:
        written = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise TuningFileError(f"{TUNING_FILE} is not JSON: {error}") from None
    if not isinstance(written, dict):
        raise TuningFileError(f"{TUNING_FILE} must be a JSON object of tunables")
    return written


def code_digest(repo: Path) -> str:
    """sha256 over the kernel sources (every file under fla/ops/quasar/ but tuning.json)."""
    digest = hashlib.sha256()
    base = Path(repo) / QUASAR_DIR
    for path in sorted(p for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        relative = path.relative_to(repo).as_posix()
        if relative == TUNING_FILE:
            continue
        digest.update(relative.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def configuration_key(code: str, device: str | None, values: dict[str, Any]) -> str:
    """What identifies one configuration tried: the kernel code, the GPU and every value."""
    text = json.dumps({"code": code, "device": device, "values": values}, sort_keys=True)
    return "tuning:" + hashlib.sha256(text.encode()).hexdigest()


def neighbours(space: TuningSpace, current: dict[str, Any]) -> list[tuple[str, Any]]:
    """Every (name, value) one step from ``current``: per tunable, the nearest choices first."""
    steps = []
    for name, options in space.choices.items():
        here = options.index(current[name]) if current[name] in options else -1
        ranked = sorted(range(len(options)), key=lambda index: (abs(index - here) if here >= 0 else index, index))
        steps += [(name, options[index]) for index in ranked if options[index] != current[name]]
    return steps


class TuningStrategy:
    """Greedy search of the fork's tunables on ``device`` (``torch.cuda.get_device_name()``, None on CPU)."""

    name = "tuning"

    def __init__(self, device: str | None = None):
        self.device = device
        self._reported: set[str] = set()
        self._bases: set[str] = set()

    def _note(self, message: str) -> None:
        if message not in self._reported:
            self._reported.add(message)
            logger.warning("tuning: %s", message)

    def propose(self, repo_path: Path, history: Sequence[Attempt]) -> Candidate | None:
        repo = Path(repo_path)
        try:
            space = read_space(repo)
            written = read_written(repo)
        except (TuningFileError, OSError, UnicodeDecodeError) as error:
            self._note(str(error))
            return None
        if space is None or not space.choices:
            self._note(
                f"the fork declares no tunables ({SPACE_FILE}, or literals in {TUNING_SOURCE}), so "
                "there is nothing to tune (the contract: quasar/miner/strategies/tuning.py)"
            )
            return None
        code = code_digest(repo)
        current = space.current(written, self.device)
        # A configuration that was the base once (measured as the best) is not worth going back to.
        self._bases.add(configuration_key(code, self.device, current))
        tried = {attempt.key for attempt in history} | self._bases
        for name, value in neighbours(space, current):
            key = configuration_key(code, self.device, {**current, name: value})
            if key in tried:
                continue
            where = f" on {self.device}" if self.device else ""
            text = json.dumps(with_change(written, self.device, name, value), indent=2, sort_keys=True) + "\n"
            return Candidate(
                strategy=self.name,
                description=f"{name} {json.dumps(current[name])} -> {json.dumps(value)}{where}",
                changes={TUNING_FILE: text},
                key=key,
            )
        return None
