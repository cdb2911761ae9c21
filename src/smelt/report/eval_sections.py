"""Report sections about evaluations: held-out bits-per-byte, task curves per checkpoint, the gallery, and
the contamination meter (benchmarks against their controls, canary memorisation against exposure)."""

from __future__ import annotations

import json
import math
from typing import Any

from smelt.metric_records import finite, task_entries, task_scores
from smelt.report.page import Raw, esc, missing, note, row, table
from smelt.report.run import Run, task_references
from smelt.report.svg import Band, Chart, Series, chart_svg

GALLERY_CHARS = 600


def tokens_of(run: Run, result: dict[str, Any]) -> float:
    """The tokens a checkpoint had seen: recorded in the result, else step x batch tokens."""
    if finite(result.get("tokens_seen")):
        return float(result["tokens_seen"])
    if finite(result.get("tokens")):
        return float(result["tokens"])
    return float(result.get("step") or 0) * float(run.start().get("batch_tokens") or 0)


def task_curves(run: Run) -> dict[str, list[tuple[float, float]]]:
    """task/metric -> [(tokens, score)] from eval/step_*.json and from in-loop eval records (a fork's at
    cumulative tokens: its parent's + its own)."""
    curves: dict[str, dict[float, float]] = {}
    for result in run.evals:
        for name, value in task_scores(result).items():
            curves.setdefault(name, {})[run.cumulative(tokens_of(run, result))] = value
    for record in run.kind("eval"):
        for name, value in task_scores(record).items():
            curves.setdefault(name, {}).setdefault(run.cumulative(record.get("tokens")), value)
    return {name: sorted(points.items()) for name, points in sorted(curves.items())}


def _references(run: Run) -> dict[str, dict[str, list[tuple[float, ...]]]]:
    """Per task: its chance level and score ± standard error at each evaluated checkpoint."""
    out: dict[str, dict[str, list[tuple[float, ...]]]] = {}
    for result in run.evals:
        x = run.cumulative(tokens_of(run, result))
        scores = task_scores(result)
        tasks = dict(task_entries(result))
        for task, refs in task_references(result).items():
            entry = out.setdefault(task, {"chance": [], "band": []})
            if "chance" in refs:
                entry["chance"].append((x, refs["chance"]))
            metric = (tasks.get(task) or {}).get("metric")
            score = scores.get(f"{task}/{metric}", scores.get(f"{task}/score"))
            if "stderr" in refs and score is not None:
                entry["band"].append((x, score - refs["stderr"], score + refs["stderr"]))
    return out


def metric_kind(name: str) -> str:
    """ "perplexity" for perplexities (unbounded, lower is better: a log axis of their own), else "score"
    (accuracies and exact match, between 0 and 1): metrics of different kinds never share an axis."""
    metric = name.split("/", 1)[-1]
    return "perplexity" if "perplexity" in metric or metric == "ppl" else "score"


def _task_charts(task: str, names: list[str], curves: dict, ref: dict | None) -> list[str]:
    """One chart per kind of metric of a task: scores (with chance and the standard error band) on a
    linear axis, perplexities on a log axis."""
    charts = []
    for kind in ("score", "perplexity"):
        chosen = [n for n in names if metric_kind(n) == kind]
        if not chosen:
            continue
        series = [Series(name.split("/", 1)[-1] if "/" in name else name, [x for x, _ in curves[name]],
                         [y for _, y in curves[name]], dots=True) for name in chosen]  # fmt: skip
        bands = []
        if kind == "score" and ref and ref["chance"]:
            xs = [x for x, _ in ref["chance"]]
            series.append(Series("chance", xs, [y for _, y in ref["chance"]], "#999999", "2 3"))
        if kind == "score" and ref and ref["band"]:
            band = ref["band"]
            bands.append(
                Band("± 1 standard error", [b[0] for b in band], [b[1] for b in band], [b[2] for b in band])
            )
        if kind == "score":
            chart = Chart(f"task {task}", "tokens", "score", series, bands=bands, width=440, height=230)
        else:
            title = f"task {task}: perplexity (lower is better)"
            chart = Chart(title, "tokens", "perplexity", series, log_y=True, width=440, height=230)
        charts.append(chart_svg(chart))
    return charts


