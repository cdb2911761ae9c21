"""Report sections drawn from metrics.jsonl alone: loss, learning rate, gradients, speed, events."""

from __future__ import annotations

import statistics
from typing import Any

from smelt.metric_records import describe_event, finite
from smelt.report.goodput import GOODPUT_PARTS, run_goodput
from smelt.report.page import missing, note, row, table
from smelt.report.run import Run
from smelt.report.svg import EVENT_COLORS, Chart, Marker, Series, chart_svg, timeline_svg

# Events that change how a curve should be read; they are drawn on the loss plot and the timeline.
NOTABLE = ("alert", "skip", "rollback", "resume", "stage", "overflow")
# Events kept in the timeline table but not drawn (routine, or one line each already in other sections).
ROUTINE = ("checkpoint", "mixture", "data_plan", "start")
MAX_MARKERS = 60
SMALL = {"width": 440, "height": 230}  # charts shown two to a row


def _markers(run: Run) -> list[Marker]:
    notable = [
        r for r in run.events(*NOTABLE) if not (r.get("event") == "stage" and int(r.get("step") or 0) == 0)
    ]
    markers = [
        Marker(
            run.cumulative(r.get("tokens")),
            str(r.get("alert") or r.get("event"))[:10],
            f"step {r.get('step')}: {describe_event(r)}",
            EVENT_COLORS.get(str(r.get("event")), "#999999"),
        )
        for r in notable[:MAX_MARKERS]
    ]
    return markers


def _xy(
    records: list[dict[str, Any]], key: str, offset: float = 0.0
) -> tuple[list[float], list[float | None]]:
    xs = [offset + float(r.get("tokens") or 0) for r in records]  # offset: a fork's parent tokens
    return xs, [r.get(key) if finite(r.get(key)) else None for r in records]


def loss_section(run: Run) -> str:
    train = run.kind("train")
    evals = [r for r in run.kind("eval") if finite(r.get("val_loss"))]
    if not train and not evals:
        return missing(f"{run.metrics_path} holds no train or eval records yet.")
    series = []
    if train:
        xy = _xy(train, "loss", run.tokens_offset)
        series.append(Series("train loss (mean over the log window)", *xy))
        for source in sorted({s for r in train for s in (r.get("loss_by_source") or {})}):
            xs = [run.cumulative(r.get("tokens")) for r in train]
            ys = [(r.get("loss_by_source") or {}).get(source) for r in train]
            series.append(Series(f"train {source}", xs, ys, dash="1 2"))
    sources = sorted({s for r in evals for s in (r.get("val_loss_by_source") or {})})
    if evals:
        weighting = evals[-1].get("val_loss_weighting")
        name = (
            f"validation loss ({weighting}-weighted)" if weighting and len(sources) > 1 else "validation loss"
        )
        series.append(Series(name, *_xy(evals, "val_loss", run.tokens_offset), dots=True))
        for source in sources:
            xs = [run.cumulative(r.get("tokens")) for r in evals]
            ys = [(r.get("val_loss_by_source") or {}).get(source) for r in evals]
            series.append(Series(f"val {source}", xs, ys, dash="4 3", dots=True))
    markers = _markers(run)
    parts = [
        chart_svg(
            Chart("loss against tokens (dashed lines mark events)", "tokens", "loss", series, markers=markers)
        )
    ]
    if len(run.events(*NOTABLE)) > MAX_MARKERS:
        parts.append(
            note(f"the first {MAX_MARKERS} events are marked; the timeline below lists all of them.")
        )
    parts.append(
        note(
            "The train loss is the mean over each logging window of train.log_every steps; with several "
            "sources, dotted lines are each source's token-mean train loss over the window and dashed lines "
            "its validation loss."
        )
    )
    if len(sources) > 1:
        parts.append(note(_weighting_text(evals[-1])))
    skipped = run.events("eval_skipped")
    if skipped:
        parts.append(
            note(
                f"{len(skipped)} periodic validation(s) skipped to keep evaluation within train.eval_budget = "
                f"{skipped[0].get('eval_budget')} of the training time (steps "
                f"{', '.join(str(e.get('step')) for e in skipped[:10])}{', ...' if len(skipped) > 10 else ''})."
            )
        )
    return "\n".join(parts)


def _weighting_text(record: dict[str, Any]) -> str:
    """How the headline validation loss of `record` combines its sources."""
    weights = record.get("val_loss_weights") or {}
    listed = ", ".join(f"{source} {weight:.3f}" for source, weight in sorted(weights.items()))
    if record.get("val_loss_weighting") == "tokens":
        return f"The validation loss weighs each source by the tokens scored ({listed})."
    if record.get("val_loss_weighting") == "mixture":
        return (
            f"The validation loss is the mean of the per-source validation losses weighted by the training "
            f"mixture ({listed}), the figure the summary and summary.json report."
        )
    return "The validation loss of this run is over the concatenated validation split, not per source."


