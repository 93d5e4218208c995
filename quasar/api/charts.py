"""Charts for the dashboard, drawn on the server as inline SVG (no script, no network at run time).

Pure functions from figures to SVG text; every label is escaped here, so a chart can be placed in
a page as it is. The SVG scales to its container's width (``viewBox``, no fixed size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 640, 280
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 16, 48
PALETTE = ("#3b82f6", "#f59e0b", "#10b981", "#a855f7", "#ef4444", "#14b8a6")
FAILED_COLOUR = "#dc2626"


@dataclass(frozen=True)
class Series:
    """One named row of values over the chart's categories (None: no value there); ``failed`` marks
    categories drawn in the failure colour (a length that was wrong, for instance)."""

    name: str
    values: Sequence[float | None]
    failed: Sequence[bool] = ()


def compact(value: float) -> str:
    """``1234567`` as ``1.23M``: short axis and bar labels."""
    magnitude = abs(value)
    for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if magnitude >= limit:
            return f"{value / limit:.3g}{suffix}"
    return f"{value:.3g}"


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^n that is at least ``value`` (an axis top)."""
    if value <= 0:
        return 1.0
    base = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * base * (1 + 1e-9):
            return step * base
    return 10 * base


def _frame(title: str, top: float, unit: str) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
             f'class="chart" aria-label="{escape(title)}"><title>{escape(title)}</title>']
    for tick in range(5):
        value = top * tick / 4
        y = TOP + plot_h - plot_h * tick / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" class="grid"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" class="axis">{compact(value)}</text>')
    parts.append(f'<text x="14" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" class="axis" '
                 f'transform="rotate(-90 14 {TOP + plot_h / 2:.1f})">{escape(unit)}</text>')
    return parts


def bar_chart(title: str, categories: Sequence[str], series: Sequence[Series], unit: str) -> str:
    """Grouped bars: one group per category, one bar per series, each bar labelled with its value."""
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = _frame(title, top, unit)
    group_w = plot_w / max(1, len(categories))
    bar_w = group_w * 0.7 / max(1, len(series))
    for index, category in enumerate(categories):
        x0 = LEFT + group_w * index + group_w * 0.15
        for number, item in enumerate(series):
            value = item.values[index] if index < len(item.values) else None
            x = x0 + bar_w * number
            if value is None:
                parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{TOP + plot_h - 4}" text-anchor="middle" '
                             f'class="axis">n/a</text>')
                continue
            failed = index < len(item.failed) and item.failed[index]
            colour = FAILED_COLOUR if failed else PALETTE[number % len(PALETTE)]
            height = plot_h * value / top
            y = TOP + plot_h - height
            label = f"{item.name}: {category}: {value:,.0f} {unit}" + (" (wrong output)" if failed else "")
            parts.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" height="{height:.1f}" '
                         f'fill="{colour}" rx="2"><title>{escape(label)}</title></rect>')
            parts.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" '
                         f'class="value">{compact(value)}</text>')
        parts.append(f'<text x="{LEFT + group_w * (index + 0.5):.1f}" y="{HEIGHT - BOTTOM + 18}" '
                     f'text-anchor="middle" class="axis">{escape(category)}</text>')
    parts.append(_legend(series))
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, labels: Sequence[str], values: Sequence[float], unit: str,
               failed: Sequence[bool] = ()) -> str:
    """One line through ``values`` at ``labels`` (a miner's figure per round), points labelled;
    ``failed`` points are drawn in the failure colour."""
    top = nice_ceiling(max(values, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    parts = _frame(title, top, unit)
    step = plot_w / max(1, len(values))
    points = [(LEFT + step * (index + 0.5), TOP + plot_h - plot_h * value / top) for index, value in enumerate(values)]
    if len(points) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="2.5"/>')
    for index, ((x, y), label, value) in enumerate(zip(points, labels, values)):
        bad = index < len(failed) and failed[index]
        colour = FAILED_COLOUR if bad else PALETTE[0]
        parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}">'
                     f'<title>{escape(f"{label}: {value:,.0f} {unit}")}</title></circle>')
        parts.append(f'<text x="{x:.1f}" y="{y - 9:.1f}" text-anchor="middle" class="value">{compact(value)}</text>')
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + 18}" text-anchor="middle" '
                     f'class="axis">{escape(label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _legend(series: Sequence[Series]) -> str:
    parts, x = [], LEFT
    for number, item in enumerate(series):
        parts.append(f'<rect x="{x}" y="{HEIGHT - 18}" width="10" height="10" fill="{PALETTE[number % len(PALETTE)]}"/>'
                     f'<text x="{x + 14}" y="{HEIGHT - 9}" class="axis">{escape(item.name)}</text>')
        x += 24 + 7 * len(item.name)
    return "".join(parts)
