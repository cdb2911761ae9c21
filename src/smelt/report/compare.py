"""The comparison of several runs: curves against tokens and FLOPs (never steps: runs with different
batch sizes or models reach the same step at different points), the diff of the resolved configs, and
the final metrics with noise bands over runs that repeat a seed set.

A fork is drawn at cumulative tokens (its parent's at the fork plus its own) and cumulative FLOPs, so
a parent and its forks share one axis; when a compared run descends from another, the page adds the
family tree and a table of held-out figures at equal cumulative tokens.

Runs repeat a seed set when their resolved configs are equal except for run.seed (run.name and
run.dir, which only say where a run lives, are ignored too). Such a group's spread is the noise floor
that any other difference in the table has to clear.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import finite
from smelt.report.decisions import decisions_for
from smelt.report.eval_sections import task_curves, tokens_of
from smelt.report.forks import equal_tokens_section
from smelt.report.lineage import Family, flops_offset, tree_html
from smelt.report.page import missing, note, page, row, section, table
from smelt.report.run import Run, final_metrics, load_run
from smelt.report.svg import COLORS, Band, Chart, Series, chart_svg
from smelt.tables import flat

IGNORED_FOR_SEEDS = ("run.seed", "run.name", "run.dir")
MAX_TASK_CHARTS = 12
# The final metrics shown first, in this order; any other (per-source losses, tasks) follows.
HEADLINE = (
    "tokens",
    "cumulative_tokens",
    "flops",
    "final_train_loss",
    "final_val_loss",
    "heldout_bits_per_byte",
    "tokens_per_s",
    "mfu",
)


def labels(runs: list[Run]) -> list[str]:
    """Short unique names: the directory name, or parent/name where two runs share a name."""
    names = [r.name for r in runs]
    out = []
    for run in runs:
        out.append(run.name if names.count(run.name) == 1 else f"{run.path.parent.name}/{run.name}")
    if len(set(out)) != len(out):
        out = [str(r.path) for r in runs]
    return out


def _config(run: Run) -> dict[str, Any]:
    if run.config is not None:
        return flat(run.config, whole_lists=True)
    train = run.manifests.get("train") or {}
    return flat(train.get("config") or {}, whole_lists=True)


def seed_groups(runs: list[Run]) -> list[list[int]]:
    """Indices of runs whose configs are equal but for run.seed (name and dir); groups of two or more."""
    keys: dict[str, list[int]] = {}
    for i, run in enumerate(runs):
        config = {k: v for k, v in _config(run).items() if k not in IGNORED_FOR_SEEDS}
        if not config:
            continue  # no recorded config: nothing says these runs repeat anything
        keys.setdefault(json.dumps(config, sort_keys=True, default=str), []).append(i)
    return [members for members in keys.values() if len(members) > 1]


def config_diff(runs: list[Run], names: list[str]) -> str:
    configs = [_config(r) for r in runs]
    if not any(configs):
        return missing("none of the runs has a config.json; there is nothing to diff.")
    keys = sorted(set().union(*configs))
    absent = object()
    rows, same = [], 0
    for key in keys:
        values = [c.get(key, absent) for c in configs]
        shown = [json.dumps(v, default=str) if v is not absent else "(absent)" for v in values]
        if len(set(shown)) == 1:
            same += 1
            continue
        rows.append([key, *shown])
    if not rows:
        return note(f"the resolved configs are identical ({same} keys).")
    return table(["key", *names], rows) + note(f"{same} other keys are identical in every run.")


def _spread(values: list[float]) -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.5g} ± {std:.2g} ({min(values):.5g}–{max(values):.5g}, n={len(values)})"


def metrics_tables(runs: list[Run], names: list[str], groups: list[list[int]]) -> str:
    """One row per final metric: each run's value, then each seed group's mean ± std (min–max)."""
    figures = [final_metrics(r) for r in runs]
    if any(r.parent for r in runs):  # forks: where each run ends on the lineage's token axis
        for run, figure in zip(runs, figures, strict=True):
            if "tokens" in figure:
                figure["cumulative_tokens"] = run.cumulative(figure["tokens"])
    found = set().union(*figures)
    order = [m for m in HEADLINE if m in found] + sorted(found - set(HEADLINE))
    rows = []
    for metric in order:
        row: list = [metric, *[f.get(metric) for f in figures]]
        for members in groups:
            values = [figures[i][metric] for i in members if metric in figures[i]]
            row.append(_spread(values) if len(values) >= 2 else "-")
        rows.append(row)
    header = ["metric", *names, *[f"seed group {k + 1}: mean ± std (min–max)" for k in range(len(groups))]]
    parts = [table(header, rows)]
    if not groups:
        parts.append(
            note(
                "no runs here repeat a seed set (equal configs except run.seed), so no noise band is shown; "
                "rerun a config with other run.seed values to measure the noise floor."
            )
        )
    for k, members in enumerate(groups):
        seeds = [str((runs[i].config or {}).get("run", {}).get("seed", "?")) for i in members]
        members_text = ", ".join(f"{names[i]} (seed {s})" for i, s in zip(members, seeds, strict=True))
        parts.append(
            note(f"seed group {k + 1}: {members_text}; a difference smaller than its spread is noise.")
        )
    return "\n".join(parts)


def _curve(run: Run, key: str, kind: str) -> list[tuple[float, float]]:
    """(the run's own tokens, value) of its records of `kind` that hold `key`."""
    return [(float(r.get("tokens") or 0), float(r[key])) for r in run.kind(kind) if finite(r.get(key))]


Axis = Callable[[float], float]  # a run's own tokens -> its x on one axis


def _bands(runs: list[Run], groups: list[list[int]], key: str, kind: str, axis: list[Axis]) -> list[Band]:
    """Min–max over each seed group at the x values every member logged."""
    bands = []
    for k, members in enumerate(groups):
        curves = [dict(_curve(runs[i], key, kind)) for i in members]
        common = sorted(set.intersection(*(set(c) for c in curves)))
        if not common:
            continue
        xs = [axis[members[0]](x) for x in common]
        bands.append(
            Band(f"seed group {k + 1}: min–max", xs, [min(c[x] for c in curves) for x in common],
                 [max(c[x] for c in curves) for x in common], COLORS[members[0] % len(COLORS)])
        )  # fmt: skip
    return bands


def _axes(runs: list[Run]) -> tuple[list[tuple[str, list[Axis], str]], str]:
    """The x axes, (name, each run's own tokens -> x, tick style): tokens, and training FLOPs where every
    run's FLOPs per token is known. A fork sits at cumulative tokens and FLOPs (its lineage's before the
    fork plus its own). Also the reason an axis is left out, or ""."""
    tokens_name = "cumulative tokens" if any(r.parent for r in runs) else "tokens"
    axes: list[tuple[str, list[Axis], str]] = [
        (tokens_name, [lambda t, r=r: r.cumulative(t) for r in runs], "si")
    ]
    fpt = [r.flops_per_token() for r in runs]
    if not all(fpt):
        return axes, "FLOPs axes are left out: a run's start record has no flops_per_token."
    offsets = [flops_offset(r) for r in runs]
    if any(o is None for o in offsets):
        return axes, "FLOPs axes are left out: a fork's parent run or its flops_per_token cannot be read."
    flops = [lambda t, f=f, o=o: o + f * t for f, o in zip(fpt, offsets, strict=True)]
    return [*axes, ("training FLOPs", flops, "sci")], ""


def curves_section(runs: list[Run], names: list[str], groups: list[list[int]]) -> str:
    parts = []
    axes, left_out = _axes(runs)
    tokens_name = axes[0][0]
    for x_name, axis, fmt in axes:
        for key, kind, title in (("loss", "train", "train loss"), ("val_loss", "eval", "validation loss")):
            series = []
            for i, run in enumerate(runs):
                points = _curve(run, key, kind)
                series.append(Series(names[i], [axis[i](x) for x, _ in points], [y for _, y in points],
                                     COLORS[i % len(COLORS)], dots=kind == "eval" and len(points) < 40))  # fmt: skip
            bands = _bands(runs, groups, key, kind, axis)
            parts.append(
                chart_svg(
                    Chart(f"{title} against {x_name}", x_name, title, series, bands=bands, x_format=fmt)
                )
            )
    if left_out:
        parts.append(note(left_out))
    if any(r.parent for r in runs):
        parts.append(
            note(
                "A fork is drawn at cumulative tokens: its parent's tokens at the fork (the parent's own "
                "offset included) plus its own; its FLOPs likewise, with each run's FLOPs per token."
            )
        )
    heldout = []
    for i, run in enumerate(runs):
        points = [
            (
                run.cumulative(tokens_of(run, e)),
                ((e.get("heldout") or {}).get("overall") or {}).get("bits_per_byte"),
            )
            for e in run.evals
        ]
        heldout.append(
            Series(
                names[i], [x for x, _ in points], [y for _, y in points], COLORS[i % len(COLORS)], dots=True
            )
        )
    if any(s.xs for s in heldout):
        parts.append(
            chart_svg(
                Chart(f"held-out bits per byte against {tokens_name}", tokens_name, "bits/byte", heldout)
            )
        )
    per_run = [task_curves(r) for r in runs]
    tasks = sorted(set().union(*per_run))
    charts = []
    for name in tasks[:MAX_TASK_CHARTS]:
        series = [
            Series(
                names[i],
                [x for x, _ in c.get(name, [])],
                [y for _, y in c.get(name, [])],
                COLORS[i % len(COLORS)],
                dots=True,
            )
            for i, c in enumerate(per_run)
        ]
        charts.append(
            chart_svg(
                Chart(
                    f"task {name} against {tokens_name}", tokens_name, "score", series, width=440, height=230
                )
            )
        )
    parts.append(row(*charts))
    if len(tasks) > MAX_TASK_CHARTS:
        parts.append(
            note(f"{len(tasks) - MAX_TASK_CHARTS} more task metrics are in the final-metrics table.")
        )
    if not tasks:
        parts.append(missing("no task evaluations yet in any of these runs."))
    return "\n".join(parts)


def _forked_from(run: Run) -> str:
    if not run.parent:
        return "-"
    return f"{Path(str(run.parent.get('run_dir'))).name} step {run.parent.get('step')}"


def build_comparison(runs: list[Run], decisions_log: Path | None = None, base: Path | None = None) -> str:
    """The comparison page; `base` is the folder it is written to (the lineage links are relative to it)."""
    names = labels(runs)
    groups = seed_groups(runs)
    listing = table(
        ["run", "path", "config hash", "forked from"],
        [
            [n, str(r.path), r.start().get("config_hash", "-"), _forked_from(r)]
            for n, r in zip(names, runs, strict=True)
        ],
    )
    decisions = {}
    for run in runs:
        for record in decisions_for(run, decisions_log):
            decisions[json.dumps(record, sort_keys=True)] = record
    if decisions:
        rows = [
            [r.get("date"), r.get("question"), r.get("metric"), r.get("best") or "-", r.get("outcome") or "-"]
            for r in decisions.values()
        ]
        decision_text = table(["date", "question", "metric", "best", "outcome"], rows)
    else:
        decision_text = missing("no recorded decision names these runs.")
    sections = [
        section("runs", "Runs", listing),
        section("final", "Final metrics and noise bands", metrics_tables(runs, names, groups)),
        section("curves", "Curves against tokens and FLOPs", curves_section(runs, names, groups)),
    ]
    family = Family(runs)
    if family.related:
        sections.append(section("lineage", "Lineage", tree_html(runs, base or Path.cwd(), family)))
    at_equal_tokens = equal_tokens_section(runs, names)
    if at_equal_tokens is not None:
        sections.append(section("forks", "Forks against their parents at equal tokens", at_equal_tokens))
    sections += [
        section("config", "Config diff", config_diff(runs, names)),
        section("decisions", "Decisions", decision_text),
    ]
    made = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return page(f"smelt comparison: {', '.join(names)}", f"{len(runs)} runs - made {made}", sections)


def default_output(run_dirs: list[Path]) -> Path:
    digest = hashlib.sha256("\n".join(sorted(str(p.resolve()) for p in run_dirs)).encode()).hexdigest()[:10]
    return run_dirs[0].resolve().parent / f"compare-{digest}.html"


def write_comparison(
    run_dirs: list[str | Path], out: str | Path | None = None, decisions_log: str | Path | None = None
) -> Path:
    """Compare two or more runs in one HTML page (default: compare-<hash>.html next to the first run)."""
    paths = [Path(p) for p in run_dirs]
    if len(paths) < 2:
        raise UserError("a comparison needs two or more run directories; for one run, `smelt report RUN`.")
    if len({p.resolve() for p in paths}) != len(paths):
        raise UserError(f"the same run is named twice in {', '.join(map(str, paths))}; name each run once.")
    runs = [load_run(p) for p in paths]
    path = Path(out) if out else default_output(paths)
    path.parent.mkdir(parents=True, exist_ok=True)
    log = Path(decisions_log) if decisions_log else None
    path.write_text(build_comparison(runs, log, path.parent), encoding="utf-8")
    return path
