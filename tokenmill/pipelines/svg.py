"""Small inline SVG charts for the report: no plotting library, nothing fetched at view time."""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H = 640, 300
RIGHT, TOP, BOTTOM = 150, 20, 44
TICK_FONT, TITLE_FONT = 11, 12
# Text extents as a browser draws the report's sans-serif font, generously: an average glyph
# is at most 0.6 em wide, rises 0.75 em above its baseline and descends 0.25 em below it.
CHAR_EM, ASCENT_EM, DESCENT_EM = 0.6, 0.75, 0.25
GAP = 6  # pixels between a tick label and the axis, and between labels
_SI = ((1e9, "G"), (1e6, "M"), (1e3, "k"))


def text_width(text: str, font_size: float) -> float:
    """The widest a label of this many characters is drawn."""
    return len(text) * font_size * CHAR_EM


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = min((m * mag for m in (1, 2, 5, 10) if m * mag >= raw), default=raw)
    start = math.ceil(lo / step) * step
    out = []
    v = start
    while v <= hi + 1e-12:
        out.append(round(v, 10))
        v += step
    return out


def axis_labels(ticks: list[float]) -> list[str]:
    """Labels of one linear axis in one format: thousands as k / M / G when the axis reaches
    them, and as many decimals as the tick step needs, the same for every tick (0.0 0.5 1.0,
    not 0 0.5 1; 10k 20k, not 1e+04 2e+04)."""
    if not ticks:
        return []
    top = max(abs(t) for t in ticks)
    scale, suffix = next(((f, s) for f, s in _SI if top >= f), (1.0, ""))
    steps = [b - a for a, b in zip(ticks, ticks[1:]) if b > a]
    step = (min(steps) if steps else (abs(ticks[0]) or 1.0)) / scale
    decimals = min(6, max(0, math.ceil(-math.log10(step) - 1e-9)))
    return [f"{t / scale + 0.0:.{decimals}f}{suffix}" if t or not suffix else "0" for t in ticks]


def decade_label(value: float) -> str:
    """A power of ten on a log axis: 1 10 100 1k 10k 100k 1M."""
    scale, suffix = next(((f, s) for f, s in _SI if value >= f), (1.0, ""))
    return f"{value / scale:g}{suffix}"


@dataclass
class Frame:
    """A chart's plot area, chosen so that the y tick labels and the y axis title fit left of it."""

    parts: list[str]
    left: float
    width: float  # of the plot area
    height: float


def _frame(
    title: str, xlabel: str, ylabel: str, x0: float, x1: float, y0: float, y1: float, *, log_x: bool = False
) -> Frame:
    y_ticks = _ticks(y0, y1)
    y_labels = axis_labels(y_ticks)
    # The rotated y title stands left of the widest tick label, with a gap: nothing overlaps.
    widest = max((text_width(label, TICK_FONT) for label in y_labels), default=0.0)
    title_x = GAP + TITLE_FONT * ASCENT_EM
    left = math.ceil(title_x + TITLE_FONT * DESCENT_EM + GAP + widest + GAP)
    pw, ph = W - left - RIGHT, H - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect x="{left}" y="{TOP}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>',
    ]
    for t, label in zip(y_ticks, y_labels):
        y = TOP + ph - (t - y0) / ((y1 - y0) or 1) * ph
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        parts.append(f'<text x="{left - GAP}" y="{y + 4:.1f}" text-anchor="end" font-size="{TICK_FONT}">{label}</text>')
    if log_x:
        decades = [10**e for e in range(math.floor(x0), math.ceil(x1) + 1)]
        positions = [(math.log10(t), decade_label(t)) for t in decades if x0 <= math.log10(t) <= x1]
    else:
        x_ticks = _ticks(x0, x1)
        positions = list(zip(x_ticks, axis_labels(x_ticks)))
    for pos, label in positions:
        x = left + (pos - x0) / ((x1 - x0) or 1) * pw
        parts.append(
            f'<text x="{x:.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="{TICK_FONT}">{label}</text>'
        )
    parts.append(
        f'<text x="{left + pw / 2}" y="{H - 6}" text-anchor="middle" font-size="{TITLE_FONT}">{escape(xlabel)}</text>'
    )
    parts.append(
        f'<text x="{title_x}" y="{TOP + ph / 2}" text-anchor="middle" font-size="{TITLE_FONT}"'
        f' transform="rotate(-90 {title_x} {TOP + ph / 2})">{escape(ylabel)}</text>'
    )
    return Frame(parts, left, pw, ph)


def _cut(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: max(1, chars - 1)] + "…"


def _legend(names: list[str]) -> list[str]:
    parts = []
    fits = int((RIGHT - 28 - GAP) / (TICK_FONT * CHAR_EM))  # names end inside the image
    for i, name in enumerate(names):
        y = TOP + 12 + 18 * i
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{W - RIGHT + 10}" y="{y - 9}" width="12" height="12" fill="{color}"/>')
        parts.append(
            f'<text x="{W - RIGHT + 28}" y="{y + 1}" font-size="{TICK_FONT}">{escape(_cut(name, fits))}</text>'
        )
    return parts


