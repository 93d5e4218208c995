"""``python -m quasar.imports REPO [--profile core|strict] [--require-cu] [--json]``: the check of a
fork checked out at REPO, as a table or as JSON; exit status 0 iff it passes, 1 if not, 2 for a
usage error."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from quasar.imports.findings import ImportReport
from quasar.imports.required import PROFILES
from quasar.imports.validate import validate_repo


def _print_report(report: ImportReport, repo: str, profile: str) -> None:
    """The findings as a table (when there are any), then PASS or FAIL and the counts."""
    console = Console()
    if report.errors or report.warnings:
        table = Table(title=f"Import check of {repo} (profile {profile})")
        for column in ("level", "where", "rule", "message"):
            table.add_column(column, overflow="fold")
        for level, style, items in (("error", "red", report.errors), ("warning", "yellow", report.warnings)):
            for finding in items:
                table.add_row(
                    Text(level, style=style), Text(finding.location), Text(finding.rule.value), Text(finding.message)
                )
        console.print(table)
    verdict = Text("PASS", style="bold green") if report.ok else Text("FAIL", style="bold red")
    summary = (
        f" {len(report.checked_files)} files checked, {len(report.errors)} errors, {len(report.warnings)} warnings"
    )
    console.print(verdict + Text(summary))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m quasar.imports``: 0 iff the fork passes, 1 if not, 2 for a usage error."""
    parser = argparse.ArgumentParser(
        prog="python -m quasar.imports",
        description="Check a QUASAR fork's imports (docs/rules.md section 4 step 2).",
    )
    parser.add_argument("repo", help="path of the fork's checkout")
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="core", help="required-import profile (default %(default)s)"
    )
    parser.add_argument("--require-cu", action="store_true", help="a repository without a *.cu file fails")
    parser.add_argument(
        "--json", action="store_true", dest="as_json", help='print {"ok", "errors", "warnings"} as JSON'
    )
    args = parser.parse_args(argv)
    try:
        report = validate_repo(args.repo, profile=args.profile, require_cu=args.require_cu)
    except NotADirectoryError as error:
        parser.error(str(error))
    if args.as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        _print_report(report, args.repo, args.profile)
    return 0 if report.ok else 1