def _task_table(run: Run) -> str:
    """The latest checkpoint's tasks with their uncertainty, chance level and training-data overlap."""
    latest = next((e for e in reversed(run.evals) if task_entries(e)), None)
    if latest is None:
        return ""
    rows = []
    for name, value in task_entries(latest):
        if not isinstance(value, dict):
            continue
        metric = value.get("metric", "score")
        overlap = value.get("contamination") or {}
        matched = (
            f"{overlap.get('items_matched', '?')} of {overlap.get('items', '?')} items in "
            f"{overlap.get('documents', '?')} training documents ({overlap.get('action', '?')})"
            if overlap
            else "not measured"
        )
        rows.append([name, metric, value.get(metric, value.get("score")), value.get("stderr"), value.get("chance"),
                     value.get("items"), value.get("skipped"), value.get("shots"), matched])  # fmt: skip
    if not rows:
        return ""
    header = [
        "task",
        "metric",
        "score",
        "stderr",
        "chance",
        "items",
        "skipped",
        "shots",
        "overlap with training data",
    ]
    conventions = {v.get("convention") for _, v in task_entries(latest) if isinstance(v, dict)}
    conventions.add(latest.get("convention"))
    conventions.discard(None)
    said = (
        note(f"prompt convention: {', '.join(sorted(conventions))} (eval.convention; see docs/evaluation.md)")
        if conventions
        else ""
    )
    return f"<h3>Tasks at step {latest.get('step')}</h3>" + table(header, rows) + said


def evaluation_section(run: Run) -> str:
    parts = []
    heldout = [(e, (e.get("heldout") or {}).get("overall") or {}) for e in run.evals]
    heldout = [(e, o) for e, o in heldout if finite(o.get("bits_per_byte"))]
    if heldout:
        xs = [run.cumulative(tokens_of(run, e)) for e, _ in heldout]
        series = [Series("model", xs, [o["bits_per_byte"] for _, o in heldout], dots=True)]
        for key, name in (("gzip_bits_per_byte", "gzip -9"), ("xz_bits_per_byte", "xz -9e")):
            series.append(Series(name, xs, [o.get(key) for _, o in heldout], dash="4 3"))
        per_source = [((e.get("heldout") or {}).get("per_source") or {}) for e, _ in heldout]
        sources = sorted({s for p in per_source for s in p})
        if len(sources) > 1:  # an overall figure can improve while one domain regresses
            for source in sources:
                ys = [(p.get(source) or {}).get("bits_per_byte") for p in per_source]
                series.append(Series(f"model: {source}", xs, ys, dash="1 2", dots=True))
        parts.append(
            chart_svg(
                Chart(
                    "held-out bits per byte per checkpoint (lower is better)", "tokens", "bits/byte", series
                )
            )
        )
        last, _ = heldout[-1]
        rows = []
        for source, f in sorted(((last.get("heldout") or {}).get("per_source") or {}).items()):
            rows.append([source, f.get("documents"), f.get("bytes"), f.get("loss"), f.get("bits_per_byte"),
                         f.get("gzip_bits_per_byte"), f.get("xz_bits_per_byte")])  # fmt: skip
        header = ["source", "documents", "bytes", "loss", "bits/byte", "gzip bits/byte", "xz bits/byte"]
        parts.append(
            f"<h3>Held-out, step {last.get('step')} ({esc(last.get('_file', ''))})</h3>" + table(header, rows)
        )
    else:
        parts.append(
            missing(
                f"no held-out evaluation yet ({run.path / 'eval'} has no step_*.json); run `smelt eval RUN`."
            )
        )
    curves = task_curves(run)
    if curves:
        by_task: dict[str, list[str]] = {}
        for name in curves:
            by_task.setdefault(name.split("/")[0], []).append(name)
        charts = []
        references = _references(run)
        for task, names in by_task.items():
            charts += _task_charts(task, names, curves, references.get(task))
        parts.append(row(*charts))
        tasks_table = _task_table(run)
        if tasks_table:
            parts.append(tasks_table)
        else:  # in-loop scores only
            latest = {name: points[-1][1] for name, points in curves.items()}
            parts.append(table(["task/metric", "latest score"], sorted(latest.items())))
    else:
        parts.append(
            missing("no task evaluations yet (no task scores in eval/step_*.json or in metrics.jsonl).")
        )
    versions = sorted({str(e.get("task_set_version")) for e in run.evals if e.get("task_set_version")})
    if versions:
        parts.append(note(f"task set versions: {', '.join(versions)}"))
    return "\n".join(parts)


