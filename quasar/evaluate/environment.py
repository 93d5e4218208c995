"""The evaluation environment: the only packages a fork's code can import in the sandbox.

A miner's fork is a flash-linear-attention tree, and it runs with the Python packages every
validator has for it: :data:`EVALUATION_PACKAGES` and what they need, as installed from
``pyproject.toml``'s dependencies (torch and triton, pinned; transformers, einops and numpy), and
nothing else of the validator's virtual environment (bittensor, the API's packages, requests…),
whatever else the validator has installed. The child runs without ``site`` (``python -I -S``)
with an import path of the harness, these packages and the fork; in the namespaced sandbox the
rest of the validator's site-packages folders do not exist (sandbox.py), so a fork cannot reach
them by adding a path either. The same rule on a miner's machine makes its local result the
validator's.

The packages are found from the installed distributions' metadata: each package's requirements
(markers evaluated for this machine, no extras), recursively, and each distribution's top-level
entries from its RECORD (modules, packages, bundled libraries, and its ``.dist-info``, which
transformers reads to check versions). Entries are grouped by the site folder they come from,
in this process's ``sys.path`` order, so a package found in two folders resolves as it does here.
"""

from __future__ import annotations

import csv
import functools
import importlib.metadata
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# What a fork may import besides its own fla package and the standard library (docs/miner.md, "What a
# fork may import"): upstream fla imports einops and transformers at `import fla`.
EVALUATION_PACKAGES = ("torch", "triton", "einops", "transformers", "numpy")


@dataclass(frozen=True)
class Site:
    """The entries (top-level names) of one site folder that belong to the environment."""

    path: str
    entries: tuple[str, ...]


@dataclass(frozen=True)
class EvaluationEnvironment:
    """The environment's distributions (name -> version), their entries by site folder, and the
    packages of :data:`EVALUATION_PACKAGES` that are not installed here."""

    distributions: dict[str, str]
    sites: tuple[Site, ...]
    missing: tuple[str, ...]

    def describe(self) -> str:
        """One line for the report: the named packages' versions and how many others they need."""
        named = [
            f"{name} {self.distributions[canonical(name)]}"
            for name in EVALUATION_PACKAGES
            if canonical(name) in self.distributions
        ]
        others = len(self.distributions) - len(named)
        text = ", ".join(named) + (f" and {others} packages they need" if others else "")
        if self.missing:
            text += f" ({', '.join(self.missing)} not installed)"
        return text


def canonical(name: str) -> str:
    """A distribution name as packaging normalises it (``Typing_Extensions`` -> ``typing-extensions``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed() -> dict[str, Path]:
    """Every installed distribution's metadata folder by canonical name, the first on ``sys.path``
    winning as it does for imports (found from the folders' names: reading each one's metadata
    to learn its name costs a third of a second in a large environment)."""
    found: dict[str, Path] = {}
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for name in sorted(names):
            stem, dot, suffix = name.rpartition(".")
            if dot and suffix in ("dist-info", "egg-info"):
                found.setdefault(canonical(stem.split("-", 1)[0]), Path(entry or ".") / name)
    return found


def _metadata(folder: Path) -> tuple[str, list[str]]:
    """The version and the requirement lines of a distribution's METADATA (or PKG-INFO) headers."""
    text = ""
    for name in ("METADATA", "PKG-INFO"):
        try:
            text = (folder / name).read_text(encoding="utf-8", errors="replace")
            break
        except OSError:
            continue
    version, requirements = "", []
    for line in text.splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        if key == "Version":
            version = value.strip()
        elif key == "Requires-Dist":
            requirements.append(value.strip())
    return version, requirements


def _required_names(lines: list[str]) -> list[str]:
    """Names of what these requirement lines ask for on this machine (no extras)."""
    from packaging.requirements import InvalidRequirement, Requirement

    names = []
    for line in lines:
        if re.search(r"\bextra\s*==", line):
            continue  # an extra's requirement (most of a package's lines); never installed for these
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        names.append(requirement.name)
    return names


def _entries(distribution: importlib.metadata.Distribution) -> tuple[str, set[str]]:
    """The site folder of ``distribution`` and its top-level entries there."""
    site = os.path.normpath(str(distribution.locate_file("")))
    entries: set[str] = set()
    # RECORD read as text: the first component of each path (torch lists some 15,000 files, which
    # Distribution.files would make into as many path objects).
    for line in (distribution.read_text("RECORD") or "").splitlines():
        path = next(csv.reader([line]))[0] if line.startswith('"') else line.split(",", 1)[0]
        first = path.split("/", 1)[0]
        if first and first not in ("..", "__pycache__") and not first.endswith(".pth"):
            entries.add(first)
    if not entries:
        # No RECORD (a system package): its top_level.txt and its metadata folder.
        top_level = distribution.read_text("top_level.txt") or ""
        entries.update(line.strip() for line in top_level.splitlines() if line.strip())
        metadata_folder = getattr(distribution, "_path", None)
        if metadata_folder is not None:
            entries.add(os.path.basename(str(metadata_folder)))
    return site, {entry for entry in entries if os.path.lexists(os.path.join(site, entry))}


@functools.cache
def evaluation_environment(roots: tuple[str, ...] = EVALUATION_PACKAGES) -> EvaluationEnvironment:
    """The environment of ``roots`` and everything they require, as installed for this process."""
    installed = _installed()
    versions: dict[str, str] = {}
    by_site: dict[str, set[str]] = {}
    missing = []
    pending = list(roots)
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        key = canonical(name)
        if key in seen:
            continue
        seen.add(key)
        if key not in installed:
            if name in roots:
                missing.append(name)
            continue
        versions[key], requirements = _metadata(installed[key])
        site, entries = _entries(importlib.metadata.PathDistribution(installed[key]))
        by_site.setdefault(site, set()).update(entries)
        pending.extend(_required_names(requirements))
    order = {os.path.normpath(path): index for index, path in enumerate(sys.path)}
    sites = tuple(
        Site(path, tuple(sorted(entries)))
        for path, entries in sorted(by_site.items(), key=lambda item: order.get(item[0], len(order)))
    )
    return EvaluationEnvironment(dict(sorted(versions.items())), sites, tuple(sorted(missing)))


def compile_bytecode(environment: EvaluationEnvironment, python: str, timeout_s: float = 600.0) -> str | None:
    """Write the bytecode the environment's modules lack, beside their sources, with the child's
    interpreter ``python`` on every core; returns None, or why it could not (said in the log).

    The sandboxed child never writes bytecode (its root is read-only), so a module without any is
    compiled from source at every evaluation: an install made with ``PYTHONDONTWRITEBYTECODE`` or
    ``--no-compile`` (container images often are) leaves torch and sympy so, and importing a real
    fla tree then costs several seconds more on the child's one core. pip writes the same files at
    install; modules that already have bytecode are only checked."""
    targets = [
        os.path.join(site.path, entry)
        for site in environment.sites
        for entry in site.entries
        if entry.endswith(".py") or ("." not in entry and os.path.isdir(os.path.join(site.path, entry)))
    ]
    if not targets:
        return None
    command = [python, "-m", "compileall", "-q", "-j", "0", *targets]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode != 0:
        # compileall fails on a folder it cannot write (a system install) or a file that does not compile.
        lines = (done.stdout + done.stderr).strip().splitlines()
        return (
            f"{lines[0].strip()} {lines[-1].strip()}" if lines else f"compileall exited with status {done.returncode}"
        )
    return None
