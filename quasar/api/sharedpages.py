"""Cached reads shared by the worker processes of one server (``serve --workers N``).

Each worker keeps its own cache of rendered reads per chain block (quasar.api.readcache), so
without sharing every worker renders every dashboard page and computes every cached JSON body for
itself, N times the work at the start and at every block change. Through this store the first
worker to need a (target, block) computes it while it holds an ``flock`` on the target's slot, and
writes it to a file in a directory private to the server (the supervisor makes it, mode 0700, and
removes it at exit); a worker that needs the same meanwhile waits on the lock, then reads the file.

The directory holds at most ``slots`` files (one per hash slot of the request target) and their
lock files, whatever targets clients ask for; a file names its target and block, and a file of
another target or an older block is a miss (the slot is computed again and overwritten). Only 200
responses are written. A file is replaced atomically (written beside it, then renamed). A disk
that refuses it (full, read-only) costs only the sharing: logged once, the response is served.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from quasar.api.rendered import Rendered, Target

logger = logging.getLogger(__name__)

DEFAULT_SLOTS = 1024


class SharedPages:
    """Rendered responses by target and block in ``directory``, computed once across processes."""

    def __init__(self, directory: Path, slots: int = DEFAULT_SLOTS):
        self.directory = Path(directory)
        self.slots = slots
        self._failing = False  # the directory's disk refuses writes (full, read-only): logged once

    def render(self, target: Target, block: int, compute: Callable[[], Rendered]) -> Rendered:
        """``target``'s response at ``block``: another process's, if one computed it, else ``compute()``'s
        (kept for the others when it is a 200). Blocks while another process computes the same slot."""
        slot = self._slot(target)
        with self._locked(slot):
            found = self._read(slot, target, block)
            if found is not None:
                return found
            rendered = compute()
            if rendered.status == 200:
                self._keep(slot, target, block, rendered)
            return rendered

    def _slot(self, target: Target) -> str:
        path, query = target
        digest = hashlib.blake2b(path.encode() + b"?" + query, digest_size=8).digest()
        return f"{int.from_bytes(digest, 'big') % self.slots:04x}"

    @contextlib.contextmanager
    def _locked(self, slot: str) -> Iterator[None]:
        # A descriptor of its own per call: flock then also keeps out the other threads of this process.
        try:
            descriptor = os.open(self.directory / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as error:  # no lock file on a full disk: computed here, unshared
            self._refused(error)
            yield
            return
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            os.close(descriptor)  # releases the lock

    def _read(self, slot: str, target: Target, block: int) -> Rendered | None:
        try:
            data = (self.directory / slot).read_bytes()
        except FileNotFoundError:
            return None
        head, _, body = data.partition(b"\n")
        meta = json.loads(head)
        if meta["target"] != _stored_target(target) or meta["block"] != block:
            return None
        headers = tuple((name.encode("latin-1"), value.encode("latin-1")) for name, value in meta["headers"])
        return Rendered(meta["status"], headers, body)

    def _keep(self, slot: str, target: Target, block: int, rendered: Rendered) -> None:
        """Write the slot for the other processes. A disk that cannot take it (full, read-only) only
        costs them computing it themselves: the response is still served, never a 500."""
        try:
            self._write(slot, target, block, rendered)
        except OSError as error:
            (self.directory / f"{slot}.partial").unlink(missing_ok=True)
            self._refused(error)
            return
        if self._failing:
            self._failing = False
            logger.info("sharing rendered reads in %s again", self.directory)

    def _refused(self, error: OSError) -> None:
        if not self._failing:
            self._failing = True
            logger.warning(
                "cannot share rendered reads in %s (%s): each worker renders its own until it can",
                self.directory,
                error.strerror,
            )

    def _write(self, slot: str, target: Target, block: int, rendered: Rendered) -> None:
        meta = {
            "target": _stored_target(target),
            "block": block,
            "status": rendered.status,
            "headers": [[name.decode("latin-1"), value.decode("latin-1")] for name, value in rendered.headers],
        }
        partial = self.directory / f"{slot}.partial"
        partial.write_bytes(json.dumps(meta, separators=(",", ":")).encode() + b"\n" + rendered.body)
        os.replace(partial, self.directory / slot)


def _stored_target(target: Target) -> list[str]:
    """``target`` as a slot file names it (JSON: the query string's bytes as latin-1)."""
    path, query = target
    return [path, query.decode("latin-1")]
