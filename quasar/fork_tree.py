"""The shape of a fork's tree, read from ``git ls-tree`` before anything of it is checked out.

A pack of a few kilobytes can name a billion files: trees are shared, so three tree objects of a
thousand names each, every name the same subtree, list 1000 x 1000 x 1000 paths. Listing them all
took the validator's worker 3 GiB of memory a minute (and checking them out would take the disk's
inodes); a billion empty directories, listed without their trees, kept git walking them, writing
nothing, until the clone's time limit; a path nested a thousand directories deep broke the
recursive walks that read a checkout (``RecursionError``, a crash counted as the validator's own
failure); a name holding a newline, or bytes that are not UTF-8, reached reports and logs as it
was. So the listing is read as git writes it, and refused (docs/rules.md section 4, step 1) at the
first entry that breaks a rule:

- at most :data:`MAX_TREE_ENTRIES` entries (directories, files, links and submodule entries; a
  real flash-linear-attention repository has about 1,700);
- a path at most :data:`MAX_PATH_DEPTH` names deep and :data:`MAX_PATH_BYTES` bytes long (fla's
  deepest is 8 names, its longest 124 bytes);
- a path is UTF-8 without control characters (C0, DEL, C1), line or paragraph separators, or
  bidirectional formatting characters (which make a name read as another).

The blobs' total size is returned for the caller's size limit.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from quasar.errors import QuasarError

MAX_TREE_ENTRIES = 50_000
MAX_PATH_DEPTH = 32
MAX_PATH_BYTES = 1024

# Characters a path may not hold: fixed sets (never "unassigned", which changes with Python's
# Unicode version), so that every validator refuses the same trees.
_REFUSED_CHARACTERS = frozenset(
    [chr(code) for code in range(0x20)]
    + [chr(code) for code in range(0x7F, 0xA0)]
    + ["\u2028", "\u2029", "\u200e", "\u200f", "\u061c"]
    + [chr(code) for code in range(0x202A, 0x202F)]
    + [chr(code) for code in range(0x2066, 0x206A)]
)
_READ_BYTES = 1 << 16


class TreeRefused(QuasarError, ValueError):
    """The fork's tree breaks a rule of this module; the message says which, and where."""


def path_problem(path: bytes) -> str | None:
    """Why the tree path ``path`` (git's bytes) is refused, or None."""
    try:
        text = path.decode("utf-8")
    except UnicodeDecodeError:
        return f"the path {path[:MAX_PATH_BYTES]!r} is not UTF-8"
    if len(path) > MAX_PATH_BYTES:
        return f"a path is {len(path)} bytes long, over the limit of {MAX_PATH_BYTES}: {text[:80]!r}..."
    if path.count(b"/") >= MAX_PATH_DEPTH:
        return f"a path is {path.count(b'/') + 1} names deep, over the limit of {MAX_PATH_DEPTH}: {text[:80]!r}..."
    if not _REFUSED_CHARACTERS.isdisjoint(text):
        return f"the path {text!r} holds a control, line-separator or bidirectional character"
    return None


def _entry_bytes(entry: bytes) -> int:
    """The size an ``ls-tree -l -z`` entry gives, after checking its path (directories and submodule
    entries: 0)."""
    header, tab, path = entry.partition(b"\t")
    fields = header.split()
    if not tab or len(fields) != 4:
        raise TreeRefused(f"git ls-tree wrote an entry it should not: {entry[:200]!r}")
    problem = path_problem(path)
    if problem is not None:
        raise TreeRefused(problem)
    return int(fields[3]) if fields[3].isdigit() else 0


def listed_bytes(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    check_time: Callable[[str], None],
    failure: Callable[[str], Exception],
) -> int:
    """Run ``command`` (``git ls-tree -r -t -l -z --full-tree COMMIT``: directories listed too)
    and return the total size of the blobs it lists, reading its output as it comes and stopping
    git at the first entry past :data:`MAX_TREE_ENTRIES` or breaking :func:`path_problem`
    (:class:`TreeRefused`). ``check_time(step)`` raises past the caller's deadline;
    ``failure(stderr)`` is what a failing git raises."""
    step = "listing the tree"
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            list(command), cwd=cwd, env=dict(env), stdout=subprocess.PIPE, stderr=errors, start_new_session=True
        )
        assert proc.stdout is not None
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(proc.stdout, selectors.EVENT_READ)
                pending, entries, total = b"", 0, 0
                while True:
                    check_time(step)
                    if not selector.select(timeout=0.1):
                        continue
                    chunk = os.read(proc.stdout.fileno(), _READ_BYTES)
                    if not chunk:
                        break
                    *complete, pending = (pending + chunk).split(b"\0")
                    entries += len(complete)
                    if entries > MAX_TREE_ENTRIES:
                        raise TreeRefused(
                            f"the tree has more than {MAX_TREE_ENTRIES} entries (directories, files, links)"
                        )
                    total += sum(_entry_bytes(entry) for entry in complete)
                    if len(pending) > MAX_PATH_BYTES + 256:
                        raise TreeRefused(f"a path is over the limit of {MAX_PATH_BYTES} bytes")
            if pending:
                raise TreeRefused(f"git ls-tree's output ended inside an entry: {pending[:200]!r}")
            if proc.wait() != 0:
                errors.seek(0)
                raise failure(errors.read(1 << 16).decode(errors="replace"))
            return total
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.stdout.close()
            proc.wait()
