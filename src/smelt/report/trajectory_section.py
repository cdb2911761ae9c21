"""The report's expected-trajectory section: the curve train.expect pre-registered, its band, and the
run's validation loss against them (from metrics.jsonl alone: the `expected_trajectory` event, the
eval records and the `off_trajectory` alerts)."""

from __future__ import annotations

from smelt.metric_records import finite
from smelt.report.page import missing, note, table
from smelt.report.run import Run
from smelt.report.svg import EVENT_COLORS, Band, Chart, Marker, Series, chart_svg
from smelt.train.trajectory import band_at


def trajectory_section(run: Run) -> str:
    events = run.events("expected_trajectory")
    if not events:
        return missing(
            "no expected trajectory: train with train.expect = FIT_FILE (a fit.json from `smelt scaling fit "
            "LADDER --target N,D`) to pre-register the validation-loss curve (docs/observability.md)."
        )
    registered = events[-1]
    curve, offset = registered["curve"], run.tokens_offset
    evals = [r for r in run.kind("eval") if finite(r.get("val_loss")) and not r.get("inloop")]
    alerts = [r for r in run.events("alert") if r.get("alert") == "off_trajectory"]
    xs = [offset + float(t) for t in curve["tokens"]]
    chart = Chart(
        "validation loss against its pre-registered trajectory",
        "tokens",
        "loss",
        [
            Series("expected (centre)", xs, curve["loss"], color="#8c8c8c", dash="6 4"),
            Series(
                "validation loss",
                [run.cumulative(r["tokens"]) for r in evals],
                [r["val_loss"] for r in evals],
                color="#4c72b0",
                dots=True,
            ),  # fmt: skip
        ],
        bands=[Band("expected band", xs, curve["lo"], curve["hi"], color="#8c8c8c")],
        markers=[
            Marker(run.cumulative(r.get("tokens")), "off band", str(r.get("message")), EVENT_COLORS["alert"])
            for r in alerts
        ],
    )
    rows, inside, judged = [], 0, 0
    for r in evals:
        band = band_at(curve, float(r["tokens"]))
        if band is None:
            continue
        centre, lo, hi = band
        judged += 1
        inside += lo <= r["val_loss"] <= hi
        where = "inside" if lo <= r["val_loss"] <= hi else ("above" if r["val_loss"] > hi else "below")
        rows.append([r.get("step"), r["tokens"], r["val_loss"], centre, f"[{lo:.4f}, {hi:.4f}]", where])
    target = registered.get("target") or {}
    parts = [
        chart_svg(chart),
        note(
            f"Pre-registered from {registered.get('file')} for N {float(target.get('params', 0)):,.0f}, D "
            f"{float(target.get('tokens', 0)):,.0f}; band: {registered.get('band')}. {inside} of {judged} "
            f"validations inside the band; {len(alerts)} off-trajectory alert(s) (the smoothed loss outside the "
            f"band for {int(registered.get('tolerance_tokens') or 0):,} tokens)."
        ),
        table(["step", "tokens", "val loss", "expected", "band", ""], rows),
    ]
    return "\n".join(parts)