def _clip(text: Any) -> str:
    text = str(text)
    return text if len(text) <= GALLERY_CHARS else text[:GALLERY_CHARS] + " [...]"


def _step(value: Any) -> Any:
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _gallery_items(content: Any, how: str = "greedy") -> list[dict[str, Any]] | None:
    """Items {prompt, completion, step, how} from a gallery file's layouts, or None for an unknown one:
    {"prompts": [{"prompt", "completions": {step: text}}]} (the harness's gallery.json), a list of such
    prompts, a list of {prompt, completion, step?}, or {"samples"|"items"|"gallery": [...], "step"?}."""
    if isinstance(content, dict):
        for key in ("prompts", "samples", "items", "gallery", "entries"):
            if isinstance(content.get(key), list):
                items = _gallery_items(content[key], how) or []
                return [
                    {**i, "step": _step(i["step"] if i.get("step") is not None else content.get("step"))}
                    for i in items
                ]
        return None
    if isinstance(content, list) and all(isinstance(i, dict) and "prompt" in i for i in content):
        items = []
        for item in content:
            completions = item.get("completions")
            if isinstance(completions, dict):  # one prompt, a completion per checkpoint
                for step, text in completions.items():
                    items.append(
                        {"prompt": item["prompt"], "completion": text, "step": _step(step), "how": how}
                    )
            else:
                text = item.get("completion", item.get("output", item.get("text", "")))
                items.append(
                    {
                        "prompt": item["prompt"],
                        "completion": text,
                        "step": _step(item.get("step")),
                        "how": how,
                    }
                )
        return items
    return None


def gallery_section(run: Run) -> str:
    items: list[dict[str, Any]] = []
    for result in run.evals:
        for key, how in (("gallery", "greedy"), ("samples", "sampled")):
            for item in _gallery_items(result.get(key) or [], how) or []:
                items.append({**item, "step": result.get("step")})
    unknown = []
    for name, content in run.galleries:
        found = _gallery_items(content)
        if found is None:
            unknown.append((name, content))
        else:
            items += found
    if not items and not unknown:
        return missing("no gallery yet (no samples in eval/step_*.json and no eval/gallery*.json).")
    parts = []
    prompts: dict[str, list[dict[str, Any]]] = {}
    for item in items:
        prompts.setdefault(str(item["prompt"]), []).append(item)
    for prompt, entries in prompts.items():
        seen = set()
        rows = []
        for entry in sorted(entries, key=lambda e: (_sort_step(e.get("step")), e.get("how", ""))):
            key = (entry.get("step"), entry.get("how"), str(entry.get("completion")))
            if key in seen:  # gallery.json repeats the greedy completions of the step files
                continue
            seen.add(key)
            text = f"<pre>{esc(prompt)}<b>{esc(_clip(entry.get('completion')))}</b></pre>"
            rows.append([entry.get("step", "-"), entry.get("how", "-"), Raw(text)])
        header = ["step", "decoding", "prompt + completion (bold)"]
        parts.append(f"<h3>prompt <code>{esc(repr(prompt))}</code></h3>" + table(header, rows))
    for name, content in unknown:
        text = json.dumps(content, indent=1, ensure_ascii=False)[:4000]
        parts.append(
            f"<h3>{esc(name)}</h3>"
            + note("a layout this report does not know; shown as JSON")
            + f"<pre>{esc(text)}</pre>"
        )
    return "\n".join(parts)


def _sort_step(step: Any) -> int:
    return step if isinstance(step, int) else -1


