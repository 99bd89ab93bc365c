"""Curves as inline SVG, drawn on the server: a metric against the step, one line per run.

No plotting library and no script: the page carries the finished drawing. Long runs are thinned to
at most ``MAX_POINTS`` points per line (evenly by index, keeping the last), which a chart of a few
hundred pixels cannot tell apart.
"""

from __future__ import annotations

import math
from html import escape

# A palette that stays readable on white and apart for the colour-blind (Okabe-Ito, then Tableau).
PALETTE = ("#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9", "#f0e442", "#000000",
           "#8c564b", "#7f7f7f")
MAX_POINTS = 600
WIDTH, HEIGHT = 560, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 36


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round values from ``lo`` to ``hi`` (1, 2 or 5 times a power of ten apart)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo] if math.isfinite(lo) else []
    raw = (hi - lo) / max(1, count - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out: list[float] = []
    value = first
    while value <= hi + step * 1e-9 and len(out) < 50:
        out.append(round(value, 12))
        value += step
    return out


def fmt(value: float) -> str:
    """A tick label: short, without float noise (0.30000000000000004 -> 0.3)."""
    if value == 0:
        return "0"
    if abs(value) >= 1e5 or abs(value) < 1e-3:
        return f"{value:.2g}"
    return f"{value:.4g}"


def thin(points: list[tuple[int, float]], most: int = MAX_POINTS) -> list[tuple[int, float]]:
    if len(points) <= most:
        return points
    stride = len(points) / (most - 1)
    return [points[int(i * stride)] for i in range(most - 1)] + [points[-1]]


def chart(metric: str, series: list[tuple[str, str, list[tuple[int, float]]]]) -> str:
    """An ``<svg>`` of ``metric`` against the step: ``series`` is (label, colour, points) per run.
    Each run's line is a ``polyline`` (a single point: a dot) with class ``run`` and its label as
    title; the legend names every run."""
    drawn = [(label, col, thin([(s, v) for s, v in pts if math.isfinite(v)])) for label, col, pts in series]
    drawn = [d for d in drawn if d[2]]
    title = f'<text class="title" x="{LEFT}" y="18">{escape(metric)}</text>'
    if not drawn:
        return (f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(metric)}">'
                f'{title}<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no points yet</text></svg>')
    xs = [s for _, _, pts in drawn for s, _ in pts]
    ys = [v for _, _, pts in drawn for _, v in pts]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        pad = abs(y0) * 0.05 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(step: float) -> float:
        return LEFT + (step - x0) / (x1 - x0) * plot_w

    def py(value: float) -> float:
        return TOP + (1 - (value - y0) / (y1 - y0)) * plot_h

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(metric)} by step">',
             title,
             f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>']
    for t in nice_ticks(y0, y1):
        y = py(t)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}"/>'
                     f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{fmt(t)}</text>')
    for t in nice_ticks(x0, x1):
        if t == int(t):
            x = px(t)
            parts.append(f'<text class="tick" x="{x:.1f}" y="{TOP + plot_h + 16}" text-anchor="middle">{int(t)}</text>')
    parts.append(f'<text class="axis" x="{LEFT + plot_w}" y="{HEIGHT - 4}" text-anchor="end">step</text>')
    for label, col, pts in drawn:
        if len(pts) == 1:
            s, v = pts[0]
            parts.append(f'<circle class="run" cx="{px(s):.1f}" cy="{py(v):.1f}" r="3" fill="{col}">'
                         f'<title>{escape(label)}</title></circle>')
        else:
            coords = " ".join(f"{px(s):.1f},{py(v):.1f}" for s, v in pts)
            parts.append(f'<polyline class="run" points="{coords}" stroke="{col}">'
                         f'<title>{escape(label)}</title></polyline>')
    parts.append("</svg>")
    return "".join(parts)


def legend(labels: list[tuple[str, str]]) -> str:
    """The runs' names in their colours, below the charts (one legend for every chart)."""
    # A drawn swatch, not a style attribute: the page's policy allows no inline styles.
    items = "".join(f'<li><svg class="swatch" viewBox="0 0 12 12"><rect width="12" height="12" fill="{col}"/></svg>'
                    f'{escape(label)}</li>' for label, col in labels)
    return f'<ul class="legend">{items}</ul>'
