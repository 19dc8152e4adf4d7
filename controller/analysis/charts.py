"""Inline SVG charts for the HTML report: line charts and (grouped or stacked) bar charts.

Every chart has a title, labelled axes with units and tick values, and a legend that names
every series. The legend sits in its own band under the plot, laid out left to right in rows
from the labels' widths (monospace text, so a width is known before a browser renders it):
legend items never overlap each other or the plot. Elements carry classes and
`data-series` attributes (`legend-item`, `axis-label`, `tick`, `mark`) so a test can check
the rendered page from the DOM.

Pure string building; Must not import: duckdb, zmq, controller.store (it reads
nothing of the run directory).
"""
from __future__ import annotations

import html
import math
from typing import Sequence

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
FONT = "font-family=\"sans-serif\""
MONO = "font-family=\"DejaVu Sans Mono, monospace\""
LEGEND_FONT_PX = 11
LEGEND_CHAR_PX = 7.0          # a monospace glyph at 11 px is 6.6 px wide; rounded up
SWATCH_PX = 12
LEFT, RIGHT, TOP = 64, 16, 34
X_AXIS_PX = 44                # tick labels and the x-axis label under the plot


def _e(text) -> str:
    return html.escape(str(text))


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0, step, 2 step, ... up to the first multiple of a 1/2/5 x 10^k step >= top."""
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [round(i * step, 12) for i in range(n + 1)]


def fmt_tick(v: float, unit: str = "") -> str:
    if unit == "%":
        return f"{v * 100:g}%"
    # never an exponent on an axis: 1000 reads "1,000", not "1e+03"
    text = "0" if not v else f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    return f"{text} {unit}".strip() if unit and unit != "count" else text


def time_scale(max_s: float) -> tuple[float, str]:
    """(factor, unit) to show seconds in: ms below one second, s up to ten minutes, else min."""
    if max_s < 1.0:
        return 1000.0, "ms"
    if max_s < 600.0:
        return 1.0, "s"
    return 1 / 60.0, "min"


def legend(names: Sequence[str], x0: float, y0: float, width: float,
           colours: Sequence[str] = COLOURS) -> tuple[list[str], float]:
    """SVG of legend items for `names` in rows starting at (x0, y0) within `width`; returns
    (parts, height used)."""
    parts, x, y, row_h = [], x0, y0, SWATCH_PX + 6
    for i, name in enumerate(names):
        w = SWATCH_PX + 5 + LEGEND_CHAR_PX * len(str(name)) + 14
        if x > x0 and x + w > x0 + width:
            x, y = x0, y + row_h
        colour = colours[i % len(colours)]
        parts.append(
            f'<g class="legend-item" data-series="{_e(name)}">'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{SWATCH_PX}" height="{SWATCH_PX}" '
            f'fill="{colour}"/><text x="{x + SWATCH_PX + 5:.1f}" y="{y + SWATCH_PX - 1:.1f}" '
            f'font-size="{LEGEND_FONT_PX}" {MONO}>{_e(name)}</text></g>')
        x += w
    return parts, (y - y0 + row_h if names else 0)


def _frame(title: str, width: int, plot_h: int, x_label: str, y_label: str, y_ticks: list[float],
           y_unit: str) -> list[str]:
    """Title, axes, y ticks with grid lines, axis labels (the plot spans TOP..TOP+plot_h)."""
    x1, base = width - RIGHT, TOP + plot_h
    top = y_ticks[-1] or 1
    parts = [f'<text x="{LEFT}" y="18" font-size="14" font-weight="bold" {FONT}>{_e(title)}</text>',
             f'<line x1="{LEFT}" y1="{base}" x2="{x1}" y2="{base}" stroke="#444"/>',
             f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}" stroke="#444"/>']
    for v in y_ticks:
        y = base - v / top * plot_h
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}" stroke="#e4e4e4"/>'
                     f'<text class="tick y-tick" x="{LEFT - 6}" y="{y + 4:.1f}" font-size="10" '
                     f'text-anchor="end" {FONT}>{_e(fmt_tick(v, y_unit))}</text>')
    unit = f" ({y_unit})" if y_unit and y_unit != "count" else ""
    parts.append(f'<text class="axis-label y-label" x="14" y="{TOP + plot_h / 2:.1f}" '
                 f'font-size="11" text-anchor="middle" transform="rotate(-90 14 {TOP + plot_h / 2:.1f})" '
                 f'{FONT}>{_e(y_label + unit)}</text>')
    parts.append(f'<text class="axis-label x-label" x="{(LEFT + x1) / 2:.1f}" y="{base + 34}" '
                 f'font-size="11" text-anchor="middle" {FONT}>{_e(x_label)}</text>')
    return parts


def _x_ticks(labels: Sequence[str], centres: Sequence[float], base: float) -> list[str]:
    """Category labels under the axis, thinned so that neighbours never touch."""
    if not labels:
        return []
    gap = (centres[1] - centres[0]) if len(centres) > 1 else 1e9
    widest = max(len(str(s)) for s in labels) * 6.0 + 6
    every = max(1, math.ceil(widest / gap)) if gap else 1
    return [f'<text class="tick x-tick" x="{c:.1f}" y="{base + 14}" font-size="10" '
            f'text-anchor="middle" {FONT}>{_e(s)}</text>'
            for i, (s, c) in enumerate(zip(labels, centres)) if i % every == 0]


def _svg(width: int, height: int, title: str, parts: list[str], kind: str) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {kind}" width="{width}" '
            f'height="{height:.0f}" viewBox="0 0 {width} {height:.0f}" role="img">'
            f'<title>{_e(title)}</title>{"".join(parts)}</svg>')


def line_chart(series: dict[str, list[tuple[float, float | None]]], title: str, *,
               x_label: str, y_label: str, y_unit: str = "", y_max: float | None = None,
               x_format=lambda x: f"{x:g}", width: int = 640, plot_h: int = 200) -> str:
    """Lines (with a dot per point) of series name -> [(x, y)]; x values are the categories
    (e.g. policy versions), evenly spaced; None y values are gaps."""
    xs = sorted({x for pts in series.values() for x, _ in pts})
    ys = [y for pts in series.values() for _, y in pts if y is not None]
    ticks = nice_ticks(y_max if y_max is not None else max(ys, default=1.0))
    top, base, plot_w = ticks[-1] or 1, TOP + plot_h, width - LEFT - RIGHT
    step = plot_w / max(len(xs), 1)
    centre = {x: LEFT + step * (i + 0.5) for i, x in enumerate(xs)}
    parts = _frame(title, width, plot_h, x_label, y_label, ticks, y_unit)
    parts += _x_ticks([x_format(x) for x in xs], [centre[x] for x in xs], base)
    names = sorted(series)
    for i, name in enumerate(names):
        colour, pts = COLOURS[i % len(COLOURS)], sorted(series[name])
        coords = [(centre[x], base - y / top * plot_h, x, y) for x, y in pts if y is not None]
        if len(coords) > 1:
            parts.append(f'<polyline class="mark" data-series="{_e(name)}" fill="none" '
                         f'stroke="{colour}" stroke-width="2" points="'
                         + " ".join(f"{px:.1f},{py:.1f}" for px, py, _, _ in coords) + '"/>')
        for px, py, x, y in coords:
            parts.append(f'<circle class="mark" data-series="{_e(name)}" cx="{px:.1f}" cy="{py:.1f}" '
                         f'r="3" fill="{colour}"><title>{_e(name)} {_e(x_format(x))}: '
                         f'{_e(fmt_tick(y, y_unit) if y_unit == "%" else f"{y:.3g}")}</title></circle>')
    items, legend_h = legend(names, LEFT, base + X_AXIS_PX, plot_w)
    return _svg(width, base + X_AXIS_PX + legend_h + 6, title, parts + items, "line-chart")


def bar_chart(categories: Sequence[str], series: dict[str, Sequence[float]], title: str, *,
              x_label: str, y_label: str, y_unit: str = "", stacked: bool = False,
              colours: Sequence[str] = COLOURS, width: int = 640, plot_h: int = 200) -> str:
    """One group of bars per category, one bar (or stacked segment) per series, in the
    order of `series` (coloured by `colours` in that order); zero-height segments are still
    named in the legend."""
    names = list(series)
    if stacked:
        totals = [sum(series[n][i] for n in names) for i in range(len(categories))]
    else:
        totals = [max((series[n][i] for n in names), default=0) for i in range(len(categories))]
    ticks = nice_ticks(max(totals, default=0) or 1)
    top, base, plot_w = ticks[-1] or 1, TOP + plot_h, width - LEFT - RIGHT
    slot = plot_w / max(len(categories), 1)
    bar_w = slot * 0.75 / (1 if stacked else max(len(names), 1))
    parts = _frame(title, width, plot_h, x_label, y_label, ticks, y_unit)
    parts += _x_ticks(categories, [LEFT + slot * (i + 0.5) for i in range(len(categories))], base)
    for i, cat in enumerate(categories):
        y_base = base
        for j, name in enumerate(names):
            v = series[name][i] or 0
            h = v / top * plot_h
            x = LEFT + slot * i + slot * 0.125 + (0 if stacked else j * bar_w)
            parts.append(f'<rect class="mark" data-series="{_e(name)}" x="{x:.1f}" '
                         f'y="{y_base - h:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                         f'fill="{colours[j % len(colours)]}"><title>{_e(name)}, {_e(cat)}: '
                         f'{_e(fmt_tick(v, y_unit))}</title></rect>')
            if stacked:
                y_base -= h
    items, legend_h = legend(names, LEFT, base + X_AXIS_PX, plot_w, colours)
    return _svg(width, base + X_AXIS_PX + legend_h + 6, title, parts + items, "bar-chart")
