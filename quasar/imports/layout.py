"""The fork's layout: which files are checked, which modules are forbidden, and how a repo-relative
path, a dotted module name and a relative import map onto each other."""

from __future__ import annotations

from pathlib import PurePosixPath

QUASAR_DIR = "fla/ops/quasar"
TARGET_FILES = (
    "chunk.py",
    "chunk_intra_token_parallel.py",
    "forward_substitution.py",
    "fused_recurrent.py",
    "gate.py",
)
CHUNK_FILE = f"{QUASAR_DIR}/chunk.py"
LAYER_FILE = "fla/layers/quasar.py"
FORBIDDEN_MODULES = ("fla.ops.gla", "fla.ops.kda")


def has_prefix(dotted: str, prefix: str) -> bool:
    """Whether ``dotted`` is ``prefix`` or a name below it (``fla.ops.kda.chunk`` is below ``fla.ops.kda``)."""
    return dotted == prefix or dotted.startswith(prefix + ".")


def forbidden_root(dotted: str) -> str | None:
    """The forbidden module that ``dotted`` is or lies below, by name alone; else None."""
    for root in FORBIDDEN_MODULES:
        if has_prefix(dotted, root):
            return root
    return None


def module_name_for(relative_path: str) -> str:
    """The dotted module of a repo-relative ``.py`` path: ``fla/ops/quasar/__init__.py`` is ``fla.ops.quasar``."""
    parts = list(PurePosixPath(relative_path).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_package_file(relative_path: str) -> bool:
    """Whether a repo-relative ``.py`` path is a package's ``__init__.py`` (its relative imports start there)."""
    return PurePosixPath(relative_path).name == "__init__.py"


def module_paths(module: str) -> list[str]:
    """Where a module's source lies, repo-relative: ``a/b.py`` or ``a/b/__init__.py``."""
    path = module.replace(".", "/")
    return [f"{path}.py", f"{path}/__init__.py"]


def resolve_relative(module: str | None, level: int, current_module: str, is_package: bool) -> str | None:
    """The absolute module of ``from {'.' * level}{module} import …`` written in ``current_module``.

    None when the import climbs above the top-level package (Python raises ImportError there).
    """
    if level == 0:
        return module or ""
    package = current_module.split(".") if is_package else current_module.split(".")[:-1]
    keep = len(package) - (level - 1)
    if keep < 1:
        return None
    parts = package[:keep] + (module.split(".") if module else [])
    return ".".join(parts)
