"""The Triton cache seed: what Triton compiled for the starter fork's kernels, given to every sandbox.

A fork's first forward at each length compiles its Triton kernels on the child's one core: about
six seconds of an evaluation on an H100 machine (the WY pass alone three), plus a C compiler run
for each kernel's launcher. Most forks carry the starter fork's kernels, changed or not (step 1
writes them), and Triton keys its cache by each kernel's source, its constants, the compiler and
the GPU, so a compilation of the same kernel can be reused safely wherever those agree.

The seed is built once per starter fork, Triton, torch, Python and GPU model (:func:`seed_key`),
after writing the bytecode the evaluation environment lacks (environment.compile_bytecode), by
running the starter fork, the suite's own code, at the evaluation's lengths in a sandboxed child
started exactly as an evaluation's, and taking that child's Triton cache (``triton_cache``,
child.py). Every later sandbox gets the folder read-only and copies it into its own cache before
any fork code runs; Triton then reuses what matches and compiles the rest. Nothing an evaluated
fork writes ever reaches the seed: only the starter's run makes it, each child works on its own
copy, and an unsandboxed child (which could write to the host) gets none. Where the seed cannot be
built, evaluations compile everything, as without it (docs/evaluation.md, "The Triton cache seed").
A new seed's build removes the seeds no evaluation used lately (:func:`prune_seeds`): the folder
holds :data:`MAX_SEEDS` at most, whatever upgrades the host goes through.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import re
import shutil
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import IO

from quasar.errors import QuasarError
from quasar.evaluate import protocol
from quasar.evaluate.environment import compile_bytecode, evaluation_environment
from quasar.evaluate.gpus import assigned_gpu, nvidia_gpus
from quasar.evaluate.sandbox_contents import physical_gpu_id
from quasar.evaluate.sandbox_layout import SandboxPolicy, python_executable
from quasar.evaluate.start import SandboxStart

logger = logging.getLogger(__name__)

# Fingerprint payload of a one-forward request (workload.SEGMENTS x FINGERPRINT_DIRECTIONS floats).
_RUN_PAYLOAD_BYTES = 1 << 16
# The largest seed taken from the child (the starter's cache is a few MiB).
MAX_SEED_BYTES = 256 << 20
# How long building a seed may take in all (the child's start, the compilations, the longest length).
BUILD_TIMEOUT_S = 600.0
# Seeds kept in TRITON_SEED_DIR, the most recently used: each GPU model and each change of
# Triton, torch, Python or the starter fork makes a new one, and the old ones are never used again.
MAX_SEEDS = 4
# The requests' seeds: any will do, the run is only there to compile the kernels.
_INPUT_SEED, _BASIS_SEED, _WEIGHTS_SEED = 1, 2, 3


class SeedError(QuasarError):
    """The seed could not be built (the starter fork failed in the sandbox, or sent a bad archive)."""


def starter_tree() -> Path:
    """The starter fork's tree as the package ships it (a folder on disk)."""
    from quasar.starter_fork import template_root

    return Path(str(template_root()))


