"""The report's Experts section: how a mixture of experts spread its tokens, from metrics.jsonl's
"moe" records (one per logging window: each sparse layer's share of token copies per expert, the
max/mean load ratio, the router entropy and the copies dropped by a capacity limit)."""

from __future__ import annotations

import html
from typing import Any

from smelt.metric_records import finite
from smelt.report.page import missing, note, row, table
from smelt.report.run import Run
from smelt.report.svg import Chart, Series, chart_svg

SMALL = {"width": 440, "height": 230}
CELL_W, CELL_H, LEFT, TOP = 14, 14, 64, 28


def _color(share: float, uniform: float) -> str:
    """White at no load, the house blue at the uniform share, dark red at twice it and beyond."""
    t = max(0.0, min(share / (2 * uniform), 1.0)) if uniform > 0 else 0.0
    stops = ((0.0, (255, 255, 255)), (0.5, (76, 114, 176)), (1.0, (139, 0, 0)))
    for (t0, c0), (t1, c1) in zip(stops, stops[1:], strict=False):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True))
    return "#8b0000"


def load_heatmap_svg(layers: list[int], shares: list[list[float]], title: str) -> str:
    """Layers as rows, experts as columns, each cell the expert's share of the layer's token copies."""
    n_experts = max(len(r) for r in shares)
    uniform = 1.0 / n_experts
    cell_w = max(4, min(CELL_W, 800 // n_experts))
    # Wide enough for the title and the legend line, however few the experts.
    width, height = max(LEFT + cell_w * n_experts + 20, 620), TOP + CELL_H * len(layers) + 36
    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
        f'<text x="{LEFT}" y="16" font-size="13">{html.escape(title)}</text>',
    ]
    for r, (layer, row_shares) in enumerate(zip(layers, shares, strict=True)):
        y = TOP + r * CELL_H
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + CELL_H - 3}" font-size="11" text-anchor="end">layer {layer}</text>'
        )
        for e, share in enumerate(row_shares):
            x = LEFT + e * cell_w
            parts.append(
                f'<rect x="{x}" y="{y}" width="{cell_w}" height="{CELL_H}" fill="{_color(share, uniform)}" '
                f'stroke="#ffffff" stroke-width="0.5"><title>layer {layer}, expert {e}: {100 * share:.2f}% '
                f"of token copies ({share / uniform:.2f}x uniform)</title></rect>"
            )
    y = TOP + CELL_H * len(layers) + 14
    parts.append(
        f'<text x="{LEFT}" y="{y}" font-size="11">expert 0 .. {n_experts - 1}; white: no tokens, blue: the '
        f"uniform share 1/{n_experts}, dark red: twice uniform or more</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _mean_shares(records: list[dict[str, Any]]) -> list[list[float]]:
    """Per layer and expert, the mean of the windows' shares (every window has the same batch size)."""
    rows = [r["moe_load"] for r in records]
    return [
        [sum(w[i][e] for w in rows) / len(rows) for e in range(len(rows[0][i]))] for i in range(len(rows[0]))
    ]


def experts_section(run: Run) -> str:
    records = [r for r in run.kind("moe") if r.get("moe_load")]
    if not records:
        return missing("no expert loads in metrics.jsonl (a dense model, or a run before MoE logging).")
    layers = records[-1]["moe_layers"]
    records = [r for r in records if r.get("moe_layers") == layers]
    overall = load_heatmap_svg(layers, _mean_shares(records), "share of token copies per expert, whole run")
    last = load_heatmap_svg(layers, records[-1]["moe_load"], f"last window (step {records[-1].get('step')})")
    xs = [run.cumulative(r.get("tokens")) for r in records]
    ratio = Chart(
        "max / mean expert load per layer (1 = balanced)",
        "tokens",
        "max / mean",
        [
            Series(f"layer {layer}", xs, [r["moe_max_mean"][i] for r in records])
            for i, layer in enumerate(layers)
        ],
        y_zero=True,
        **SMALL,
    )
    entropy = Chart(
        "router entropy per layer (nats; ln E is uniform)",
        "tokens",
        "entropy",
        [
            Series(f"layer {layer}", xs, [r["moe_entropy"][i] for r in records])
            for i, layer in enumerate(layers)
        ],
        y_zero=True,
        **SMALL,
    )
    final = records[-1]
    rows = [
        (
            layer,
            final["moe_max_mean"][i],
            final["moe_entropy"][i],
            (final.get("moe_dropped") or [0] * len(layers))[i],
        )
        for i, layer in enumerate(layers)
    ]
    dropped = sum(sum(r.get("moe_dropped") or []) for r in records)
    text = overall + "\n" + last + "\n" + row(chart_svg(ratio), chart_svg(entropy))
    text += table(
        ["layer", "max / mean load (last window)", "router entropy", "dropped copies (last window)"], rows
    )
    if dropped:
        text += note(f"{dropped:,} token copies were dropped by the capacity limit over the run.")
    elif all(finite(v) for v in final["moe_max_mean"]):
        text += note("no token copy was dropped (dropless routing, or a capacity never reached).")
    return text
