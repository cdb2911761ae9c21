"""Reading the records of metrics.jsonl and eval results: which values are figures, which fields are task
scores, and one line for an event. The trainer's live sinks and the reports read records the same way."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from smelt.jsonl import json_object

# A training run's records, RUN/train/metrics.jsonl (the trainer writes it: train/monitors.py).
METRICS = "metrics.jsonl"
_EVENT_BOOKKEEPING = {"kind", "step", "tokens", "event"}


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# Task fields that describe the evaluation rather than score it (counts, settings, references).
NOT_SCORES = {"n", "items", "examples", "count", "step", "tokens", "shots", "skipped", "stderr", "chance"}


def task_entries(result: dict[str, Any]) -> list[tuple[str, Any]]:
    """(task name, its figures) from {"tasks": {name: {...} | value}} or {"tasks": [{"task"|"name": ...}]}."""
    tasks = result.get("tasks")
    if isinstance(tasks, dict):
        return [(str(k), v) for k, v in tasks.items()]
    if isinstance(tasks, list):
        return [
            (str(t.get("task") or t.get("name") or i), t) for i, t in enumerate(tasks) if isinstance(t, dict)
        ]
    return []


def task_scores(result: dict[str, Any]) -> dict[str, float]:
    """Per-task scores of one eval result (eval/step_*.json) or eval record, as {"task/metric": value}.

    Reads the harness's layout ({"tasks": {name: {"acc": ..., "score": ..., "metric": "acc", ...}}}),
    a bare {"tasks": {name: value}}, and in-loop records that log flat "task/metric" keys. "score"
    is left out when it repeats the metric the task names.
    """
    scores: dict[str, float] = {}
    for name, value in task_entries(result):
        if finite(value):
            scores[name] = float(value)
        elif isinstance(value, dict):
            repeats = isinstance(value.get("metric"), str) and value["metric"] in value
            for metric, figure in value.items():
                if finite(figure) and metric not in NOT_SCORES and not (metric == "score" and repeats):
                    scores[f"{name}/{metric}"] = float(figure)
    if result.get("kind") == "eval":
        for key, value in result.items():
            if "/" in key and finite(value):
                scores.setdefault(key, float(value))
    return scores


def describe_event(record: dict[str, Any]) -> str:
    """One line for an event: its message when it has one, else its fields."""
    event = record.get("event", "?")
    if record.get("message"):
        return f"{event}: {record['message']}"
    if event == "stage":
        weights = ", ".join(f"{k} {v:.3g}" for k, v in (record.get("weights") or {}).items())
        return f"stage {record.get('stage')!r} from step {record.get('first_step')} ({weights})"
    if event == "rollback":
        return f"rollback to step {record.get('to_step')}; steps {record.get('skipped_steps')} skipped"
    if event == "mixture":
        return f"mixture window from step {record.get('first_step')}: max drift {record.get('max_drift')}"
    if event == "data_plan":
        return f"data plan: {record.get('steps')} steps, sources {', '.join(record.get('sources', {}))}"
    fields = []
    for key, value in record.items():
        if key in _EVENT_BOOKKEEPING or isinstance(value, (dict, list)):
            continue
        fields.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    return f"{event}: " + ", ".join(fields[:8])


def validations(path: Path) -> list[tuple[int, float, float]]:
    """(step, tokens, validation loss) of each validation a metrics.jsonl holds (in-loop task scores
    left out), in file order; a line cut by a crash is skipped, a missing file has none."""
    out = []
    for r in read_records(path):
        if r.get("kind") == "eval" and not r.get("inloop"):
            step, tokens, loss = r.get("step"), r.get("tokens"), r.get("val_loss")
            if finite(step) and finite(tokens) and finite(loss):
                out.append((int(step), float(tokens), float(loss)))
    return out


def read_records(path: Path, tail_bytes: int | None = None) -> list[dict[str, Any]]:
    """The JSON objects of a .jsonl file such as metrics.jsonl (a line cut by a crash is left out); []
    if there is none. The one reader of metrics.jsonl for the trainer, post-training, drills and tools.
    `tail_bytes`: only the file's last that many bytes (a first line the seek cut is left out too)."""
    if not path.is_file():
        return []
    if tail_bytes is None:  # a line a crash cut inside a character is left out like any cut line
        lines: list[str] | list[bytes] = path.read_text(encoding="utf-8", errors="replace").splitlines()
    else:
        with open(path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - tail_bytes))
            lines = handle.read().splitlines()
    return [record for line in lines if (record := json_object(line)) is not None]
