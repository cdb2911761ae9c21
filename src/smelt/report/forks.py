"""A fork against its parent, for the reports: held-out figures at equal cumulative tokens (the
comparison of a parent with its forks), and, for continual pretraining on sources the lineage never
trained on, forgetting (old-domain validation loss) next to adaptation (new-domain loss) from the
parent's values at the fork point.

Validation losses come from the eval records of metrics.jsonl (`val_loss`, `val_loss_by_source`);
held-out bits per byte from eval/step_*.json (`smelt eval`). Points are placed at cumulative tokens:
a fork's own tokens plus its parent's cumulative tokens at the fork.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import finite
from smelt.report.eval_sections import tokens_of
from smelt.report.page import missing, note, table
from smelt.report.run import Run, load_run, parent_record
from smelt.report.svg import COLORS, Chart, Marker, Series, chart_svg

MAX_DEPTH = 64
OVERALL = "overall"


def read_json(path: Path) -> Any:
    """A JSON file's content, or None when it is missing or unreadable (its figures are then left out)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


@dataclass(frozen=True)
class Point:
    """One evaluation of a run: its step, cumulative tokens, figures ("overall" and per source), and
    per figure what says which text it scored (two runs' figures compare only where that is equal)."""

    step: int
    tokens: float
    values: dict[str, float]
    scored: dict[str, Any] = field(default_factory=dict)

    def comparable(self, other: Point, key: str) -> bool:
        return key in self.values and key in other.values and self.scored.get(key) == other.scored.get(key)


def val_points(run: Run, single_source: str | None = None) -> list[Point]:
    """Validation losses of the eval records. A run validating one source logs no per-source loss;
    `single_source` names it so that its overall loss counts as that source's."""
    out = []
    for record in run.kind("eval"):
        if not finite(record.get("val_loss")):
            continue
        values = {OVERALL: float(record["val_loss"])}
        by_source = record.get("val_loss_by_source") or {}
        values.update({s: float(v) for s, v in by_source.items() if finite(v)})
        if single_source and not by_source:
            values[single_source] = values[OVERALL]
        # train.eval_tokens is split evenly across the sources: the windows scored per source depend on
        # how many there are, and on the tokens scored in all.
        sources = sorted(k for k in values if k != OVERALL)
        scored = dict.fromkeys(values, (len(sources), record.get("val_tokens")))
        scored[OVERALL] = (sources, record.get("val_tokens"))
        out.append(Point(int(record.get("step") or 0), run.cumulative(record.get("tokens")), values, scored))
    return out


def heldout_points(run: Run) -> list[Point]:
    """Held-out bits per byte of each eval/step_*.json, overall and per source."""
    out = []
    for result in run.evals:
        heldout = result.get("heldout") or {}
        values, scored = {}, {}
        for key, figures in [(OVERALL, heldout.get("overall")), *(heldout.get("per_source") or {}).items()]:
            if isinstance(figures, dict) and finite(figures.get("bits_per_byte")):
                values[key] = float(figures["bits_per_byte"])
                scored[key] = (figures.get("documents"), figures.get("bytes"))  # the same text, or not
        if values:
            tokens = run.cumulative(tokens_of(run, result))
            out.append(Point(int(result.get("step") or 0), tokens, values, scored))
    return out


def at_tokens(points: list[Point], tokens: float) -> tuple[Point, str] | None:
    """The point at `tokens` cumulative tokens, else the nearest one, with words saying which."""
    if not points:
        return None
    best = min(points, key=lambda p: (abs(p.tokens - tokens), p.tokens))
    gap = best.tokens - tokens
    if abs(gap) < 0.5:
        return best, f"equal tokens (step {best.step})"
    return best, f"nearest: step {best.step}, {gap:+,.0f} tokens"


def compared_ancestor(run: Run, index: dict[Path, int]) -> int | None:
    """The index of the nearest parent (or parent's parent, ...) of `run` among the compared runs."""
    record, seen = run.parent, set()
    while record and record.get("run_dir") and len(seen) < MAX_DEPTH:
        path = Path(str(record["run_dir"])).resolve()
        if path in index and path != run.path.resolve():
            return index[path]
        if path in seen:
            return None
        seen.add(path)
        record = parent_record(path) if path.is_dir() else None
    return None


