"""Line and bar charts as inline SVG for the HTML reports (the house style of smelt.data.plots and
smelt.plan.plots: no plotting library, nothing fetched, every point carries a hover title).

The SVG has no xmlns attribute: it is embedded in HTML5, where the namespace is implied, so a report
holds no URL at all.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")
EVENT_COLORS = {
    "alert": "#c44e52",
    "skip": "#dd8452",
    "rollback": "#8b0000",
    "resume": "#55a868",
    "stage": "#8172b3",
    "overflow": "#937860",
    "end": "#333333",
}


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str = ""
    dash: str = ""
    dots: bool = False


@dataclass
class Band:
    """A shaded range (e.g. min-max over seeds) between lo and hi at each x."""

    name: str
    xs: Sequence[float]
    lo: Sequence[float]
    hi: Sequence[float]
    color: str = "#4c72b0"


@dataclass
class Marker:
    """A vertical line at x (an event), with a short label and a hover text."""

    x: float
    label: str
    title: str
    color: str = "#999999"


@dataclass
class Chart:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    bands: list[Band] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    x_format: str = "si"  # si (12k, 1.5M), sci (1.2e15) or plain
    log_y: bool = False
    y_zero: bool = False  # include 0 on the y axis (rates and shares, where the baseline matters)
    x_zero: bool = True  # start the x axis at 0 (tokens and FLOPs both start there)
    width: int = 900
    height: int = 280


def fmt_number(value: float, style: str = "si") -> str:
    """Tick and table numbers: 12k, 1.5M, 3.2G for counts; 1.2e15 for FLOPs."""
    if value is None or not math.isfinite(value):
        return "-"
    if style == "sci":
        return "0" if value == 0 else f"{value:.2g}".replace("e+", "e")
    if style == "si":
        magnitude = abs(value)
        for limit, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
            if magnitude >= limit:
                return f"{value / limit:.3g}{suffix}"
    return f"{value:.4g}"


def _ticks(lo: float, hi: float) -> list[float]:
    span = hi - lo
    if span <= 0:
        return [lo]
    step = 10 ** math.floor(math.log10(span / 4))
    for mult in (1, 2, 2.5, 5, 10):
        if span / (step * mult) <= 6:
            step *= mult
            break
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _finite(value: float | None) -> bool:
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value)


MAX_POINTS = 1200  # per series; more points than pixels only make the file bigger


def thin(xs: Sequence[float], ys: Sequence[float | None], limit: int = MAX_POINTS) -> tuple[list, list]:
    """At most about 2 x `limit` points: the lowest and highest value of each of `limit` buckets, in x
    order, so a spike in a long run stays visible where plain striding would step over it."""
    if len(xs) <= 2 * limit:
        return list(xs), list(ys)
    out_x: list[float] = []
    out_y: list[float | None] = []
    size = len(xs) / limit
    for b in range(limit):
        lo, hi = int(b * size), int((b + 1) * size)
        bucket = [i for i in range(lo, hi) if _finite(ys[i])]
        if not bucket:
            out_x.append(xs[lo])
            out_y.append(None)  # keep the gap
            continue
        picks = sorted({min(bucket, key=lambda i: ys[i]), max(bucket, key=lambda i: ys[i])})
        out_x += [xs[i] for i in picks]
        out_y += [ys[i] for i in picks]
    return out_x, out_y


def _lone_range(lo: float, hi: float, zero: bool) -> tuple[float, float]:
    """An axis range for values that are all equal: from 0 (when `zero`, so a lone value reads as a
    magnitude) to a quarter past the value, else a tenth of the value either side."""
    if hi != lo:
        return lo, hi
    if lo == 0:
        return (0.0, 1.0) if zero else (-1.0, 1.0)
    if zero:
        return (min(lo, 0.0) * 1.25, max(hi, 0.0) * 1.25)
    return lo - abs(lo) * 0.1, hi + abs(hi) * 0.1


def chart_svg(chart: Chart) -> str:
    """The chart as an inline <svg>; a chart without any finite point says so in its frame.

    A series with a single point (one evaluated checkpoint) is drawn as a large marker with its value
    written beside it, or, when dashed without dots (a reference such as chance or gzip), as a level
    across the plot; a band with a single x is drawn as an error bar. Values that are all equal get an axis from
    0 to a quarter past them (a tenth either side on a log axis), so a lone point sits inside the
    frame rather than on its edge."""
    w, h = chart.width, chart.height
    left, right, top, bottom = 70, 20, 46, 46
    pw, ph = w - left - right, h - top - bottom
    ytf = (lambda v: math.log10(v)) if chart.log_y else (lambda v: v)
    xs: list[float] = []
    ys: list[float] = []
    for s in chart.series:
        for x, y in zip(s.xs, s.ys, strict=True):
            if _finite(x) and _finite(y) and (not chart.log_y or y > 0):
                xs.append(float(x))
                ys.append(ytf(float(y)))
    for b in chart.bands:
        for x, lo, hi in zip(b.xs, b.lo, b.hi, strict=True):
            if _finite(x) and _finite(lo) and _finite(hi) and (not chart.log_y or lo > 0):
                xs.append(float(x))
                ys += [ytf(float(lo)), ytf(float(hi))]
    out = [
        f'<svg class="chart" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" '
        f'aria-label="{html.escape(chart.title)}" font-family="sans-serif" font-size="11">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(chart.title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>',
    ]
    if not xs:
        out.append(f'<text x="{left + 10}" y="{top + 20}" fill="#666">no data</text></svg>')
        return "\n".join(out)
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    for m in chart.markers:
        x_lo, x_hi = min(x_lo, m.x), max(x_hi, m.x)
    if x_hi == x_lo:  # one x: the point goes inside the frame, not onto its right edge
        lo, hi = _lone_range(x_lo, x_hi, chart.x_zero)
        x_lo, x_hi = (min(lo, 0.0), hi) if chart.x_zero else (lo, hi)
    elif chart.x_zero:
        x_lo = min(x_lo, 0.0)
    if y_hi == y_lo:
        y_lo, y_hi = (y_lo - 0.5, y_hi + 0.5) if chart.log_y else _lone_range(y_lo, y_hi, True)
    else:
        if chart.y_zero and not chart.log_y:
            y_lo, y_hi = min(y_lo, 0.0), max(y_hi, 0.0)
        pad = (y_hi - y_lo) * 0.06
        y_lo, y_hi = y_lo - pad, y_hi + pad

    def px(x: float) -> float:
        return left + pw * (x - x_lo) / (x_hi - x_lo)

    def py(y: float) -> float:
        return top + ph - ph * (y - y_lo) / (y_hi - y_lo)

    for value in _ticks(x_lo, x_hi):
        x = px(value)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>')
        label = fmt_number(value, chart.x_format)
        out.append(f'<text x="{x:.1f}" y="{top + ph + 14}" text-anchor="middle">{label}</text>')
    for value in _ticks(y_lo, y_hi):
        y = py(value)
        label = fmt_number(10**value, "sci") if chart.log_y else f"{value:.4g}"
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{h - 8}" text-anchor="middle">{html.escape(chart.xlabel)}</text>'
    )
    ly = top + ph / 2
    out.append(
        f'<text x="14" y="{ly:.1f}" text-anchor="middle" transform="rotate(-90 14 {ly:.1f})">'
        f"{html.escape(chart.ylabel + (' (log)' if chart.log_y else ''))}</text>"
    )
    for k, band in enumerate(chart.bands):
        color = band.color or COLORS[k % len(COLORS)]
        upper, lower = [], []
        for x, lo, hi in zip(band.xs, band.lo, band.hi, strict=True):
            if _finite(x) and _finite(lo) and _finite(hi) and (not chart.log_y or lo > 0):
                upper.append(f"{px(x):.1f},{py(ytf(hi)):.1f}")
                lower.append(f"{px(x):.1f},{py(ytf(lo)):.1f}")
        if len(upper) == 1:  # one x: an error bar with caps
            (x, top_y), (_, low_y) = upper[0].split(","), lower[0].split(",")
            cx = float(x)
            out.append(
                f'<g stroke="{color}" stroke-width="1.5"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{top_y}" '
                f'y2="{low_y}"/><line x1="{cx - 5:.1f}" x2="{cx + 5:.1f}" y1="{top_y}" y2="{top_y}"/>'
                f'<line x1="{cx - 5:.1f}" x2="{cx + 5:.1f}" y1="{low_y}" y2="{low_y}"/>'
                f"<title>{html.escape(band.name)}</title></g>"
            )
        elif upper:
            points = " ".join(upper + lower[::-1])
            out.append(
                f'<polygon points="{points}" fill="{color}" fill-opacity="0.18" stroke="none">'
                f"<title>{html.escape(band.name)}</title></polygon>"
            )
    placed: list[float] = []
    for marker in chart.markers:
        x = px(marker.x)
        # Labels of nearby events stack downwards instead of printing over each other.
        row = sum(1 for other in placed if abs(other - x) < 60)
        placed.append(x)
        out.append(
            f'<g><line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" stroke="{marker.color}" '
            f'stroke-dasharray="3 3"/><text x="{x + 2:.1f}" y="{top + 10 + 11 * (row % 6)}" '
            f'fill="{marker.color}">{html.escape(marker.label)}</text><title>{html.escape(marker.title)}</title></g>'
        )
    labels: list[float] = []  # baselines of the value labels written so far, so they do not overprint
    for k, s in enumerate(chart.series):
        color = s.color or COLORS[k % len(COLORS)]
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        lone = [
            (float(x), float(y))
            for x, y in zip(s.xs, s.ys, strict=True)
            if _finite(x) and _finite(y) and (not chart.log_y or y > 0)
        ]
        if len(lone) == 1:
            out += _lone_point(s, color, lone[0], px(lone[0][0]), py(ytf(lone[0][1])), left, pw, labels)
            continue
        segment: list[str] = []
        segments: list[list[str]] = []
        for x, y in zip(*thin(s.xs, s.ys), strict=True):
            if _finite(x) and _finite(y) and (not chart.log_y or y > 0):
                segment.append(f"{px(x):.1f},{py(ytf(y)):.1f}")
                if s.dots:
                    out.append(
                        f'<circle cx="{px(x):.1f}" cy="{py(ytf(y)):.1f}" r="3" fill="{color}">'
                        f"<title>{html.escape(s.name)}: {fmt_number(x, chart.x_format)}, {y:.5g}</title>"
                        f"</circle>"
                    )
            elif segment:  # a gap (no value logged) breaks the line instead of bridging it
                segments.append(segment)
                segment = []
        if segment:
            segments.append(segment)
        for seg in segments:
            if len(seg) > 1:
                out.append(
                    f'<polyline points="{" ".join(seg)}" fill="none" stroke="{color}" stroke-width="1.8"'
                    f"{dash}><title>{html.escape(s.name)}</title></polyline>"
                )
            elif not s.dots:
                cx, cy = seg[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2.5" fill="{color}"/>')
    out += _legend(
        [(s.name, s.color or COLORS[k % len(COLORS)]) for k, s in enumerate(chart.series)], left, w
    )
    out.append("</svg>")
    return "\n".join(out)


def _lone_point(
    s: Series,
    color: str,
    point: tuple[float, float],
    x: float,
    y: float,
    left: float,
    pw: float,
    labels: list,
) -> list[str]:
    """A series' only point: a dashed series without dots (a reference level) as a line across the plot,
    any other as a large marker; either with its value written beside it."""
    value = f"{point[1]:.4g}"
    title = f"<title>{html.escape(s.name)}: {value}</title>"
    level = bool(s.dash and not s.dots)
    ty = y - 4 if level else y + 4  # a level's label sits above its line, a marker's beside it
    while any(abs(ty - other) < 12 for other in labels):  # labels never overprint: move down a line
        ty += 12
    labels.append(ty)
    if level:
        return [
            f'<g><line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="{color}" '
            f'stroke-width="1.5" stroke-dasharray="{s.dash}"/><text x="{left + pw - 4}" y="{ty:.1f}" '
            f'text-anchor="end" fill="{color}">{html.escape(s.name)} {value}</text>{title}</g>'
        ]
    right_half = x > left + pw * 0.6
    tx, anchor = (x - 9, "end") if right_half else (x + 9, "start")
    return [
        f'<g><circle cx="{x:.1f}" cy="{y:.1f}" r="5" fill="{color}" stroke="white" stroke-width="1.5"/>'
        f'<text x="{tx:.1f}" y="{ty:.1f}" text-anchor="{anchor}" fill="{color}" font-weight="bold">'
        f"{value}</text>{title}</g>"
    ]


def _legend(entries: list[tuple[str, str]], left: float, width: float) -> list[str]:
    out, x, y = [], float(left), 32.0
    for name, color in entries:
        span = 18 + 6.5 * min(len(name), 40)
        if x + span > width - 10 and x > left:
            break  # the rest stays reachable through the hover titles
        out.append(f'<rect x="{x:.1f}" y="{y - 9}" width="12" height="4" fill="{color}"/>')
        out.append(f'<text x="{x + 16:.1f}" y="{y - 4}">{html.escape(name[:40])}</text>')
        x += span + 10
    return out


def bars_svg(
    title: str,
    categories: Sequence[str],
    groups: dict[str, Sequence[float]],
    ylabel: str,
    width: int = 900,
    height: int = 260,
    percent: bool = False,
) -> str:
    """Grouped bars: one group per category, one bar per key of `groups` (e.g. target and realized)."""
    left, right, top, bottom = 70, 20, 46, 60
    pw, ph = width - left - right, height - top - bottom
    values = [v for vs in groups.values() for v in vs if _finite(v)]
    peak = max(values + [1e-12])
    out = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    for value in _ticks(0.0, peak):
        y = top + ph - ph * value / peak
        label = f"{100 * value:.0f}%" if percent else fmt_number(value)
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    ly = top + ph / 2
    out.append(
        f'<text x="14" y="{ly:.1f}" text-anchor="middle" transform="rotate(-90 14 {ly:.1f})">'
        f"{html.escape(ylabel)}</text>"
    )
    slot = pw / max(1, len(categories))
    bar = slot * 0.8 / max(1, len(groups))
    for i, category in enumerate(categories):
        x0 = left + i * slot + slot * 0.1
        for k, (name, vs) in enumerate(groups.items()):
            value = vs[i] if _finite(vs[i]) else 0.0
            bh = ph * value / peak
            shown = f"{100 * value:.2f}%" if percent else f"{value:,.6g}"
            out.append(
                f'<rect x="{x0 + k * bar:.1f}" y="{top + ph - bh:.1f}" width="{bar * 0.92:.1f}" '
                f'height="{bh:.1f}" fill="{COLORS[k % len(COLORS)]}"><title>{html.escape(category)} '
                f"{html.escape(name)}: {shown}</title></rect>"
            )
        cx = left + i * slot + slot / 2
        out.append(
            f'<text x="{cx:.1f}" y="{top + ph + 14}" text-anchor="middle">{html.escape(category[:24])}</text>'
        )
    out += _legend([(name, COLORS[k % len(COLORS)]) for k, name in enumerate(groups)], left, width)
    out.append("</svg>")
    return "\n".join(out)


def timeline_svg(
    title: str,
    rows: dict[str, list[tuple[float, str]]],
    x_max: float,
    xlabel: str = "tokens",
    width: int = 900,
) -> str:
    """One lane per event kind; each event a tick at its x with its details as the hover title."""
    left, right, top, lane = 110, 20, 30, 22
    height = top + lane * max(1, len(rows)) + 40
    pw = width - left - right
    x_max = x_max or 1.0
    out = [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(title)}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="16" font-size="13" font-weight="bold">{html.escape(title)}</text>',
    ]
    bottom = top + lane * max(1, len(rows))
    for value in _ticks(0.0, x_max):
        x = left + pw * value / x_max
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 14}" text-anchor="middle">{fmt_number(value)}</text>')
    out.append(
        f'<text x="{left + pw / 2:.1f}" y="{height - 6}" text-anchor="middle">{html.escape(xlabel)}</text>'
    )
    for i, (kind, events) in enumerate(rows.items()):
        y = top + lane * i + lane / 2
        color = EVENT_COLORS.get(kind, COLORS[i % len(COLORS)])
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{html.escape(kind)} ({len(events)})</text>'
        )
        for x_value, text in events:
            x = left + pw * min(max(x_value, 0.0), x_max) / x_max
            out.append(
                f'<rect x="{x - 2:.1f}" y="{y - 7:.1f}" width="4" height="14" fill="{color}">'
                f"<title>{html.escape(text)}</title></rect>"
            )
    out.append("</svg>")
    return "\n".join(out)