def contamination_points(run: Run) -> list[dict[str, Any]]:
    """The contamination meter's figures per checkpoint, in token order: `smelt eval --contamination`'s
    files, and the in-loop records (eval.contamination_inloop) at steps those files do not cover."""
    from smelt.eval.contamination_run import read_results

    points = {int(r.get("step") or 0): {**r, "_tokens": tokens_of(run, r)} for r in read_results(run.path)}
    for record in run.kind("eval"):
        figures = record.get("contamination")
        if isinstance(figures, dict) and isinstance(figures.get("tasks"), dict):
            points.setdefault(int(record.get("step") or 0), {**figures, "_tokens": record.get("tokens")})
    return [points[s] for s in sorted(points)]


def contamination_section(run: Run) -> str:
    points = contamination_points(run)
    if not points:
        return missing(
            "no contamination figures: run `smelt eval RUN --contamination`, or train with "
            "eval.contamination_inloop = true (docs/evaluation.md, A contamination meter)."
        )
    last = points[-1]
    k = float(last.get("k") or 0)
    xs = [run.cumulative(p["_tokens"]) for p in points]
    tasks = sorted({t for p in points for t in p["tasks"]})
    series = [Series(t, xs, [(p["tasks"].get(t) or {}).get("t") for p in points], dots=True) for t in tasks]
    series.append(Series(f"flag below -k = -{k:g}", [xs[0], xs[-1]], [-k, -k], "#c44e52", "4 3"))
    parts = [
        chart_svg(Chart("paired t of each benchmark against its controls", "tokens", "t", series)),
        note(
            "Each item's bits per byte (question and gold answer) minus its controls' (the answer swapped for "
            "a distractor, or another item's answer); t = mean / (sd / sqrt(n)), a one-sided paired t-test. "
            "A benchmark below -k is flagged: the model finds its gold strings easier than chance explains."
        ),
    ]
    rows, classes = [], []
    for name, f in sorted(last["tasks"].items()):
        rows.append([name, f.get("items"), f.get("controls"), f.get("gold_bits_per_byte"),
                     f.get("control_bits_per_byte"), f.get("t"), f.get("p_value"), f.get("below_share"),
                     "FLAGGED" if f.get("flagged") else "clean"])  # fmt: skip
        classes.append("diff" if f.get("flagged") else "")
    header = [
        "benchmark",
        "items",
        "controls",
        "gold bits/byte",
        "control bits/byte",
        "t",
        "p",
        "below",
        "verdict",
    ]
    parts.append(f"<h3>Step {last.get('step')}</h3>" + table(header, rows, classes))
    with_canaries = [p for p in points if isinstance(p.get("canaries"), dict)]
    if with_canaries:
        parts.append(_canary_chart(with_canaries))
    return "\n".join(parts)


def _canary_chart(points: list[dict[str, Any]]) -> str:
    """Memorisation against exposure: per checkpoint (the last four), the unseen controls' mean minus the
    canaries' bits per byte at each number of copies planted, with the controls' spread around 0."""
    series, spread = [], []
    for p in points[-4:]:
        levels = p["canaries"]["levels"]
        xs = [math.log2(level["copies"]) for level in levels]
        series.append(
            Series(f"step {p.get('step')}", xs, [level["memorisation"] for level in levels], dots=True)
        )
        spread = [xs, p["canaries"]["controls"]["sd"]]
    bands = [Band("± 1 sd of unseen controls", spread[0], [-spread[1]] * len(spread[0]),
                  [spread[1]] * len(spread[0]), "#999999")] if spread else []  # fmt: skip
    chart = Chart("canary memorisation against exposure", "log2(copies planted)", "memorisation (bits/byte)",
                  series, bands=bands, x_format="plain", x_zero=True, y_zero=True)  # fmt: skip
    last = points[-1]["canaries"]
    rows = [[level["copies"], level["strings"], level["bits_per_byte"], level["memorisation"], level["z"]]
            for level in last["levels"]]  # fmt: skip
    c = last["controls"]
    rows.append(["unseen", c["strings"], c["bits_per_byte"], 0.0, None])
    header = ["copies", "strings", "bits/byte", "memorisation (bits/byte)", "z"]
    return "<h3>Canaries</h3>" + chart_svg(chart) + table(header, rows)