def equal_tokens_section(runs: list[Run], names: list[str]) -> str | None:
    """Each compared fork against its compared parent at the fork's final cumulative tokens; None when
    no compared run descends from another."""
    index = {r.path.resolve(): i for i, r in enumerate(runs)}
    pairs = [(i, j) for i, r in enumerate(runs) if (j := compared_ancestor(r, index)) is not None]
    if not pairs:
        return None
    rows, differ = [], False
    for i, j in pairs:
        fork, parent = runs[i], runs[j]
        for figure, points_of in (
            ("held-out bits/byte", heldout_points),
            ("validation loss", lambda r: val_points(r, _single(r))),
        ):
            own, theirs = points_of(fork), points_of(parent)
            if not own:
                continue
            final = own[-1]
            match = at_tokens(theirs, final.tokens)
            start = at_tokens(theirs, fork.tokens_offset)
            for key in [OVERALL, *sorted(k for k in final.values if k != OVERALL)]:
                ours = final.values.get(key)
                theirs_now = match[0].values.get(key) if match else None
                theirs_then = start[0].values.get(key) if start else None
                label = figure if key == OVERALL else f"{figure}: {key}"
                comparable = match is not None and final.comparable(match[0], key)
                if ours is not None and theirs_now is not None and not comparable:
                    label, differ = f"{label} (other text)", True
                rows.append([
                    names[i], names[j], label, int(final.tokens), ours, theirs_now,
                    match[1] if match else "no evaluation", ours - theirs_now if comparable else None,
                    f"{theirs_then:.5g} ({start[1]})" if start and theirs_then is not None else "-",
                ])  # fmt: skip
    if not rows:
        return missing("neither the forks nor their parents have evaluations to set side by side yet.")
    header = ["fork", "parent", "figure", "cumulative tokens", "fork (last evaluation)",
              "parent at those tokens", "parent's point", "fork - parent", "parent at the fork point"]  # fmt: skip
    text = table(header, rows) + note(
        "Each fork's figure is from its last evaluation, at the cumulative tokens shown (its parent's at the "
        "fork plus its own). The parent's is from its evaluation at the same cumulative tokens when it has "
        "one (equal tokens), else from its nearest evaluation, with the gap in tokens (positive: the parent "
        "had trained more). Lower is better for both figures. Held-out bits/byte come from eval/step_*.json "
        "(`smelt eval RUN --checkpoint all`), validation losses from the eval records of metrics.jsonl."
    )
    if differ:
        text += note(
            "(other text): the two figures score different text, so no difference is given: an overall "
            "figure over other sources, held-out documents or bytes that differ (eval.max_bytes is split "
            "across a run's sources), or validation windows that differ (train.eval_tokens is split evenly "
            "across a run's sources)."
        )
    return text


def trained_sources(run: Run, before_step: int | None = None) -> set[str] | None:
    """Sources with a positive mixture weight in a stage that began before `before_step` (all stages
    when None), else those the data plan consumed; None when the run recorded neither."""
    stages = [r for r in run.events("stage") if before_step is None or int(r.get("step") or 0) < before_step]
    if stages:
        return {s for r in stages for s, w in (r.get("weights") or {}).items() if finite(w) and w > 0}
    plans = run.events("data_plan")
    if plans:
        sources = plans[-1].get("sources") or {}
        return {s for s, f in sources.items() if isinstance(f, dict) and (f.get("consumed") or 0) > 0}
    return None


def _lineage_sources(parent: Run, fork_step: int) -> set[str] | None:
    """What the lineage trained on before a fork: the parent up to the fork step, its parent up to
    the parent's fork step, and so on."""
    sources: set[str] = set()
    run, step, seen = parent, fork_step, set()
    while run is not None and run.path.resolve() not in seen and len(seen) < MAX_DEPTH:
        seen.add(run.path.resolve())
        found = trained_sources(run, step)
        if found is None:
            return None
        sources |= found
        if not run.parent or not run.parent.get("run_dir"):
            break
        step = int(run.parent.get("step") or 0)
        try:
            run = load_run(str(run.parent["run_dir"]))
        except UserError:
            return None
    return sources


def _single(run: Run) -> str | None:
    sources = trained_sources(run)
    return next(iter(sources)) if sources and len(sources) == 1 else None


def _start_point(points: list[Point], parent: Run, fork_step: int) -> tuple[Point | None, str]:
    """The validation losses at the fork point: the fork's own evaluation at step 0 (one of `points`:
    the parent's weights on this run's validation data) when it made one, else the parent's at the
    fork step (or its last evaluation before it)."""
    own = next((p for p in points if p.step == 0), None)
    if own is not None:
        return own, "this run's validation at step 0 (the parent's weights)"
    before = [p for p in val_points(parent, _single(parent)) if p.step <= fork_step]
    if not before:
        return None, f"no validation of {parent.name} at or before step {fork_step}"
    point = before[-1]
    where = "the fork point" if point.step == fork_step else f"its last before the fork at step {fork_step}"
    return point, f"{parent.name}'s validation at step {point.step} ({where})"