def line_chart(title: str, series: dict[str, list[tuple[float, float]]], xlabel: str, ylabel: str) -> str:
    points = [p for s in series.values() for p in s if all(math.isfinite(v) for v in p)]
    if not points:
        return ""
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    pad = (y1 - y0) * 0.05 or abs(y1) * 0.05 or 1.0
    y0, y1 = y0 - pad, y1 + pad
    frame = _frame(title, xlabel, ylabel, x0, x1, y0, y1)
    parts, left, pw, ph = frame.parts, frame.left, frame.width, frame.height
    for i, pts in enumerate(series.values()):
        pts = [p for p in pts if all(math.isfinite(v) for v in p)]
        if not pts:
            continue
        coords = " ".join(
            f"{left + (x - x0) / ((x1 - x0) or 1) * pw:.1f},{TOP + ph - (y - y0) / ((y1 - y0) or 1) * ph:.1f}"
            for x, y in pts
        )
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        if len(pts) <= 40:
            for x, y in pts:
                cx = left + (x - x0) / ((x1 - x0) or 1) * pw
                cy = TOP + ph - (y - y0) / ((y1 - y0) or 1) * ph
                parts.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="2.5" fill="{color}"/>')
    parts += _legend(list(series))
    parts.append("</svg>")
    return "\n".join(parts)


def histogram(title: str, series: dict[str, list[float]], xlabel: str, bins: int = 30) -> str:
    """Overlaid histograms on a log10 x axis (document lengths span orders of magnitude)."""
    values = {k: [math.log10(max(v, 1)) for v in vs] for k, vs in series.items() if vs}
    if not values:
        return ""
    lo = min(min(v) for v in values.values())
    hi = max(max(v) for v in values.values())
    if hi - lo < 1e-9:
        hi = lo + 1
    width = (hi - lo) / bins
    counts = {}
    for name, vs in values.items():
        c = [0] * bins
        for v in vs:
            c[min(bins - 1, int((v - lo) / width))] += 1
        counts[name] = c
    top = max(max(c) for c in counts.values())
    frame = _frame(title, xlabel, "documents", lo, hi, 0, top * 1.05, log_x=True)
    parts, left, pw, ph = frame.parts, frame.left, frame.width, frame.height
    for i, c in enumerate(counts.values()):
        color = PALETTE[i % len(PALETTE)]
        for b, n in enumerate(c):
            if not n:
                continue
            x = left + b / bins * pw
            h = n / (top * 1.05) * ph
            parts.append(
                f'<rect x="{x:.1f}" y="{TOP + ph - h:.1f}" width="{pw / bins:.1f}" height="{h:.1f}" fill="{color}" fill-opacity="0.45" stroke="{color}"/>'
            )
    parts += _legend(list(counts))
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    title: str,
    groups: list[str],
    series: dict[str, list[float]],
    ylabel: str,
    errors: dict[str, list[float]] | None = None,
) -> str:
    """Grouped bars: one group per category, one bar per series (requested vs realised), with
    an error bar of +-errors[series][group] where given."""
    if not groups:
        return ""
    errors = errors or {}
    top = (
        max(
            (v + max(errors.get(k, [0.0] * len(vs))[i], 0.0) for k, vs in series.items() for i, v in enumerate(vs)),
            default=1.0,
        )
        or 1.0
    )
    frame = _frame(title, "", ylabel, 0, len(groups), 0, top * 1.1)
    pw, ph = frame.width, frame.height
    # Group names replace the numeric x labels, each cut to the width of its group.
    parts = [p for p in frame.parts if not (p.startswith("<text") and f'y="{TOP + ph + 16}"' in p)]
    left = frame.left
    n = len(series)
    gw = pw / len(groups)
    fits = max(1, int((gw - GAP) / (TICK_FONT * CHAR_EM)))
    for g, group in enumerate(groups):
        parts.append(
            f'<text x="{left + gw * (g + 0.5):.1f}" y="{TOP + ph + 16}" text-anchor="middle" font-size="{TICK_FONT}">{escape(_cut(group, fits))}</text>'
        )
        for i, (name, vs) in enumerate(series.items()):
            v = vs[g]
            bw = gw * 0.8 / n
            x = left + gw * g + gw * 0.1 + bw * i
            h = v / (top * 1.1) * ph
            parts.append(
                f'<rect x="{x:.1f}" y="{TOP + ph - h:.1f}" width="{bw:.1f}" height="{h:.1f}" fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(name)}: {v:.4f}</title></rect>'
            )
            error = errors.get(name, [0.0] * len(vs))[g]
            if error > 0:
                cx, y_low, y_high = (
                    x + bw / 2,
                    TOP + ph - (v - error) / (top * 1.1) * ph,
                    TOP + ph - (v + error) / (top * 1.1) * ph,
                )
                parts.append(
                    f'<path d="M{cx:.1f},{y_low:.1f}V{y_high:.1f}M{cx - bw / 4:.1f},{y_low:.1f}h{bw / 2:.1f}M{cx - bw / 4:.1f},{y_high:.1f}h{bw / 2:.1f}" stroke="#000" class="error-bar"/>'
                )
    parts += _legend(list(series))
    parts.append("</svg>")
    return "\n".join(parts)
