"""Compile the fork copy's Python sources to bytecode, within bounds, beside the import check.

Started by sandbox_contents.compile_fork_copy as ``python -I -S fork_bytecode.py CONFIG_JSON`` in
the fork copy's folder, with the sources to compile on stdin (paths relative to that folder, each
ended by a NUL byte; sandbox_contents picked them: regular ``.py`` files up to a size cap).
Standard library only. It runs outside the sandbox's namespaces but not outside its limits: before
it reads a source it joins the sandbox's cgroups (``cgroup_procs``: its memory and processes count
against the sandbox's, and the cgroup's removal kills it), sets its resource limits (``rlimits``:
address space and CPU time bound each of its processes, with or without a cgroup) and, started as
root, becomes the sandbox's own uid (``uid``). Then ``workers`` processes compile a share of the
sources each, the bytecode naming them under ``shown`` (the fork's folder as the child sees it).
The sources are only compiled, never run. One that does not compile within the limits (a syntax
error, a memory error) is skipped: the child compiles it if it imports it, as Python always does,
inside the sandbox. Exits with status 1, compiling nothing, where it cannot be confined so.
"""

from __future__ import annotations

import ctypes
import json
import os
import py_compile
import resource
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_NOT_CONFINED = 1

_libc = ctypes.CDLL(None)


def die_with_parent() -> None:
    """SIGKILL when the parent process dies. Set after the uid changes (which clears it) and in
    each worker (a forked process does not inherit it)."""
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def confine(config: dict) -> None:
    """Join the cgroups, set the limits, drop to the uid (raises OSError or ValueError where a step fails)."""
    for procs in config["cgroup_procs"]:
        with open(procs, "w") as joining:
            joining.write("0")
    for name, value in config["rlimits"].items():
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (value, value))
    uid = config["uid"]
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    die_with_parent()


def compile_share(sources: list[str], shown: str) -> None:
    for source in sources:
        try:
            py_compile.compile(source, dfile=os.path.join(shown, source), doraise=True)
        except Exception:  # left to the child (the module docstring)
            continue


def main() -> None:
    config = json.loads(sys.argv[1])
    try:
        confine(config)
    except (OSError, ValueError):  # ValueError: a limit above the hard one this user cannot raise
        sys.exit(EXIT_NOT_CONFINED)
    sources = [os.fsdecode(path) for path in sys.stdin.buffer.read().split(b"\0") if path]
    workers = max(1, min(int(config["workers"]), len(sources)))
    shares = [sources[index::workers] for index in range(workers)]
    started = []
    for share in shares[1:]:
        try:
            pid = os.fork()
        except OSError:
            compile_share(share, config["shown"])  # no more processes to be had: this one compiles it
            continue
        if pid == 0:
            die_with_parent()
            compile_share(share, config["shown"])
            os._exit(0)
        started.append(pid)
    compile_share(shares[0], config["shown"])
    for pid in started:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
