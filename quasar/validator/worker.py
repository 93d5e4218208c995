"""One evaluation in its own process: ``python -m quasar.validator.worker JOB.json``.

The validator starts one worker per evaluation (one per GPU at a time), so a long or stuck
evaluation never blocks its loop, each sees only its own GPU (``CUDA_VISIBLE_DEVICES``), and
stopping one is a signal. The worker is the validator's own code; the fork's code still runs only
in the harness's sandboxed child below it.

The job file names the fork, commit, target, clone cache and evaluation options; the worker clones
the fork, evaluates it without a claim (the claim check is the validator's, per submission),
deletes the checkout, and writes its outcome as JSON to ``result_path`` (atomically). What does
not need the fork starts first and runs while the fork is cloned (:class:`HeadStart`): the
sandboxed child, before this process imports torch (its start is seconds of importing torch on
one pinned core; no fork code runs in it before the evaluation hands it the fork), and on a thread
the harness's import and the parent's reference work. Outcomes:

- ``{"outcome": "evaluated", "report": EvaluationReport.to_dict(), "content_hash": ...}``
- ``{"outcome": "clone_failed", "error": ...}``: the fork or commit cannot be fetched;
- ``{"outcome": "clone_unavailable", "error": ...}``: this host could not fetch it (its disk or
  memory, the network to the fork's host: quasar/forks.py ``CloneUnavailable``), no fault of the fork;
- ``{"outcome": "refused", "error": ..., "content_hash": ...}``: the evaluation cannot run as
  asked (a target outside the rules' lengths);
- ``{"outcome": "not_here", "error": ...}``: this machine cannot run it (a length this device does
  not take, or whose output area exceeds the sandbox's memory: ``NotOnThisMachine``), no fault of the fork.

``content_hash`` is the normalised content hash of the clone's kernel files
(:func:`kernel_content_hash`, quasar/originality.py), which the validator reports so that the API
can tell a copy of another miner's kernel; null when the fork has no readable kernel directory.

Anything else (a crash, a signal) leaves no result: the validator counts a failed attempt.
SIGTERM stops it cleanly (the sandbox's child is killed); it also arrives when the validator
process dies (``PR_SET_PDEATHSIG``), so no evaluation outlives its validator.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import shutil
import signal
import sys
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any

from quasar import astparse, originality
from quasar.forks import CloneUnavailable, ForkError, clone_at_commit
from quasar.log import setup_logging

logger = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
# Loggers that write at INFO on every evaluation (quiet unless the validator debugs).
PER_EVALUATION_LOGGERS = ("quasar.forks", "quasar.evaluate.harness")
# A fork's kernel directory larger than this is not fingerprinted (no content hash is reported).
MAX_KERNEL_FILES = 2000
MAX_KERNEL_BYTES = 64 * 1024 * 1024


def kernel_content_hash(checkout: Path) -> str | None:
    """The content hash (quasar/originality.py) of the regular files under the checkout's
    ``fla/ops/quasar/`` (symbolic links and ``__pycache__`` left out); None when the directory is
    missing, or holds more than MAX_KERNEL_FILES files or MAX_KERNEL_BYTES bytes."""
    root = checkout / originality.KERNEL_DIR
    if root.is_symlink() or not root.is_dir():
        return None
    files: dict[str, bytes] = {}
    size = 0
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if name != "__pycache__" and not os.path.islink(os.path.join(directory, name))
        )
        for name in names:
            path = Path(directory, name)
            if path.is_symlink() or not path.is_file() or name.endswith(".pyc"):
                continue
            size += path.stat().st_size
            if len(files) >= MAX_KERNEL_FILES or size > MAX_KERNEL_BYTES:
                logger.warning("the kernel directory of %s is too large to fingerprint", checkout)
                return None
            files[path.relative_to(root).as_posix()] = path.read_bytes()
    return originality.content_hash(files)


def options_to_json(options) -> dict[str, Any]:
    """``EvaluationOptions`` as plain JSON data (the inverse of :func:`options_from_json`)."""
    return asdict(options)


def policy_from_json(data: dict[str, Any]):
    """The ``SandboxPolicy`` of :func:`options_to_json`'s ``policy`` (no torch imported)."""
    from quasar.evaluate.sandbox import SandboxPolicy

    tuples: dict[str, tuple[str, ...]] = {
        key: tuple(data[key]) for key in ("extra_readonly_paths", "sys_paths") if key in data
    }
    return SandboxPolicy(**{**data, **tuples})


def options_from_json(data: dict[str, Any]):
    from quasar.evaluate import EvaluationOptions

    values = {**data, "seq_lens": tuple(data["seq_lens"]), "policy": policy_from_json(data["policy"])}
    return EvaluationOptions(**values)