def lr_section(run: Run) -> str:
    train = run.kind("train")
    if not any(finite(r.get("lr")) for r in train):
        return missing("no learning rate in the train records.")
    start = run.start()
    text = chart_svg(
        Chart(
            "learning rate",
            "tokens",
            "lr",
            [Series("lr", *_xy(train, "lr", run.tokens_offset))],
            markers=_markers(run),
            y_zero=True,
        )
    )
    details = f"schedule {start.get('schedule', '?')}, warmup {start.get('warmup_steps', '?')} steps"
    return text + note(details)


def gradients_section(run: Run) -> str:
    train = run.kind("train")
    if not any(finite(r.get("grad_norm")) for r in train):
        return missing("no gradient norms in the train records.")
    norms = Chart(
        "gradient norm before clipping (at the logged step)",
        "tokens",
        "grad norm",
        [
            Series("grad norm", *_xy(train, "grad_norm", run.tokens_offset)),
            Series("after clipping", *_xy(train, "grad_norm_clipped", run.tokens_offset), dash="4 3"),
        ],
        markers=_markers(run),
        log_y=True,
    )
    clip = Chart(
        "share of steps clipped per log window",
        "tokens",
        "clip fraction",
        [Series("clip fraction", *_xy(train, "clip_fraction", run.tokens_offset))],
        y_zero=True,
        **SMALL,
    )
    small = [chart_svg(clip)]
    layers = run.kind("layers")
    if layers:
        xs = [run.cumulative(r.get("tokens")) for r in layers]
        quantiles: dict[str, list[float | None]] = {"max": [], "median": [], "min": []}
        for r in layers:
            ratios = sorted(
                v["update_ratio"]
                for v in (r.get("layers") or {}).values()
                if finite(v.get("update_ratio")) and v["update_ratio"] > 0
            )
            quantiles["max"].append(ratios[-1] if ratios else None)
            quantiles["median"].append(statistics.median(ratios) if ratios else None)
            quantiles["min"].append(ratios[0] if ratios else None)
        chart = Chart(
            "update ratio ||dW|| / ||W|| (healthy near 1e-3)",
            "tokens",
            "update ratio",
            [Series(k, xs, v, dots=len(xs) < 30) for k, v in quantiles.items()],
            log_y=True,
            **SMALL,
        )
        small.append(chart_svg(chart))
    else:
        small.append(note("no per-layer update ratios logged (train.monitor_every = 0)."))
    return chart_svg(norms) + "\n" + row(*small)


def throughput_section(run: Run) -> str:
    train = [r for r in run.kind("train") if finite(r.get("tokens_per_s"))]
    if not train:
        return missing("no throughput in the train records.")
    xs = [run.cumulative(r.get("tokens")) for r in train]
    charts = [
        chart_svg(
            Chart(
                "throughput",
                "tokens",
                "tokens/s",
                [Series("tokens/s", *_xy(train, "tokens_per_s", run.tokens_offset))],
                y_zero=True,
                **SMALL,
            )
        )
    ]
    if any(finite(r.get("mfu")) for r in train):
        mfu = [100 * r["mfu"] if finite(r.get("mfu")) else None for r in train]
        charts.append(
            chart_svg(
                Chart(
                    "model FLOPs utilization",
                    "tokens",
                    "MFU %",
                    [Series("MFU % (6N + attention)", xs, mfu), *_model_mfu_series(train, xs)],
                    y_zero=True,
                    **SMALL,
                )
            )
        )
    else:
        charts.append(note("no MFU: the device's peak FLOP/s is unknown to smelt."))
    if any(finite(r.get("loader_wait_share")) for r in train):
        share = [100 * r["loader_wait_share"] if finite(r.get("loader_wait_share")) else None for r in train]
        charts.append(
            chart_svg(
                Chart(
                    "share of step time waiting for data",
                    "tokens",
                    "%",
                    [Series("loader wait %", xs, share)],
                    y_zero=True,
                    **SMALL,
                )
            )
        )
    if any(finite(r.get("memory_mb")) for r in train):
        memory = [r.get("memory_mb") if finite(r.get("memory_mb")) else None for r in train]
        charts.append(
            chart_svg(
                Chart("peak memory", "tokens", "MB", [Series("memory MB", xs, memory)], y_zero=True, **SMALL)
            )
        )
    start = run.start()
    text = note(
        f"device {start.get('device', '?')}, precision {start.get('precision', '?')}, world size "
        f"{start.get('world_size', '?')}, {start.get('flops_per_token', 0) or 0:.4g} FLOPs per token (6N + 12 L d s, "
        f"head counted; {start.get('model_flops_per_token', 0) or 0:.4g} as matmul model FLOPs); the first "
        f"logged window includes start-up and compilation. Memory is peak accelerator memory on CUDA, else "
        f"the process's peak RSS."
    )
    return row(*charts) + text + operations(run)


