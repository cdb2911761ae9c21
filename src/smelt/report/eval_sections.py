"""Report sections about evaluations: held-out bits-per-byte, task curves per checkpoint, the gallery."""

from __future__ import annotations

import json
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
