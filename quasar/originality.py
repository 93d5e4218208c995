"""What counts as a copy of another miner's kernel (docs/rules.md section 5), as pure functions.

A submission is a **copy** when another hotkey made one that counts earlier with

- the same commit (a commit id names the whole tree: the same commit in another fork is the same
  code), or
- the same kernel files: the files under ``fla/ops/quasar/``, each normalised so that comments,
  docstrings, blank lines, indentation and spacing do not change it (:func:`content_hash`).

A submission counts from a chain block (docs/rules.md section 5): a direct one from the block it
was made ready, one by commit-reveal from the block its reveal window opened; in a tie the lower
submission id counts first. So a commitment to a commit that another hotkey has already submitted
does not make it the committer's, and a miner that publishes its commit when its window opens
comes before anyone submitting that commit after seeing it.

A copy is never ranked: the API refuses a submission or reveal of a commit that another hotkey's
submission counting earlier holds, and leaves a copy of the same kernel files under another commit
out of the ranking, telling the miner which submission it copies. A hotkey resubmitting its own
earlier kernel is not a copy.

The API cannot read a fork's files; validators can. Each validator computes the content hash from
its clone (quasar/validator/worker.py) and reports it with its verdict; the API takes the hash that
validators holding more than half of the stake reported (quasar/consensus.py).
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from quasar import astparse

KERNEL_DIR = "fla/ops/quasar"
# Sources of these kinds are compared without comments and whitespace; other files as they are.
C_LIKE_SUFFIXES = (".cu", ".cuh", ".c", ".cc", ".cpp", ".cxx", ".h", ".hh", ".hpp")
# C-like source: a string or character literal is kept as it is, a comment dropped (one space). At
# each quote the literal must close on its line (escapes honoured), else the quote is an ordinary
# character. Scanned by _without_c_comments, not by one substitution: an expression failing at a
# quote would rescan the rest of the line from every later quote (80 KB of ``\"`` pairs took 30 s).
_C_START = re.compile(r"[\"'/]")
# From a quote: its literal as far as it reaches on its line, with the closing quote (group 1) if any.
_C_LITERAL = {quote: re.compile(rf"{quote}(?:\\.|[^{quote}\\\n])*({quote})?", re.DOTALL) for quote in "\"'"}
_SPACE = re.compile(rb"\s+")
# A space next to punctuation (matching only spaces keeps punctuation-dense files fast).
_SPACE_BY_PUNCTUATION = re.compile(rb" (?=[^\w ])|(?<=[^\w ]) ")

SAME_COMMIT, SAME_CONTENT = "commit", "content"

# Parsing costs far more than a file's size (``x=[0,0,...]`` takes about 500 bytes of memory a
# byte, in the validator's own process), so Python and JSON are parsed only up to these sizes, a
# file and a kernel directory in path order; beyond, they are compared with whitespace collapsed
# (about 2 s and 70 MB at the most). A real kernel is far below both: the starter fork's kernel
# directory holds 90 KB, fla's largest source is 80 KB. (A copier gains nothing by going over: a
# file or a file more changes the hash anyway.)
MAX_PARSED_FILE_BYTES = 128 * 1024
MAX_PARSED_BYTES = 512 * 1024
PARSED_SUFFIXES = (".py", ".json")


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def _joined_literals(values: list[ast.expr]) -> list[ast.expr]:
    """An f-string's pieces with adjacent literal ones joined and empty ones dropped."""
    pieces: list[ast.expr] = []
    for value in values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if not value.value:
                continue
            if pieces and isinstance(pieces[-1], ast.Constant) and isinstance(pieces[-1].value, str):
                pieces[-1] = ast.Constant(pieces[-1].value + value.value)
                continue
        pieces.append(value)
    return pieces


def canonical_tree(node: object) -> str:
    """``node`` written out the same by every Python version from 3.11 on, so that validators on
    different versions agree on a content hash (``ast.dump`` does not: 3.12 adds
    ``type_params=[]`` to every function and class, 3.13 leaves empty fields out, and 3.12.0–3.12.1
    put an empty literal after a nested format spec in an f-string).

    Each node as its class name and its fields, a field that is None or an empty list left out; an
    f-string's adjacent literal pieces joined and empty ones dropped; values as ``repr`` writes them.
    Source positions are not fields, so they do not count.
    """
    if isinstance(node, ast.AST):
        fields = []
        for name in node._fields:
            if isinstance(node, ast.JoinedStr) and name == "values":
                value: object = _joined_literals(node.values)
            else:
                value = getattr(node, name, None)
            if value is None or value == []:
                continue
            fields.append(f"{name}={canonical_tree(value)}")
        return f"{type(node).__name__}({','.join(fields)})"
    if isinstance(node, list):
        return f"[{','.join(canonical_tree(item) for item in node)}]"
    return repr(node)


def _collapsed(text: bytes) -> bytes:
    """Whitespace runs as one space, and none next to punctuation."""
    return _SPACE_BY_PUNCTUATION.sub(b"", _SPACE.sub(b" ", text).strip())