class _Stop:
    """SIGTERM: raise SystemExit at once, and again at the next checkpoint should some library
    swallow the first one (imports run code that catches broadly)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def on_signal(self, signum: int, _frame) -> None:
        self.signum = signum
        raise SystemExit(128 + signum)

    def checkpoint(self, *_event) -> None:
        if self.signum is not None:
            raise SystemExit(128 + self.signum)


_STOP = _Stop()


def _die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the validator dies, even by SIGKILL (Linux); exit if it already has."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        logger.debug("PR_SET_PDEATHSIG is not available here")
    if os.getppid() != parent_pid:
        raise SystemExit("the validator that started this evaluation is gone")


class HeadStart:
    """What the worker starts before its clone ends, for the evaluation to take over.

    The sandboxed child starts at once, from the calling (main) thread, whose life its
    parent-death signal follows (torch-free: quasar/evaluate/start.py); a thread then imports the
    harness (torch) and starts the reference work. A job the
    evaluation will refuse (a length out of range) gets neither, and whatever failed
    here is met again by ``evaluate``, which reports it. :meth:`close` ends both where no
    evaluation took them over (a failed clone).
    """

    def __init__(self, job: dict[str, Any]):
        from quasar.evaluate.options import EvaluationInputError, check_lengths
        from quasar.evaluate.sandbox import SandboxError
        from quasar.evaluate.start import SandboxStart

        options = job["options"]
        self.target = job["target_sequence_length"]
        self.sandbox: SandboxStart | None = None
        self.references = None
        try:
            # Checked first: the start makes (on a GPU, fills) an output area of 2 KiB a token in
            # this process, outside the sandbox's memory limit, which bounds it (options.check_lengths).
            policy = policy_from_json(options["policy"])
            lengths = check_lengths(options["seq_lens"], self.target, options["device"], policy.memory_bytes)
            self.sandbox = SandboxStart(lengths, options["device"], policy, options["pin_cpus"])
        except EvaluationInputError:
            pass  # evaluate() refuses the job with the same error
        except (OSError, KeyError, TypeError, ValueError, SandboxError) as error:
            logger.warning("could not start the sandbox before the clone (%s); the evaluation starts its own", error)
        self._thread = threading.Thread(target=self._prepare, args=(options,), name="quasar-head-start", daemon=True)
        self._thread.start()

    def _prepare(self, options: dict[str, Any]) -> None:
        # torch parses its own source as it is imported; the fork's content hash, parsed on the main
        # thread meanwhile, could break those parses (quasar/astparse.py), so it waits.
        with astparse.parses_held():
            from quasar.evaluate import EvaluationInputError, start_references

        try:
            self.references = start_references(self.target, options_from_json(options))
        except EvaluationInputError:
            pass  # evaluate() refuses the job with the same error
        except Exception as error:  # evaluate() starts its own and meets the same fault
            logger.warning("could not start the reference work before the clone: %s", error)

    def take(self) -> tuple[Any, Any]:
        """The started sandbox and reference work (either may be None), for ``evaluate`` to own."""
        self._thread.join()
        found = self.sandbox, self.references
        self.sandbox = self.references = None
        return found

    def close(self) -> None:
        """Kill the child and wait for the reference work, where no evaluation took them."""
        sandbox, references = self.take()
        if sandbox is not None:
            sandbox.close()
        if references is not None:
            references.join()


def with_triton_seed(job: dict[str, Any]) -> dict[str, Any]:
    """The job with its sandbox policy given the Triton cache seed for its GPU, built first where
    missing (quasar/evaluate/triton_seed.py): before the head start, whose child copies the seed
    at its start. Unchanged where seeding is off or the seed cannot be had."""
    from quasar.evaluate.options import check_lengths
    from quasar.evaluate.triton_seed import ensure_seed

    options = job["options"]
    try:
        # A seed is built at the job's lengths (the output area as in HeadStart): checked first.
        given = policy_from_json(options["policy"])
        lengths = check_lengths(
            options["seq_lens"], job["target_sequence_length"], options["device"], given.memory_bytes
        )
        policy = ensure_seed(options.get("triton_seed_dir", ""), options["device"], lengths, given)
    except (KeyError, TypeError, ValueError, OSError) as error:
        logger.warning("no Triton cache seed for this evaluation: %s", error)
        return job
    return job if policy is given else {**job, "options": {**options, "policy": asdict(policy)}}


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    """Start what needs no fork, clone, evaluate and clean up; returns the outcome to write."""
    job = with_triton_seed(job)
    head_start = HeadStart(job)
    try:
        try:
            checkout = clone_at_commit(
                job["fork_url"],
                job["commit_hash"],
                job["cache_dir"],
                allow_local=job["allow_local"],
                timeout_s=job["clone_timeout_s"],
            )
        except CloneUnavailable as error:
            return {"outcome": "clone_unavailable", "error": str(error)}
        except ForkError as error:
            return {"outcome": "clone_failed", "error": str(error)}
        try:
            content_hash = kernel_content_hash(checkout.path)
            from quasar.evaluate import EvaluationInputError, NotOnThisMachine, evaluate

            options = options_from_json(job["options"])
            _STOP.checkpoint()
            # Taken only now: from here on evaluate() owns them and closes them on every path; a stop
            # or an error before leaves them to head_start.close().
            sandbox, references = head_start.take()
            try:
                # Progress events double as stop checkpoints: the harness closes its sandbox on the way out.
                report = evaluate(
                    checkout.path,
                    job["target_sequence_length"],
                    None,
                    options,
                    progress=_STOP.checkpoint,
                    sandbox=sandbox,
                    references=references,
                )
            except NotOnThisMachine as error:
                return {"outcome": "not_here", "error": str(error)}
            except EvaluationInputError as error:
                return {"outcome": "refused", "error": str(error), "content_hash": content_hash}
            return {"outcome": "evaluated", "report": report.to_dict(), "content_hash": content_hash}
        finally:
            shutil.rmtree(checkout.path, ignore_errors=True)
    finally:
        head_start.close()


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as out:
        json.dump(data, out, allow_nan=False)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m quasar.validator.worker JOB.json (started by the validator)", file=sys.stderr)
        return 2
    job = json.loads(Path(argv[0]).read_text())
    signal.signal(signal.SIGTERM, _STOP.on_signal)
    _die_with_parent(job["parent_pid"])
    setup_logging(job.get("debug", False))
    if not job.get("debug", False):
        # Lines every evaluation writes to the validator's stderr (pm2's log): its clone, figures per
        # length and verdict, which the validator's result line and its report already carry.
        for name in PER_EVALUATION_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    outcome = run_job(job)
    _STOP.checkpoint()  # a stopped evaluation writes nothing, even if it got this far
    write_atomically(Path(job["result_path"]), outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main())