def tree_digest(root: Path) -> str:
    """SHA-256 over every file of ``root`` (path and content, in sorted order, bytecode left out)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def gpu_model(device: str) -> str | None:
    """The model of the NVIDIA GPU ``device`` names, as the driver lists it; None where unknown."""
    try:
        gpu = assigned_gpu(physical_gpu_id(device), nvidia_gpus())
    except QuasarError:
        return None
    return gpu.model if gpu is not None and gpu.model else None


# The harness's own Triton kernels (the fingerprint and the signs), which a seed holds compiled too.
HARNESS_KERNELS = Path(__file__).with_name("workload.py")


def seed_key(model: str, tree: Path | None = None, harness: Path = HARNESS_KERNELS) -> str:
    """The name of the seed for GPU ``model``: a digest of that model, the starter fork's tree, the
    harness's kernels, the evaluation environment's torch and Triton, and this Python's version (a
    seed made before any of them changed lacks what an evaluation now compiles)."""
    versions = evaluation_environment().distributions
    parts = {
        "gpu": model,
        "starter": tree_digest(tree or starter_tree()),
        "harness": hashlib.sha256(harness.read_bytes()).hexdigest(),
        "torch": versions.get("torch"),
        "triton": versions.get("triton"),
        "python": list(sys.version_info[:2]),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def unpack_seed(archive: bytes, destination: Path) -> int:
    """Write the archive's regular files under ``destination`` (new); refuses links, devices,
    absolute paths and paths out of it. Returns the number of files."""
    count = 0
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = tar.getmembers()
        for member in members:
            parts = Path(member.name).parts
            if not member.isfile() or member.name.startswith("/") or ".." in parts or not parts:
                raise SeedError(f"the seed archive holds {member.name!r}, not a plain file under the cache")
        destination.mkdir(parents=True)
        for member in members:
            target = destination.joinpath(*Path(member.name).parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None  # a regular file, checked above
            with source, open(target, "wb") as out:
                shutil.copyfileobj(source, out)
            os.chmod(target, 0o644)
            count += 1
    for directory, _, _ in os.walk(destination):
        os.chmod(directory, 0o755)
    return count


def _ask(start: SandboxStart, header: dict, deadline: float, what: str, max_payload: int = 0):
    """One request to the seed's child and its reply. Not session.Session: that module imports
    torch, and the validator's worker builds the seed before its head start, which must begin
    before this process pays for torch (quasar/validator/worker.py)."""
    channel = start.child.channel
    assert channel is not None
    try:
        channel.send(header)
        reply, payload = channel.recv(deadline=deadline, max_payload=max_payload)
    except (protocol.ChannelError, OSError) as error:
        raise SeedError(f"the starter fork's child failed while {what}: {error}") from None
    if not reply.get("ok"):
        raise SeedError(f"the starter fork failed while {what}: {str(reply.get('error', ''))[-500:]}")
    return reply, payload


def build_seed(device: str, lengths: Sequence[int], policy: SandboxPolicy, destination: Path) -> int:
    """Run the starter fork at ``lengths`` in a sandbox on ``device`` (no seed of its own) and
    write its Triton cache to ``destination`` (which must not exist; written whole or not at all).
    Returns the number of files. Raises SeedError, or SandboxError where no sandbox can start."""
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    start = SandboxStart(
        sorted(lengths), device, replace(policy, triton_seed=None), pin_cpus=False, repo=starter_tree()
    )
    try:
        child = start.wait()
        if child.isolation != "namespaces":
            raise SeedError("the seed is built in a namespaced sandbox only")
        _ask(start, {"op": "load", "fork_dir": child.fork_dir, "weights_seed": _WEIGHTS_SEED}, deadline, "loading")
        for length in sorted(lengths):
            header = {"op": "run", "seq_len": length, "input_seed": _INPUT_SEED, "basis_seed": _BASIS_SEED, "count": 1}
            _ask(start, header, deadline, f"running T={length}", max_payload=_RUN_PAYLOAD_BYTES)
        _, archive = _ask(start, {"op": "triton_cache"}, deadline, "sending its Triton cache", MAX_SEED_BYTES)
    finally:
        start.close()
    partial = Path(tempfile.mkdtemp(prefix=destination.name + ".", dir=destination.parent))
    try:
        count = unpack_seed(bytes(archive or b""), partial / "seed")
        os.replace(partial / "seed", destination)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return count


# A seed's folder (seed_key) and what a build killed before its end leaves (build_seed's partial
# folder): the names prune_seeds may remove, so a TRITON_SEED_DIR shared with anything else keeps it.
_SEED_NAME = re.compile(r"[0-9a-f]{24}(\.[A-Za-z0-9_]+)?")


def mark_used(seed: Path) -> None:
    """Note that an evaluation uses ``seed`` now (its folder's times, which :func:`prune_seeds` orders by)."""
    now = time.time_ns()
    try:
        os.utime(seed, ns=(now, now))
    except OSError as error:
        logger.debug("could not mark the Triton cache seed %s used: %s", seed, error)


def prune_seeds(folder: Path) -> None:
    """Remove from ``folder`` all seeds but the :data:`MAX_SEEDS` most recently used, and what builds
    killed midway left; the caller holds the folder's lock, so no build is under way."""
    found = [path for path in folder.iterdir() if _SEED_NAME.fullmatch(path.name) and path.is_dir()]
    seeds = sorted((p for p in found if "." not in p.name), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    for path in seeds[MAX_SEEDS:]:
        logger.info("removing the Triton cache seed %s, the least recently used", path)
        shutil.rmtree(path, ignore_errors=True)
    for path in found:
        if "." in path.name:
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def _exclusive(lock: IO) -> Iterator[bool]:
    """Hold the open file ``lock`` exclusively if no other process does; yields whether it is held."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        yield False
        return
    try:
        yield True
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


def ensure_seed(root: str, device: str, lengths: Sequence[int], policy: SandboxPolicy) -> SandboxPolicy:
    """``policy`` with the seed for ``device`` under ``root`` (built first if missing); unchanged
    where seeding is off (``root`` empty, a CPU device, an unknown GPU) or the seed cannot be had
    now (another process is building it, or building failed: said in the log)."""
    if not root or not device.startswith("cuda"):
        return policy
    model = gpu_model(device)
    if model is None:
        return policy
    folder = Path(root).expanduser()
    seed = folder / seed_key(model)
    if not seed.is_dir():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            lock = open(folder / ".lock", "a")  # closed by the with below
        except OSError as error:  # another Unix user's folder (one .env naming it to both)
            logger.warning(
                "cannot build the Triton cache seed in %s (%s): this evaluation compiles everything; give "
                "each Unix user its own TRITON_SEED_DIR",
                folder,
                error.strerror,
            )
            return policy
        with lock, _exclusive(lock) as held:
            if not held:
                logger.info("another process is building the Triton cache seed; this evaluation compiles everything")
                return policy
            if not seed.is_dir():
                compiling = time.monotonic()
                problem = compile_bytecode(evaluation_environment(), python_executable())
                if problem is not None:
                    logger.warning(
                        "some of the evaluation environment's bytecode could not be written (%s): the sandbox "
                        "compiles those modules at every evaluation",
                        problem,
                    )
                logger.info("evaluation environment's bytecode checked in %.1f s", time.monotonic() - compiling)
                logger.info(
                    "building the Triton cache seed for %s from the starter fork (once per GPU model, "
                    "Triton and starter fork) in %s",
                    model,
                    seed,
                )
                try:
                    count = build_seed(device, lengths, policy, seed)
                except QuasarError as error:
                    logger.warning("no Triton cache seed (%s); evaluations compile everything", error)
                    return policy
                logger.info("Triton cache seed built: %d files", count)
                mark_used(seed)
                prune_seeds(folder)
    mark_used(seed)
    return replace(policy, triton_seed=str(seed))