def _without_c_comments(text: str) -> str:
    """``text`` with its comments (``//`` to the end of the line, ``/* ... */``) as one space each,
    literals kept: what ``re.sub`` of the literal-or-comment expression gives, in linear time.

    A quote whose literal does not close fails up to the end of its line (``unclosed``); a later
    quote of the kind before that end fails too (the earlier scan read it as an escaped quote, and
    reads on from it as the later one would), so it is not scanned again. Nor is ``/*`` once one
    found no ``*/`` after it."""
    pieces: list[str] = []
    kept = at = 0
    unclosed = {quote: -1 for quote in _C_LITERAL}
    block_unclosed = False
    while found := _C_START.search(text, at):
        start, char = found.start(), found.group()
        at = start + 1
        if char in _C_LITERAL:
            if start < unclosed[char]:
                continue
            literal = _C_LITERAL[char].match(text, start)
            assert literal is not None  # it matches at any quote
            if literal.group(1) is None:
                unclosed[char] = literal.end()
            else:
                at = literal.end()
            continue
        if text.startswith("//", start):
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
        elif text.startswith("/*", start) and not block_unclosed:
            end = text.find("*/", start + 2)
            if end < 0:
                block_unclosed = True
                continue
            end += 2
        else:
            continue
        pieces += [text[kept:start], " "]
        kept = at = end
    pieces.append(text[kept:])
    return "".join(pieces)


def normalised_file(name: str, data: bytes, parse: bool = True) -> bytes:
    """``data`` (the file ``name``) in a form that comments and whitespace do not change.

    Python: its syntax tree without docstrings (so formatting, comments and redundant parentheses
    do not count), written out by :func:`canonical_tree` (the same on every Python version);
    C-like sources: without comments, whitespace collapsed; JSON: the parsed value in canonical
    form; anything else, a file that does not parse, or Python or JSON not to be parsed (``parse``
    False, or over MAX_PARSED_FILE_BYTES): whitespace collapsed.
    """
    if name.endswith(PARSED_SUFFIXES) and (not parse or len(data) > MAX_PARSED_FILE_BYTES):
        return _collapsed(data)
    if name.endswith(".py"):
        try:
            tree = astparse.parse(data, filename=name)
            return canonical_tree(_without_docstrings(tree)).encode()
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return _collapsed(data)
    if name.endswith(C_LIKE_SUFFIXES):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return _collapsed(data)
        return _collapsed(_without_c_comments(text).encode())
    if name.endswith(".json"):
        try:
            return json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
        except (ValueError, RecursionError):
            return _collapsed(data)
    return _collapsed(data)


def content_hash(files: Mapping[str, bytes]) -> str:
    """The content hash of the kernel files ``files`` (path relative to the kernel directory ->
    bytes): sha256 over each path and its normalised content, in path order (Python and JSON parsed
    while MAX_PARSED_BYTES last)."""
    digest = hashlib.sha256()
    unparsed = MAX_PARSED_BYTES
    for path in sorted(files):
        data = files[path]
        parse = len(data) <= unparsed
        if parse and path.endswith(PARSED_SUFFIXES):
            unparsed -= len(data)
        # A name that is not UTF-8 comes from os.walk with its bytes escaped (PEP 383): the same bytes back.
        name = path.encode("utf-8", "surrogateescape")
        digest.update(name + b"\0" + hashlib.sha256(normalised_file(path, data, parse)).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class Fingerprint:
    """What identifies a submission's code: its commit and (once validators agree on it) the
    content hash of its kernel files; and the chain block it counts from (see the module docstring)."""

    submission_id: int
    hotkey: str
    commit_hash: str | None
    content_hash: str | None
    counts_from_block: int

    @property
    def order(self) -> tuple[int, int]:
        """Who came first: the block it counts from, then the lower submission id."""
        return self.counts_from_block, self.submission_id


@dataclass(frozen=True)
class CopyOf:
    """``submission_id`` copies ``original_id`` of ``original_hotkey``: the same commit or content."""

    submission_id: int
    original_id: int
    original_hotkey: str
    same: str

    @property
    def reason(self) -> str:
        what = "the same commit" if self.same == SAME_COMMIT else "the same kernel files (fla/ops/quasar/)"
        return (
            f"a copy of submission {self.original_id} by {self.original_hotkey}, made earlier with {what}: "
            f"a copy is not ranked"
        )


def find_copies(fingerprints: Iterable[Fingerprint]) -> dict[int, CopyOf]:
    """The copies among ``fingerprints`` (see the module docstring), by submission id: each
    submission's original is the one counting earliest (:attr:`Fingerprint.order`) that shares its
    commit or its content; it is a copy when that one is another hotkey's."""
    prints = sorted(fingerprints, key=lambda fingerprint: fingerprint.order)
    first_by_commit: dict[str, Fingerprint] = {}
    first_by_content: dict[str, Fingerprint] = {}
    copies: dict[int, CopyOf] = {}
    for fingerprint in prints:
        earlier = []
        if fingerprint.commit_hash is not None and fingerprint.commit_hash in first_by_commit:
            earlier.append((first_by_commit[fingerprint.commit_hash], SAME_COMMIT))
        if fingerprint.content_hash is not None and fingerprint.content_hash in first_by_content:
            earlier.append((first_by_content[fingerprint.content_hash], SAME_CONTENT))
        if earlier:
            original, same = min(earlier, key=lambda entry: entry[0].order)
            if original.hotkey != fingerprint.hotkey:
                copies[fingerprint.submission_id] = CopyOf(
                    fingerprint.submission_id, original.submission_id, original.hotkey, same
                )
        if fingerprint.commit_hash is not None:
            first_by_commit.setdefault(fingerprint.commit_hash, fingerprint)
        if fingerprint.content_hash is not None:
            first_by_content.setdefault(fingerprint.content_hash, fingerprint)
    return copies
