"""Charts for the dashboard, drawn on the server as inline SVG (no script, no network at run time).

Pure functions from figures to SVG text; every label is escaped here, so a chart can be placed in
a page as it is. The SVG scales to its container's width (``viewBox``, no fixed size).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#3b82f6", "#f59e0b", "#10b981", "#a855f7", "#ef4444", "#14b8a6")
FAILED_COLOUR = "#dc2626"


@dataclass(frozen=True)
class Layout:
    """A chart's drawing box in SVG units and its text size: the page scales the box to its width,
    so a phone gets a narrower box (and so larger text) than a desktop."""

    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    font: int
    char_width: float  # a label character's advance, for laying out the legend

    @property
    def plot_width(self) -> float:
        return self.width - self.left - self.right

    @property
    def plot_height(self) -> float:
        return self.height - self.top - self.bottom


WIDE = Layout(width=760, height=300, left=64, right=16, top=22, bottom=56, font=12, char_width=7.2)
# NARROW's left margin holds a 4-character tick label (500k) clear of the rotated unit beside it.
NARROW = Layout(width=360, height=260, left=54, right=8, top=22, bottom=62, font=11, char_width=7.2)


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


def _frame(title: str, top: float, unit: str, layout: Layout, legend_rows: int = 0) -> list[str]:
    height = layout.height + legend_rows * (layout.font + 6)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {layout.width} {height}" role="img" '
        f'class="chart" font-size="{layout.font}" aria-label="{escape(title)}"><title>{escape(title)}</title>'
    ]
    for tick in range(5):
        value = top * tick / 4
        y = layout.top + layout.plot_height * (1 - tick / 4)
        parts.append(
            f'<line x1="{layout.left}" y1="{y:.1f}" x2="{layout.width - layout.right}" y2="{y:.1f}" class="grid"/>'
        )
        parts.append(
            f'<text x="{layout.left - 6}" y="{y + 4:.1f}" text-anchor="end" class="axis">{compact(value)}</text>'
        )
    middle = layout.top + layout.plot_height / 2
    parts.append(
        f'<text x="{layout.font}" y="{middle:.1f}" text-anchor="middle" class="axis" '
        f'transform="rotate(-90 {layout.font} {middle:.1f})">{escape(unit)}</text>'
    )
    return parts


def bar_chart(title: str, categories: Sequence[str], series: Sequence[Series], unit: str, layout: Layout = WIDE) -> str:
    """Grouped bars: one group per category, one bar per series, each bar labelled with its value."""
    values = [v for s in series for v in s.values if v is not None]
    top = nice_ceiling(max(values, default=0.0))
    legend = _legend_rows(series, layout)
    parts = _frame(title, top, unit, layout, len(legend))
    group_w = layout.plot_width / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    base = layout.top + layout.plot_height
    for index, category in enumerate(categories):
        x0 = layout.left + group_w * index + group_w * 0.1
        for number, item in enumerate(series):
            value = item.values[index] if index < len(item.values) else None
            x = x0 + bar_w * number
            if value is None:
                parts.append(
                    f'<text x="{x + bar_w / 2:.1f}" y="{base - 4}" text-anchor="middle" class="axis">n/a</text>'
                )
                continue
            failed = index < len(item.failed) and item.failed[index]
            colour = FAILED_COLOUR if failed else PALETTE[number % len(PALETTE)]
            height = layout.plot_height * value / top
            y = base - height
            label = f"{item.name}: {category}: {value:,.0f} {unit}" + (" (wrong output)" if failed else "")
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" height="{height:.1f}" '
                f'fill="{colour}" rx="2"><title>{escape(label)}</title></rect>'
            )
            text = compact(value)
            # a label wider than its bar (and a character's gap) would run into the next
            if bar_w >= layout.char_width * (len(text) + 1):
                parts.append(
                    f'<text x="{x + bar_w / 2:.1f}" y="{y - 4:.1f}" text-anchor="middle" class="value">{text}</text>'
                )
        parts.append(
            f'<text x="{layout.left + group_w * (index + 0.5):.1f}" y="{base + layout.font + 8}" '
            f'text-anchor="middle" class="axis">{escape(category)}</text>'
        )
    parts += _legend(series, layout, legend)
    parts.append("</svg>")
    return "".join(parts)


def line_chart(
    title: str,
    labels: Sequence[str],
    values: Sequence[float],
    unit: str,
    failed: Sequence[bool] = (),
    layout: Layout = WIDE,
) -> str:
    """One line through ``values`` at ``labels`` (a miner's figure per round), points labelled as
    many as fit side by side (every n-th, counted back from the newest; each point's exact figure is
    its tooltip); ``failed`` points are drawn in the failure colour."""
    top = nice_ceiling(max(values, default=0.0))
    parts = _frame(title, top, unit, layout)
    step = layout.plot_width / max(1, len(values))
    base = layout.top + layout.plot_height
    points = [
        (layout.left + step * (index + 0.5), base - layout.plot_height * value / top)
        for index, value in enumerate(values)
    ]
    # A label is given the width of its text, half again (the oldest or newest may be moved by half
    # its width to stay inside the plot) and a character's gap: past that many points (a long
    # history) the labels would run into each other, so only every ``every``-th is written.
    widest = max((len(text) for text in [*labels, *map(compact, values)]), default=0)
    every = max(1, math.ceil(layout.char_width * (1.5 * widest + 1) / step))
    if len(points) > 1:
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(f'<polyline points="{path}" fill="none" stroke="{PALETTE[0]}" stroke-width="2.5"/>')
    for index, ((x, y), label, value) in enumerate(zip(points, labels, values)):
        bad = index < len(failed) and failed[index]
        colour = FAILED_COLOUR if bad else PALETTE[0]
        parts.append(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{colour}">'
            f"<title>{escape(f'{label}: {value:,.0f} {unit}')}</title></circle>"
        )
        if (len(points) - 1 - index) % every:
            continue
        parts.append(_inside(compact(value), x, y - 9, "value", layout))
        parts.append(_inside(label, x, base + layout.font + 8, "axis", layout))
    parts.append("</svg>")
    return "".join(parts)


def _inside(text: str, x: float, y: float, kind: str, layout: Layout) -> str:
    """``text`` (escaped here) centred at ``x``, or begun at the plot's left edge or ended at the
    chart's right edge where centred it would reach past them (into the axis's figures, or off the
    chart: the oldest and newest points of a long history sit close to those edges; bold figures run
    wider than ``char_width``)."""
    half = layout.char_width * (len(text) + 1) / 2
    if x - half < layout.left:
        return f'<text x="{layout.left + 2}" y="{y:.1f}" text-anchor="start" class="{kind}">{escape(text)}</text>'
    if x + half > layout.width - layout.right:
        return f'<text x="{layout.width - 2}" y="{y:.1f}" text-anchor="end" class="{kind}">{escape(text)}</text>'
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="middle" class="{kind}">{escape(text)}</text>'


def _legend_rows(series: Sequence[Series], layout: Layout) -> list[list[tuple[int, float]]]:
    """The legend's entries (series number, x) in rows that fit the chart's width."""
    rows: list[list[tuple[int, float]]] = [[]]
    x = float(layout.left)
    for number, item in enumerate(series):
        width = 18 + layout.char_width * len(item.name) + 16
        if rows[-1] and x + width > layout.width:
            rows.append([])
            x = float(layout.left)
        rows[-1].append((number, x))
        x += width
    return rows if rows[0] else []


def _legend(series: Sequence[Series], layout: Layout, rows: list[list[tuple[int, float]]]) -> list[str]:
    parts = []
    for row_number, row in enumerate(rows):
        y = layout.height - 12 + row_number * (layout.font + 6)
        for number, x in row:
            parts.append(
                f'<rect x="{x:.1f}" y="{y - layout.font + 2}" width="10" height="10" '
                f'fill="{PALETTE[number % len(PALETTE)]}"/><text x="{x + 15:.1f}" y="{y}" '
                f'class="axis">{escape(series[number].name)}</text>'
            )
    return parts
