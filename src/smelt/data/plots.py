"""The retention waterfall of a curate run, as a self-contained SVG (no plotting library, no network).

Left panel: documents remaining after each step, the part a step removed stacked in red on top.
Right panel: per source, the share of input characters still present after each step — where a source
loses its text, and to which step, is what a person reviewing a curation wants to see first.
"""

from __future__ import annotations

import html
from typing import Any

COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _frame(x0: float, y0: float, w: float, h: float, peak: float, fmt: str) -> list[str]:
    out = []
    for i in range(5):
        value = peak * i / 4
        y = y0 + h - h * i / 4
        out.append(f'<line x1="{x0}" x2="{x0 + w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt.format(value)}</text>')
    return out


def _labels(x0: float, slot: float, y: float, names: list[str]) -> list[str]:
    out = []
    for i, name in enumerate(names):
        cx = x0 + i * slot + slot / 2
        out.append(
            f'<text x="{cx:.1f}" y="{y:.1f}" text-anchor="end" transform="rotate(-35 {cx:.1f} {y:.1f})">'
            f"{html.escape(name)}</text>"
        )
    return out


def retention_svg(stats: dict[str, Any], width: int = 1000, height: int = 380) -> str:
    steps = stats["steps"]
    names = [s["step"] for s in steps]
    left, top, bottom, gap = 60, 34, 100, 70
    panel_w = (width - left - gap - 20) / 2
    plot_h = height - top - bottom
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">documents after each step (red: removed by the step)</text>',
    ]
    peak = max([s["in"] for s in steps] + [1])
    slot = panel_w / max(1, len(steps))
    out += _frame(left, top, panel_w, plot_h, peak, "{:,.0f}")
    for i, step in enumerate(steps):
        x = left + i * slot + slot * 0.15
        kept_h = plot_h * step["out"] / peak
        lost_h = plot_h * max(0, step["in"] - step["out"]) / peak
        y = top + plot_h - kept_h
        out.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{slot * 0.7:.1f}" height="{kept_h:.1f}" fill="#4c72b0">'
            f"<title>{html.escape(step['step'])}: {step['out']:,} out</title></rect>"
        )
        if lost_h > 0:
            out.append(
                f'<rect x="{x:.1f}" y="{y - lost_h:.1f}" width="{slot * 0.7:.1f}" height="{lost_h:.1f}" '
                f'fill="#c44e52"><title>{html.escape(step["step"])}: {step["in"] - step["out"]:,} removed'
                f"</title></rect>"
            )
    out += _labels(left, slot, top + plot_h + 14, names)

    x0 = left + panel_w + gap
    out.append(f'<text x="{x0}" y="18" font-size="13">share of input characters kept, per source</text>')
    out += _frame(x0, top, panel_w, plot_h, 100.0, "{:.0f}%")
    sources = list(stats.get("sources", {}))
    for k, source in enumerate(sources):
        base = steps[0]["sources"][source]["chars_out"] or 1
        points = []
        for i, step in enumerate(steps):
            share = 100.0 * step["sources"][source]["chars_out"] / base
            points.append(f"{x0 + i * slot + slot / 2:.1f},{top + plot_h - plot_h * share / 100:.1f}")
        color = COLORS[k % len(COLORS)]
        out.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="{color}" stroke-width="2"/>')
        lx = x0 + (k % 4) * 120
        ly = height - 14 - 14 * (k // 4)
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{lx + 14}" y="{ly}">{html.escape(source)}</text>')
    out += _labels(x0, slot, top + plot_h + 14, names)
    out.append("</svg>")
    return "\n".join(out) + "\n"