def operations(run: Run) -> str:
    """Step-time percentiles per rank, straggler alerts, goodput and the checkpoint-interval advice
    (report/goodput.py), for runs whose train records carry them."""
    timed = [r for r in run.kind("train") if finite(r.get("step_time_p50_s"))]
    if not timed:
        return ""
    xs = [run.cumulative(r.get("tokens")) for r in timed]
    ranks = max(len(r.get("rank_own_time_p50_s") or []) for r in timed)
    series = [Series("step time p50 (rank 0)", xs, [r["step_time_p50_s"] for r in timed]),
              Series("step time p99 (rank 0)", xs, [r.get("step_time_p99_s") for r in timed], dash="4 3")]  # fmt: skip
    for rank in range(ranks):
        own = [(r.get("rank_own_time_p50_s") or [None] * ranks)[rank] for r in timed]
        series.append(Series(f"rank {rank} own time p50", xs, own, dash="1 2"))
    parts = [chart_svg(Chart("step time per log window", "tokens", "seconds", series, y_zero=True, **SMALL))]
    stragglers = [r for r in run.events("alert") if r.get("alert") == "straggler"]
    parts.append(note(
        f"{len(stragglers)} straggler alert(s)" + (f", ranks {sorted({r.get('rank') for r in stragglers})}"
                                                    if stragglers else "")
        + ". A rank's own time is its time per step outside the step's synchronised section (data, update, "
        "host work); every rank waits for the slowest there, so wall step times agree across ranks."))  # fmt: skip
    checkpoint = (run.config or {}).get("checkpoint") or {}
    figures = run_goodput(run.metrics_path.parent, float(checkpoint.get("mtbf_hours") or 0.0),
                          int(checkpoint.get("every_steps") or 0))  # fmt: skip
    if figures is None:
        return "\n".join(parts)
    shares = [(name, figures[key]) for name, key in GOODPUT_PARTS]
    parts.append(table(["where the wall time went", "seconds", "share"],
                       [[name, f"{value:.2f}", f"{100 * value / max(figures['wall_s'], 1e-9):.1f}%"]
                        for name, value in shares]))  # fmt: skip
    parts.append(note(
        f"goodput {100 * (figures['goodput'] or 0):.1f}%: productive step time over {figures['wall_s']:.1f} s of "
        f"wall time; {figures['restarts']} restart(s), {figures['lost_steps']} step(s) redone after a resume, "
        f"{figures['checkpoints']} checkpoint(s)."))  # fmt: skip
    advice = figures.get("checkpoint_interval")
    if advice:
        parts.append(note(advice.get("hint") or (
            f"checkpoint.every_steps = {advice['every_steps']} is near the Young-Daly interval of "
            f"{advice['optimal_every_steps']} steps (save cost {advice['save_cost_s']:.3g} s, MTBF "
            f"{advice['mtbf_hours']:g} h).")))  # fmt: skip
    return "\n".join(parts)


def _model_mfu_series(train: list[dict[str, Any]], xs: list[float]) -> list[Series]:
    """MFU in the matmul model FLOPs convention beside PaLM's, when the run records it."""
    if not any(finite(r.get("mfu_model")) for r in train):
        return []
    mfu = [100 * r["mfu_model"] if finite(r.get("mfu_model")) else None for r in train]
    return [Series("MFU % (matmul model FLOPs)", xs, mfu)]


def events_section(run: Run) -> str:
    events = run.events()
    if not events:
        return missing("metrics.jsonl holds no events.")
    end = max((run.cumulative(r.get("tokens")) for r in run.records), default=0.0)
    lanes: dict[str, list[tuple[float, str]]] = {}
    for r in events:
        kind = str(r.get("event"))
        if kind in ("start", "data_plan", "end", "mixture"):
            continue
        lanes.setdefault(kind, []).append(
            (run.cumulative(r.get("tokens")), f"step {r.get('step')}: {describe_event(r)}")
        )
    parts = []
    if lanes:
        parts.append(timeline_svg("events against tokens (hover for details)", lanes, end))
    counts = {}
    for r in events:
        counts[r.get("event")] = counts.get(r.get("event"), 0) + 1
    parts.append(
        note("events: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: str(kv[0]))))
    )
    shown = [r for r in events if r.get("event") not in ("mixture",)]
    rows = [[r.get("step"), r.get("tokens"), r.get("event"), describe_event(r)] for r in shown[:400]]
    parts.append(table(["step", "tokens", "event", "details"], rows))
    if len(shown) > 400:
        parts.append(note(f"{len(shown) - 400} more events in {run.metrics_path}."))
    return "\n".join(parts)
