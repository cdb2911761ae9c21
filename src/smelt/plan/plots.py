"""Scaling-law figures as self-contained SVG (the house style of smelt.data.plots: no plotting library).

`fit_svg`: the runs' losses against compute, coloured by model size, with the fitted law's
compute-optimal frontier, and observed against predicted loss (a good fit hugs the diagonal).
`isoflop_svg`: one parabola per compute group with its minimum, and the minima's N*(C) power law.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import numpy as np

from smelt.plan.isoflop import IsoFlopFit
from smelt.plan.laws import LossLaw
from smelt.plan.points import Points

LEGEND_LINES = 8
COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


class _Axes:
    """A panel mapping data to pixels; log axes take log10 of the data first."""

    def __init__(
        self, x0: float, y0: float, w: float, h: float, xr: tuple[float, float], yr: tuple[float, float]
    ) -> None:
        pad_x = (xr[1] - xr[0]) * 0.04 or 0.5
        pad_y = (yr[1] - yr[0]) * 0.06 or 0.5
        self.x0, self.y0, self.w, self.h = x0, y0, w, h
        self.xr = (xr[0] - pad_x, xr[1] + pad_x)
        self.yr = (yr[0] - pad_y, yr[1] + pad_y)

    def px(self, x: float) -> float:
        return self.x0 + self.w * (x - self.xr[0]) / (self.xr[1] - self.xr[0])

    def py(self, y: float) -> float:
        return self.y0 + self.h - self.h * (y - self.yr[0]) / (self.yr[1] - self.yr[0])

    def frame(self, xlabel: str, ylabel: str, x_is_log: bool, y_is_log: bool) -> list[str]:
        box = f'x="{self.x0}" y="{self.y0}" width="{self.w}" height="{self.h}"'
        out = [f'<rect {box} fill="none" stroke="#999"/>']
        for value in _ticks(*self.xr, integer=x_is_log):
            x = self.px(value)
            label = f"1e{value:g}" if x_is_log else f"{value:g}"
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{self.y0}" y2="{self.y0 + self.h}" stroke="#eee"/>'
            )
            out.append(f'<text x="{x:.1f}" y="{self.y0 + self.h + 14}" text-anchor="middle">{label}</text>')
        for value in _ticks(*self.yr, integer=y_is_log):
            y = self.py(value)
            label = f"1e{value:g}" if y_is_log else f"{value:.2f}"
            out.append(
                f'<line x1="{self.x0}" x2="{self.x0 + self.w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            )
            out.append(f'<text x="{self.x0 - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
        cx, cy = self.x0 + self.w / 2, self.y0 + self.h + 30
        out.append(f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="middle">{html.escape(xlabel)}</text>')
        lx, ly = self.x0 - 44, self.y0 + self.h / 2
        out.append(
            f'<text x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle" transform="rotate(-90 {lx:.1f} {ly:.1f})">'
            f"{html.escape(ylabel)}</text>"
        )
        return out

    def polyline(self, xs: Sequence[float], ys: Sequence[float], color: str, dash: str = "") -> str:
        points = " ".join(
            f"{self.px(x):.1f},{self.py(y):.1f}"
            for x, y in zip(xs, ys, strict=True)
            if self.yr[0] <= y <= self.yr[1]
        )
        extra = f' stroke-dasharray="{dash}"' if dash else ""
        return f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="2"{extra}/>'

    def dot(self, x: float, y: float, color: str, title: str, r: float = 3.5) -> str:
        return (
            f'<circle cx="{self.px(x):.1f}" cy="{self.py(y):.1f}" r="{r}" fill="{color}" fill-opacity="0.8">'
            f"<title>{html.escape(title)}</title></circle>"
        )


def _ticks(lo: float, hi: float, integer: bool) -> list[float]:
    if integer:
        return [float(v) for v in range(math.ceil(lo), math.floor(hi) + 1)]
    span = hi - lo
    step = 10 ** math.floor(math.log10(span / 4)) if span > 0 else 1.0
    for mult in (1, 2, 5, 10):
        if span / (step * mult) <= 6:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _header(width: int, height: int, title: str) -> list[str]:
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="20" y="18" font-size="13">{html.escape(title)}</text>',
    ]


def _size_color(log_n: float, lo: float, hi: float) -> str:
    t = 0.0 if hi <= lo else (log_n - lo) / (hi - lo)
    r, g, b = (int(round(a + (z - a) * t)) for a, z in ((68, 253), (1, 231), (84, 37)))  # viridis ends
    return f"#{r:02x}{g:02x}{b:02x}"


def fit_svg(points: Points, law: LossLaw, width: int = 1000, height: int = 420) -> str:
    """Loss vs compute with the law's frontier (left); observed vs predicted loss (right)."""
    logc = np.log10(points.compute)
    logn = np.log10(points.n)
    predicted = np.array([law.loss(n, d) for n, d in zip(points.n, points.d, strict=True)])
    frontier_c = np.linspace(logc.min() - 0.3, logc.max() + 0.5, 80)
    frontier = [law.loss(*law.optimal(10**c)) for c in frontier_c]
    out = _header(
        width, height, f"L(N, D) = {law.E:.3g} + {law.A:.4g}/N^{law.alpha:.3f} + {law.B:.4g}/D^{law.beta:.3f}"
    )
    top, left, gap = 40, 70, 90
    pw = (width - left - gap - 30) / 2
    ph = height - top - 70
    lo_y = min(points.loss.min(), min(frontier))
    hi_y = points.loss.max()
    ax = _Axes(left, top, pw, ph, (float(frontier_c[0]), float(frontier_c[-1])), (float(lo_y), float(hi_y)))
    out += ax.frame("training compute 6ND (FLOPs)", "final loss", True, False)
    out.append(ax.polyline(frontier_c, frontier, "#c44e52"))
    for i in range(points.n.size):
        color = _size_color(logn[i], logn.min(), logn.max())
        title = f"{points.labels[i]}: N={points.n[i]:.3g}, D={points.d[i]:.3g}, loss {points.loss[i]:.4f}"
        out.append(ax.dot(logc[i], points.loss[i], color, title))
    out.append(
        f'<text x="{left + 8}" y="{top + 14}" fill="#c44e52">compute-optimal frontier L(N*(C), D*(C))</text>'
    )
    out.append(f'<text x="{left + 8}" y="{top + 28}">colour: model size (dark small, yellow large)</text>')
    x0 = left + pw + gap
    both = np.concatenate([points.loss, predicted])
    ax2 = _Axes(
        x0, top, pw, ph, (float(both.min()), float(both.max())), (float(both.min()), float(both.max()))
    )
    out += ax2.frame("predicted loss", "observed loss", False, False)
    diag = [float(both.min()), float(both.max())]
    out.append(ax2.polyline(diag, diag, "#999", dash="4 3"))
    for i in range(points.n.size):
        color = _size_color(logn[i], logn.min(), logn.max())
        out.append(
            ax2.dot(predicted[i], points.loss[i], color, f"{points.labels[i]}: predicted {predicted[i]:.4f}")
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def isoflop_svg(fit: IsoFlopFit, width: int = 1000, height: int = 420) -> str:
    """IsoFLOP parabolas (left) and N*(C) (right)."""
    groups = [g for g in fit.groups if g.n.size >= 2]
    out = _header(width, height, "IsoFLOP profiles (Approach 2)")
    top, left, gap = 40, 70, 90
    pw = (width - left - gap - 30) / 2
    ph = height - top - 70
    if not groups:
        out.append(f'<text x="{left}" y="{top + 20}">no compute group has two or more sizes</text></svg>')
        return "\n".join(out) + "\n"
    all_n = np.log10(np.concatenate([g.n for g in groups]))
    all_l = np.concatenate([g.loss for g in groups])
    ax = _Axes(
        left, top, pw, ph, (float(all_n.min()), float(all_n.max())), (float(all_l.min()), float(all_l.max()))
    )
    out += ax.frame("parameters N", "final loss", True, False)
    for k, group in enumerate(groups):
        color = COLORS[k % len(COLORS)]
        for n, loss in zip(group.n, group.loss, strict=True):
            out.append(
                ax.dot(math.log10(n), loss, color, f"C={group.compute:.3g}: N={n:.3g}, loss {loss:.4f}")
            )
        if group.coefficients is not None:
            c0, c1, c2 = group.coefficients
            u = np.linspace(np.log(group.n.min()), np.log(group.n.max()), 40)
            out.append(
                ax.polyline(
                    u / math.log(10), c0 + c1 * u + c2 * u * u, color, "" if group.status == "ok" else "3 3"
                )
            )
        if group.n_opt is not None and group.status == "ok":
            out.append(
                ax.dot(math.log10(group.n_opt), group.loss_opt, "black", f"N* = {group.n_opt:.3g}", r=5)
            )
        if k < LEGEND_LINES:
            label = f"C = {group.compute:.2e} ({html.escape(group.status)})"
            out.append(f'<text x="{left + 8}" y="{top + 14 + 13 * k}" fill="{color}">{label}</text>')
    if len(groups) > LEGEND_LINES:
        more = f"... {len(groups) - LEGEND_LINES} more groups (hover the points)"
        out.append(f'<text x="{left + 8}" y="{top + 14 + 13 * LEGEND_LINES}">{more}</text>')
    used = fit.used
    x0 = left + pw + gap
    if used:
        logc = np.log10([g.compute for g in used])
        logn = np.log10([g.n_opt for g in used])
        span_c = (float(logc.min()) - 0.2, float(logc.max()) + 0.2)
        ax2 = _Axes(x0, top, pw, ph, span_c, (float(logn.min()) - 0.2, float(logn.max()) + 0.2))
        out += ax2.frame("compute C (FLOPs)", "optimal parameters N*", True, True)
        for c, n in zip(logc, logn, strict=True):
            out.append(ax2.dot(c, n, "black", f"C={10**c:.3g}: N*={10**n:.3g}", r=4))
        if fit.a is not None and fit.log_k is not None:
            xs = np.linspace(*span_c, 20)
            ys = (fit.log_k + fit.a * xs * math.log(10)) / math.log(10)
            out.append(ax2.polyline(xs, ys, "#c44e52"))
            out.append(f'<text x="{x0 + 8}" y="{top + 14}" fill="#c44e52">N* ~ C^{fit.a:.3f}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
