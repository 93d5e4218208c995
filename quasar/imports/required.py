"""The required-imports rule (``missing-required-import``): ``chunk.py`` imports every name of the
profile (``core`` by default, or ``strict``: the miner guide's twelve lines) at module level."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from quasar.imports.findings import Finding, Rule
from quasar.imports.layout import is_package_file, resolve_relative
from quasar.imports.parsing import module_level_statements, parse_source


@dataclass(frozen=True)
class RequiredImport:
    """``import module`` (``name`` None) or ``from module import name``; ``alias`` is only how the guide writes it."""

    module: str
    name: str | None = None
    alias: str | None = None

    def __str__(self) -> str:
        text = f"import {self.module}" if self.name is None else f"from {self.module} import {self.name}"
        return f"{text} as {self.alias}" if self.alias else text


_FLA_UTILS_CORE = (
    "autocast_custom_bwd",
    "autocast_custom_fwd",
    "autotune_cache_kwargs",
    "check_shared_mem",
    "input_guard",
)
PROFILES: dict[str, tuple[RequiredImport, ...]] = {
    "core": tuple(RequiredImport("fla.utils", name) for name in _FLA_UTILS_CORE),
    # The twelve lines of the miner guide, in its order.
    "strict": (
        RequiredImport("torch"),
        RequiredImport("torch.nn.functional", alias="F"),
        RequiredImport("triton"),
        RequiredImport("triton.language", alias="tl"),
        RequiredImport("fla.ops.utils.index", "prepare_chunk_indices"),
        RequiredImport("fla.ops.quasar.forward_substitution", "forward_substitution_kernel"),
        RequiredImport("fla.utils", "IS_AMD"),
        *(RequiredImport("fla.utils", name) for name in _FLA_UTILS_CORE),
    ),
}


def require_known_profile(profile: str) -> None:
    """Raises ValueError naming the profiles when ``profile`` is not one of :data:`PROFILES`."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")


# What an import statement provides and what a required import asks for, in one shape:
# ("module", dotted) for a module bound under any name, ("name", module, name) for a name from it.
def _provided_keys(statement: ast.stmt, module_name: str, is_package: bool) -> set[tuple]:
    keys: set[tuple] = set()
    if isinstance(statement, ast.Import):
        keys |= {("module", alias.name) for alias in statement.names}
    elif isinstance(statement, ast.ImportFrom):
        base = resolve_relative(statement.module, statement.level, module_name, is_package)
        if base:
            for alias in statement.names:
                if alias.name != "*":
                    keys |= {("name", base, alias.name), ("module", f"{base}.{alias.name}")}
    return keys


def _required_key(required: RequiredImport) -> tuple:
    return ("module", required.module) if required.name is None else ("name", required.module, required.name)


def missing_required_imports(tree: ast.Module, module_name: str, filename: str, profile: str) -> list[Finding]:
    """The imports of ``profile`` that the parsed file lacks at module level, in the profile's order.

    A finding's line is where the file imports the name only in a place that does not run on
    import (a function, a class, ``if TYPE_CHECKING:``, an ``except`` handler); None when nowhere.
    """
    is_package = is_package_file(filename)
    at_module_level: set[tuple] = set()
    for statement in module_level_statements(tree.body):
        at_module_level |= _provided_keys(statement, module_name, is_package)
    elsewhere: dict[tuple, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for key in _provided_keys(node, module_name, is_package):
                elsewhere[key] = min(elsewhere.get(key, node.lineno), node.lineno)
    findings = []
    for required in PROFILES[profile]:
        key = _required_key(required)
        if key in at_module_level:
            continue
        message = f"`{required}` is required at module level (profile {profile})"
        line = elsewhere.get(key)
        if line:
            message += "; it is imported here only inside a function, class or block that does not run on import"
        findings.append(Finding(filename, line, Rule.MISSING_REQUIRED_IMPORT, message))
    return findings


def check_required_imports(source: str, module_name: str, filename: str, profile: str = "core") -> list[Finding]:
    """Required imports of ``profile`` that ``source`` lacks at module level (or why it cannot be parsed)."""
    require_known_profile(profile)
    parsed = parse_source(source, filename)
    if isinstance(parsed, Finding):
        return [parsed]
    return missing_required_imports(parsed, module_name, filename, profile)
