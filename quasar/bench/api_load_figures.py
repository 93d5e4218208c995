"""The figures of ``quasar bench api-load`` (quasar/bench/api_load.py): one run's outcome, its
latency percentiles by second of the window, the targets it is held to, and the tables that show
them at 80 columns."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rich.table import Table

from quasar.bench.api_load_traffic import Stream

TARGETS = {  # backend: (submissions/s, submission p99 ms); reads: 1,000/s under 50 ms on both
    "sqlite": (300, 100.0),
    "postgresql": (200, 150.0),
}
READ_TARGET = (1000, 50.0)
BACKEND_LABELS = {"sqlite": "SQLite", "postgresql": "PG"}


@dataclass(frozen=True)
class Figures:
    """One run of one backend with one number of workers."""

    backend: str
    workers: int
    seconds: float
    offered_rate: float
    submissions_per_sec: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    errors: dict[str, int]
    lost: int
    offered_read_rate: float
    reads_per_sec: float
    read_p50_ms: float
    read_p99_ms: float
    read_errors: dict[str, int]
    server_cpu_ms_per_request: float
    client_cpu_share: float
    load_average: float
    primed_s: float | None = None  # seconds the first renders took before the traffic; None: --cold
    block_change_s: float = 0.0  # second of the window at which the chain moved to the next block
    machine_ms: float = 0.0  # the reference loop's time before the run (machine_speed_ms)
    warmup_s: float = 0.0
    # (second of the window, negative in the warm-up; submission p50, p99, read p50, p99 in ms) of the
    # requests scheduled in it
    timeline: tuple[tuple[int, float, float, float, float], ...] = ()


def timeline(
    submitted: Stream, read: Stream, seconds: float, warmup: float = 0.0
) -> tuple[tuple[int, float, float, float, float], ...]:
    """Latency percentiles (ms) of the requests scheduled in each second of the warm-up (negative
    seconds) and of the window: where slow requests were (a start-up, a block change), which the
    whole run's p99 hides."""
    return tuple(
        (second, *_second_percentiles(submitted, second), *_second_percentiles(read, second))
        for second in range(-math.ceil(warmup), math.ceil(seconds))
    )


def _second_percentiles(stream: Stream, second: int) -> tuple[float, float]:
    """The p50 and p99 (ms) of ``stream``'s requests scheduled in ``second``; NaN when there are none."""
    inside = sorted(latency for latency, at in zip(stream.latencies, stream.scheduled) if math.floor(at) == second)
    return (1000 * statistics.median(inside), 1000 * percentile(inside, 0.99)) if inside else (math.nan, math.nan)


def timeline_table(run: Figures) -> Table:
    table = Table(
        title=f"{BACKEND_LABELS[run.backend]} x{run.workers}: latency by second of the window (ms)",
        caption="* the chain moved to a new block in this second",
    )
    for heading in ("second", "submit p50", "submit p99", "read p50", "read p99"):
        table.add_column(heading, justify="right")
    for second, *cells in run.timeline:
        mark = " *" if second == math.floor(run.block_change_s) else ""
        table.add_row(f"{second}{mark}", *(f"{cell:,.0f}" for cell in cells))
    return table


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, min(len(sorted_values), round(fraction * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def meets_targets(r: Figures) -> bool:
    rate, p99 = TARGETS[r.backend]
    return (
        r.submissions_per_sec >= rate
        and r.p99_ms < p99
        and r.lost == 0
        and not r.errors
        and (
            r.offered_read_rate == 0
            or (r.reads_per_sec >= READ_TARGET[0] and r.read_p99_ms < READ_TARGET[1] and not r.read_errors)
        )
    )


def figures_table(results: Sequence[Figures]) -> Table:
    """A column per backend and number of workers, a row per figure: the median of its runs (errors
    and lost submissions summed), so six configurations fit 80 columns; the JSON keeps every run."""
    groups: dict[tuple[str, int], list[Figures]] = {}
    for r in results:
        groups.setdefault((r.backend, r.workers), []).append(r)
    table = Table(show_header=True, header_style="bold")
    table.add_column("figure")
    for backend, workers in groups:
        table.add_column(f"{BACKEND_LABELS[backend]}\n×{workers}", justify="right")

    def median(value: Callable[[Figures], float], form: str) -> Callable[[list[Figures]], str]:
        return lambda runs: format(statistics.median(value(r) for r in runs), form)

    def errors(counts: Callable[[Figures], dict[str, int]]) -> Callable[[list[Figures]], str]:
        def cell(runs: list[Figures]) -> str:
            total: dict[str, int] = {}
            for r in runs:
                for key, count in counts(r).items():
                    total[key] = total.get(key, 0) + count
            return ", ".join(f"{k}: {v}" for k, v in sorted(total.items())) or "none"

        return cell

    rows = (
        ("submit/s", median(lambda r: r.submissions_per_sec, ",.0f")),
        ("submit p50 ms", median(lambda r: r.p50_ms, ".1f")),
        ("submit p99 ms", median(lambda r: r.p99_ms, ".1f")),
        ("submit max ms", median(lambda r: r.max_ms, ".1f")),
        ("submit errors", errors(lambda r: r.errors)),
        ("lost", lambda runs: str(sum(r.lost for r in runs))),
        ("reads/s", median(lambda r: r.reads_per_sec, ",.0f")),
        ("read p50 ms", median(lambda r: r.read_p50_ms, ".1f")),
        ("read p99 ms", median(lambda r: r.read_p99_ms, ".1f")),
        ("read errors", errors(lambda r: r.read_errors)),
        ("server CPU ms/req", median(lambda r: r.server_cpu_ms_per_request, ".2f")),
        ("load average", median(lambda r: r.load_average, ".2f")),
        ("reference loop ms", median(lambda r: r.machine_ms, ".0f")),
        ("targets met", lambda runs: f"{sum(meets_targets(r) for r in runs)} of {len(runs)}"),
    )
    for name, cell in rows:
        table.add_row(name, *(cell(runs) for runs in groups.values()))
    return table
