"""Server-side SVG charts for the ticket page: no JavaScript, no external assets, every text escaped.

One kind of chart: memory (bytes) against an x axis (optimizer step, or trace entry), one polyline per
series (allocated, reserved, peak), horizontal limits (the device's capacity, a fraction cap) and
vertical markers (the OOM). Colours come from classes styled by ``static/triage.css`` with presentation
attributes as a fallback, so the chart reads the same without the stylesheet.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

from markupsafe import Markup

from triage.units import human

MAX_POINTS = 800

COLOURS = {
    "allocated": "#c0392b",
    "reserved": "#2c3e50",
    "peak": "#e67e22",
    "limit": "#7f8c8d",
    "oom": "#000",
}


@dataclass
class Series:
    name: str  # allocated | reserved | peak (also the CSS class and the legend)
    points: list[tuple[float, float]]
    label: str = ""


@dataclass
class Marker:
    x: float
    label: str
    kind: str = "oom"


@dataclass
class Limit:
    y: float
    label: str


@dataclass
class Chart:
    title: str
    x_label: str
    series: list[Series]
    markers: list[Marker] = field(default_factory=list)
    limits: list[Limit] = field(default_factory=list)
    caption: str = ""

    @property
    def empty(self) -> bool:
        return not any(len(s.points) >= 1 for s in self.series)


def downsample(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most ``limit`` points, keeping each bucket's maximum (peaks must stay visible)."""
    n = len(points)
    if n <= limit:
        return list(points)
    out: list[tuple[float, float]] = []
    for b in range(limit):
        lo, hi = b * n // limit, max(b * n // limit + 1, (b + 1) * n // limit)
        bucket = points[lo:hi]
        out.append(max(bucket, key=lambda p: p[1]))
    return out


def _nice(v: float) -> float:
    """A round number ≥ v (1, 2, 2.5, 5 × 10^k; bytes: powers of two with the same steps)."""
    if v <= 0:
        return 1.0
    exp = math.floor(math.log2(v) / 10) * 10  # the binary unit (KiB, MiB, GiB, …)
    unit = 2.0**exp
    scaled = v / unit
    mag = 10 ** math.floor(math.log10(scaled))
    for step in (1, 2, 2.5, 5, 10):
        if step * mag >= scaled:
            return step * mag * unit
    return 10 * mag * unit  # pragma: no cover


def _fmt_x(v: float) -> str:
    return f"{int(v):,}" if float(v).is_integer() else f"{v:,.1f}"


def render(chart: Chart, *, width: int = 760, height: int = 260) -> Markup:
    """The chart as an inline ``<svg>`` element (safe markup: every label is escaped here)."""
    e = escape
    left, right, top, bottom = 70, 16, 28, 40
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for s in chart.series for p in s.points] + [m.x for m in chart.markers]
    ys = [p[1] for s in chart.series for p in s.points] + [lim.y for lim in chart.limits]
    if not xs or not ys:
        return Markup("")
    x0, x1 = min(xs), max(xs)
    if x1 <= x0:
        x1 = x0 + 1
    ymax = _nice(max(ys) * 1.02)

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - (max(0.0, y) / ymax) * ph

    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{e(chart.title)}">',
        f"<title>{e(chart.title)}</title>",
        f'<rect class="plot" x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ddd"/>',
    ]
    for i in range(5):  # y grid and labels
        v = ymax * i / 4
        y = sy(v)
        parts.append(
            f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>'
        )
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{e(human(v))}</text>'
        )
    for i in range(5):  # x labels
        v = x0 + (x1 - x0) * i / 4
        parts.append(
            f'<text class="tick" x="{sx(v):.1f}" y="{top + ph + 16}" text-anchor="middle" font-size="11">'
            f"{e(_fmt_x(round(v)))}</text>"
        )
    parts.append(
        f'<text class="axis" x="{left + pw / 2:.1f}" y="{height - 6}" text-anchor="middle" font-size="12">'
        f"{e(chart.x_label)}</text>"
    )
    for lim in chart.limits:
        y = sy(lim.y)
        parts.append(
            f'<g class="limit"><line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" '
            f'stroke="{COLOURS["limit"]}" stroke-dasharray="6 3"/>'
            f'<text x="{left + pw - 4}" y="{y - 4:.1f}" text-anchor="end" font-size="11">'
            f"{e(lim.label)} {e(human(lim.y))}</text></g>"
        )
    for s in chart.series:
        pts = downsample(sorted(s.points))
        if not pts:
            continue
        colour = COLOURS.get(s.name, "#555")
        label = s.label or s.name
        if len(pts) == 1:
            x, y = pts[0]
            parts.append(
                f'<circle class="series {e(s.name)}" data-series="{e(s.name)}" cx="{sx(x):.1f}" cy="{sy(y):.1f}" '
                f'r="3" fill="{colour}"><title>{e(label)}</title></circle>'
            )
            continue
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
        parts.append(
            f'<polyline class="series {e(s.name)}" data-series="{e(s.name)}" fill="none" stroke="{colour}" '
            f'stroke-width="1.6" points="{coords}"><title>{e(label)}</title></polyline>'
        )
    for m in chart.markers:
        x = sx(m.x)
        parts.append(
            f'<g class="marker {e(m.kind)}" data-marker="{e(m.kind)}"><line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" '
            f'y2="{top + ph}" stroke="{COLOURS["oom"]}" stroke-width="1.5" stroke-dasharray="4 3"/>'
            f'<text x="{min(x + 4, left + pw - 2):.1f}" y="{top - 8}" '
            f'text-anchor="{"end" if x > left + pw - 80 else "start"}" font-size="12" font-weight="bold">'
            f"{e(m.label)}</text></g>"
        )
    lx = left
    for s in chart.series:  # legend
        if not s.points:
            continue
        colour = COLOURS.get(s.name, "#555")
        label = s.label or s.name
        parts.append(
            f'<g class="legend"><rect x="{lx}" y="8" width="12" height="4" fill="{colour}"/>'
            f'<text x="{lx + 16}" y="14" font-size="11">{e(label)}</text></g>'
        )
        lx += 24 + 7 * len(label)
    parts.append("</svg>")
    return Markup("".join(parts))