def forgetting_section(run: Run) -> str:
    """Old-domain validation loss (forgetting) next to new-domain loss (adaptation) over cumulative
    tokens, from the values at the fork point; a note when the fork has no new source."""
    record = run.parent or {}
    fork_step = int(record.get("step") or 0)
    try:
        parent = load_run(str(record.get("run_dir")))
    except UserError as exc:
        return missing(f"the parent run cannot be read, so old and new domains are unknown: {exc}")
    own, old = trained_sources(run), _lineage_sources(parent, fork_step)
    if own is None or old is None:
        return missing("a data_plan or stage event is missing from metrics.jsonl, so the sources trained on "
                       "are unknown.")  # fmt: skip
    new = own - old
    if not new:
        return note(
            f"This fork trains only on sources its lineage trained on before the fork "
            f"({', '.join(sorted(own)) or 'none'}): there is no new domain, so there is no forgetting or "
            f"adaptation to set apart. That view is for continual pretraining on new sources."
        )
    points = val_points(run, _single(run))
    scored = set().union(*(p.values for p in points)) - {OVERALL} if points else set()
    domains = [(s, "old") for s in sorted(old & scored)] + [(s, "new") for s in sorted(new & scored)]
    said = [
        note(
            f"New domain (sources this run trains on that its lineage did not before the fork): "
            f"{', '.join(sorted(new))}. Old domain (sources the lineage trained on): {', '.join(sorted(old))}."
        )
    ]
    if not points:
        return "\n".join([*said, missing("no validation losses in this run's metrics.jsonl yet.")])
    if not old & scored:
        said.append(
            missing(
                "this run's validation data holds no old-domain source, so forgetting is not measured here: "
                "keep the old sources in its data (replay, a small share of tokens.mixture) to measure it."
            )
        )
    start, start_text = _start_point(points, parent, fork_step)
    series, rows, other_windows = [], [], []
    for k, (source, domain) in enumerate(domains):
        later = [p for p in points if source in p.values and p is not start]
        last = later[-1] if later else None
        origin = start.values.get(source) if start is not None else None
        same = start is not None and last is not None and start.comparable(last, source)
        if origin is not None and not same:
            other_windows.append(source)
        xs, ys = [p.tokens for p in later], [p.values[source] for p in later]
        if same and start is not None and origin is not None:
            xs, ys = [start.tokens, *xs], [origin, *ys]
        label = (
            f"old domain (forgetting): {source}" if domain == "old" else f"new domain (adaptation): {source}"
        )
        series.append(Series(label, xs, ys, COLORS[k % len(COLORS)], dash="" if domain == "old" else "4 3",
                             dots=len(xs) < 40))  # fmt: skip
        change = last.values[source] - origin if same and last is not None and origin is not None else None
        rows.append([source, domain, origin, last.values[source] if last else None,
                     f"step {last.step}" if last else "-", change])  # fmt: skip
    marker = Marker(run.tokens_offset, "fork", f"forked from {parent.name} at step {fork_step}")
    chart = Chart("validation loss per domain at cumulative tokens", "cumulative tokens", "loss", series,
                  markers=[marker], x_zero=False)  # fmt: skip
    parts = [*said, chart_svg(chart)]
    parts.append(table(["source", "domain", "at the fork point", "last", "last at", "change"], rows))
    parts.append(
        note(
            f"Values at the fork point: {start_text}. A rise on an old source is forgetting; a fall on a new "
            f"source is adaptation."
        )
    )
    if other_windows:
        parts.append(
            note(
                f"{parent.name}'s validation scored other windows of {', '.join(other_windows)} than this run's "
                f"(train.eval_tokens is split evenly across a run's sources), so its value is shown but not "
                f"drawn, and no change is given. A fork that validates at its step 0 scores the parent's "
                f"weights on its own windows."
            )
        )
    parts.append(_heldout_domains(run, parent, fork_step, dict(domains)))
    return "\n".join(parts)


def _heldout_domains(run: Run, parent: Run, fork_step: int, domains: dict[str, str]) -> str:
    """Held-out bits per byte per source: the parent's evaluation of the fork checkpoint, the fork's last."""
    own = heldout_points(run)
    if not own:
        return note("no eval/step_*.json in this run: `smelt eval RUN` adds held-out bits/byte per source.")
    theirs = heldout_points(parent)
    at_fork = next((p for p in theirs if p.step == fork_step), None)
    last = own[-1]
    rows, other_text = [], []
    for source in sorted(set(last.values) - {OVERALL}):
        before = at_fork.values.get(source) if at_fork else None
        after = last.values[source]
        same = at_fork is not None and at_fork.comparable(last, source)
        if before is not None and not same:
            other_text.append(source)
        rows.append([source, domains.get(source, "-"), before, after, after - before if same else None])
    text = table(["source", "domain", f"{parent.name} step {fork_step}", f"last (step {last.step})", "change"],
                 rows)  # fmt: skip
    if at_fork is None:
        text += note(
            f"{parent.name} has no held-out evaluation at step {fork_step}: `smelt eval {parent.path} "
            f"--checkpoint {fork_step}` adds one."
        )
    if other_text:
        text += note(
            f"For {', '.join(other_text)} the two evaluations scored different held-out text (other "
            f"documents or bytes: eval.max_bytes is split across a run's sources), so no change is given."
        )
    return "<h3>Held-out bits per byte per source</h3>" + text
