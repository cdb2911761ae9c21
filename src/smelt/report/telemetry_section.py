"""The report's Telemetry section, from metrics.jsonl's `telemetry` records (per layer: activation RMS,
excess kurtosis, max attention logit; the max output logit) and `layers` records (per layer: update
ratio, Adam moment RMS), written every train.telemetry_every steps (train/telemetry.py), and the
run-health alerts (train/health.py) with the keys that set them.

Each per-layer figure is a heat map: layers as rows, logged steps as columns, the colour the value on
a linear or a log scale from the smallest to the largest value in the map (hover a cell for it)."""

from __future__ import annotations

import html
import math
from typing import Any

from smelt.metric_records import finite
from smelt.report.page import missing, note, table
from smelt.report.run import Run
from smelt.report.svg import Chart, Series, chart_svg, fmt_number

MAX_COLUMNS = 120  # steps shown in a heat map; a longer run shows evenly spaced ones
LEFT, TOP, WIDTH = 64, 28, 760
# (record kind, field, title, log colour scale, what to read in it)
MAPS = (
    (
        "telemetry",
        "act_rms",
        "activation RMS after each block",
        False,
        "The residual stream's RMS grows with depth and over training; a layer that runs away from its "
        "neighbours is the first sign of instability.",
    ),
    (
        "telemetry",
        "act_kurtosis",
        "excess kurtosis of the activations",
        False,
        "0 for normally spread values; it climbs when a few feature dimensions carry outsized values "
        "(outlier features), which hurts low-precision training and quantisation.",
    ),
    (
        "telemetry",
        "attn_logit_max",
        "max attention logit q.k / sqrt(d)",
        False,
        "Logits above about 50 are where attention collapses onto one key and the loss spikes; QK-norm "
        "(model.qk_norm) keeps them bounded.",
    ),
    (
        "layers",
        "update_ratio",
        "update ratio ||dW|| / ||W|| per layer",
        True,
        "Near 1e-3 is the rule of thumb; above 1e-2 a layer is moved too far per step, below 1e-5 it is "
        "not learning (train.alert_update_ratio_max / _min).",
    ),
    (
        "layers",
        "adam_m_rms",
        "Adam first moment RMS per layer",
        True,
        "The running mean of the gradient: it shrinks as the gradient's signal fades into noise.",
    ),
    (
        "layers",
        "adam_v_rms",
        "Adam second moment RMS per layer",
        True,
        "The running mean of the squared gradient: a sudden rise in one layer marks a gradient burst there; "
        "a collapse towards train.eps makes Adam's steps blow up.",
    ),
)


def _color(t: float) -> str:
    """Pale yellow at 0, the house blue in the middle, dark purple at 1."""
    stops = ((0.0, (255, 247, 188)), (0.5, (76, 114, 176)), (1.0, (63, 0, 90)))
    t = max(0.0, min(t, 1.0))
    for (t0, c0), (t1, c1) in zip(stops, stops[1:], strict=False):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return "#" + "".join(f"{round(a + (b - a) * f):02x}" for a, b in zip(c0, c1, strict=True))
    return "#3f005a"


