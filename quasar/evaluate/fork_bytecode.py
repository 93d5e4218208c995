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

import json
import os
import py_compile
import sys

# The sandbox's own setup steps (standard library only, as this script): the same cgroups, limits
# and uid as the child's, by the same code.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sandbox_init

EXIT_NOT_CONFINED = 1


def confine(config: dict) -> None:
    """Join the cgroups, set the limits, drop to the uid, then die with the parent (raises
    sandbox_init.SetupError or OSError where a step fails)."""
    sandbox_init.join_cgroups(config)
    sandbox_init.set_rlimits(config["rlimits"])
    uid = config["uid"]
    if uid is not None:
        sandbox_init.drop_privileges({"mode": "root", "uid": uid, "gid": uid})
    sandbox_init.die_with_parent()  # after the uid changes, which clears it


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
    except (sandbox_init.SetupError, OSError):
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
            sandbox_init.die_with_parent()  # a forked process does not inherit it
            compile_share(share, config["shown"])
            os._exit(0)
        started.append(pid)
    compile_share(shares[0], config["shown"])
    for pid in started:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