def heatmap_svg(title: str, steps: list[int], values: list[list[float | None]], log: bool) -> str:
    """Rows are layers (values[column][layer]), columns are steps; missing values stay grey."""
    layers = max((len(column) for column in values), default=0)
    cells = [v for column in values for v in column if finite(v) and (not log or v > 0)]
    if not cells or not layers:
        return ""
    scale = (lambda v: math.log10(v)) if log else (lambda v: v)  # noqa: E731
    lo, hi = min(scale(v) for v in cells), max(scale(v) for v in cells)
    cell_w = max(2, min(24, WIDTH // max(len(steps), 1)))
    cell_h = max(6, min(16, 320 // layers))
    width = max(LEFT + cell_w * len(steps) + 20, 620)
    height = TOP + cell_h * layers + 40
    parts = [
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
        f'<text x="{LEFT}" y="16" font-size="13">{html.escape(title)}</text>',
    ]
    label_every = max(1, layers // 16)
    for layer in range(layers):
        y = TOP + layer * cell_h
        if layer % label_every == 0:
            parts.append(f'<text x="{LEFT - 6}" y="{y + cell_h - 1}" font-size="10" text-anchor="end">'
                         f"layer {layer}</text>")  # fmt: skip
        for c, (step, column) in enumerate(zip(steps, values, strict=True)):
            v = column[layer] if layer < len(column) else None
            ok = finite(v) and (not log or v > 0)
            fill = _color((scale(v) - lo) / (hi - lo) if hi > lo else 0.5) if ok else "#dddddd"
            shown = f"{v:.4g}" if ok else "-"
            parts.append(
                f'<rect x="{LEFT + c * cell_w}" y="{y}" width="{cell_w}" height="{cell_h}" fill="{fill}">'
                f"<title>step {step}, layer {layer}: {shown}</title></rect>"
            )
    y = TOP + cell_h * layers + 14
    low, high = (10**lo, 10**hi) if log else (lo, hi)
    parts.append(
        f'<text x="{LEFT}" y="{y}" font-size="11">steps {steps[0]} .. {steps[-1]} left to right; pale: '
        f"{low:.3g}, blue: {'the geometric middle' if log else 'the middle'}, dark: {high:.3g}"
        f"{' (log scale)' if log else ''}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def _columns(records: list[dict[str, Any]], field: str) -> tuple[list[int], list[list[float | None]]]:
    """(steps, per-step per-layer values) of `field`, thinned to MAX_COLUMNS evenly spaced records."""
    chosen = [r for r in records if _layer_values(r, field)]
    if len(chosen) > MAX_COLUMNS:
        chosen = [chosen[round(i * (len(chosen) - 1) / (MAX_COLUMNS - 1))] for i in range(MAX_COLUMNS)]
    return [int(r.get("step") or 0) for r in chosen], [_layer_values(r, field) for r in chosen]


def _layer_values(record: dict[str, Any], field: str) -> list[float | None]:
    if record.get("kind") == "layers":
        return list((record.get("by_layer") or {}).get(field) or [])
    return list(record.get(field) or [])


def telemetry_section(run: Run) -> str:
    telemetry, layers = run.kind("telemetry"), run.kind("layers")
    parts = []
    for kind, field, title, log, reading in MAPS:
        steps, values = _columns(telemetry if kind == "telemetry" else layers, field)
        svg = heatmap_svg(title, steps, values, log) if steps else ""
        if svg:
            parts += [svg, note(reading)]
    peaks = [r for r in telemetry if finite(r.get("logit_max"))]
    if peaks:
        xs = [run.cumulative(r.get("tokens")) for r in peaks]
        attention = [
            max((v for v in r.get("attn_logit_max") or [] if finite(v)), default=None) for r in peaks
        ]
        chart = Chart(
            "largest output logit and largest attention logit (over the layers)", "tokens", "logit",
            [Series("output logit max", xs, [r["logit_max"] for r in peaks], dots=len(xs) < 30),
             Series("attention logit max", xs, attention, dash="4 3", dots=len(xs) < 30)],
        )  # fmt: skip
        parts.append(chart_svg(chart))
        parts.append(note("A growing output logit is the head's weights drifting upwards (z-loss, model.z_loss, "
                          "holds it); attention logits past about 50 call for QK-norm."))  # fmt: skip
    if not parts:
        start = run.start()
        said = start.get("telemetry")
        return missing(
            "no telemetry records in metrics.jsonl"
            + (
                f" (telemetry: {said})"
                if said
                else " (a run older than train.telemetry_every, or one too short)"
            )
            + "."
        )
    sample = next((r.get("sample_tokens") for r in telemetry), None)
    if sample:
        parts.append(note(f"Activation figures come from a forward of the first {fmt_number(sample)} tokens of "
                          f"each sampled step's first micro batch (on every data-parallel rank, pooled)."))  # fmt: skip
    parts.append(_health_table(run))
    return "\n".join(parts)


def _health_table(run: Run) -> str:
    alerts = [r for r in run.events("alert") if r.get("key")]
    if not alerts:
        return note("No run-health alert fired (docs/observability.md lists them and their keys).")
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in alerts:
        by_kind.setdefault(str(r.get("alert")), []).append(r)
    rows = [
        [kind, len(found), ", ".join(str(r.get("step")) for r in found[:8]) + (", ..." if len(found) > 8 else ""),
         f"{found[0].get('key')} = {found[0].get('threshold'):g}", str(found[-1].get("message"))]
        for kind, found in sorted(by_kind.items())
    ]  # fmt: skip
    return table(["run-health alert", "times", "steps", "threshold", "last message"], rows)
