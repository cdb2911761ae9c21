"""Read a run directory's artifacts for the reports: metrics.jsonl, the manifests, eval results, galleries.

Training figures come from metrics.jsonl alone (design.md section 1). The data, tokenizer and
evaluation sections read the artifacts those stages write (stats.json, manifests, eval/*.json). Every
input but metrics.jsonl is optional: a missing one leaves its section saying so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt import layout
from smelt.errors import UserError
from smelt.metric_records import METRICS, finite, task_entries, task_scores

STAGE_DIRS = tuple(layout.STAGE_DIRS.values())  # directory names, in pipeline order
_STEP_FILE = re.compile(r"step_(\d+)\.json$")


@dataclass
class Run:
    path: Path
    metrics_path: Path
    records: list[dict[str, Any]]
    config: dict[str, Any] | None = None
    manifests: dict[str, dict[str, Any]] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # eval/step_*.json, by step
    galleries: list[tuple[str, Any]] = field(default_factory=list)  # (file name, content)
    summary: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)  # what was skipped while reading, shown in the report
    parent: dict[str, Any] | None = None  # a fork's parent checkpoint (run_dir, step, cumulative_tokens, ...)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def tokens_offset(self) -> float:
        """Where a fork's curves start: its parent's cumulative tokens at the fork (0 for a run from scratch)."""
        value = (self.parent or {}).get("cumulative_tokens")
        return float(value) if finite(value) else 0.0

    def cumulative(self, tokens: Any) -> float:
        """A token count of this run on the lineage's axis: the parent's cumulative tokens + its own."""
        return self.tokens_offset + (float(tokens) if finite(tokens) else 0.0)

    def kind(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("kind") == kind]

    def events(self, *names: str) -> list[dict[str, Any]]:
        return [
            r for r in self.records if r.get("kind") == "event" and (not names or r.get("event") in names)
        ]

    def start(self) -> dict[str, Any]:
        """The last start or resume event (a resumed run restates the plan and model figures)."""
        starts = self.events("start", "resume")
        return starts[-1] if starts else {}

    def flops_per_token(self) -> float | None:
        value = self.start().get("flops_per_token")
        return float(value) if isinstance(value, (int, float)) else None

    def json_file(self, *parts: str) -> dict[str, Any] | None:
        return _read_json(self.path.joinpath(*parts), self.notes)


def _read_json(path: Path, notes: list[str]) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        notes.append(f"{path}: unreadable ({exc}); its section is left out")
        return None


def parent_record(run_dir: Path, records: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """A fork's parent as its trainer recorded it: the first start event of metrics.jsonl (when `records`
    are given), else train/run.json or train/manifest.json. None for a run trained from scratch."""
    starts = [r for r in records or [] if r.get("kind") == "event" and r.get("event") in ("start", "resume")]
    starts.sort(key=lambda r: r.get("event") != "start")  # the start loaded the parent; resumes restate it
    for record in starts:
        if isinstance(record.get("parent"), dict):
            return record["parent"]
    for path in (run_dir / "train" / "run.json", run_dir / "run.json", run_dir / "train" / "manifest.json"):
        content = _read_json(path, [])
        if isinstance(content, dict) and isinstance(content.get("parent"), dict):
            return content["parent"]
    return None


def find_metrics(run_dir: Path) -> Path:
    """RUN/train/metrics.jsonl of a pipeline run, or RUN/metrics.jsonl of a bare trainer output."""
    for candidate in (run_dir / "train" / METRICS, run_dir / METRICS):
        if candidate.is_file():
            return candidate
    raise UserError(
        f"{run_dir} has no metrics.jsonl (looked for {run_dir / 'train' / METRICS} and "
        f"{run_dir / METRICS}). Train the run first (`smelt run CONFIG` or `smelt train CONFIG`), "
        f"or pass the run directory that holds train/metrics.jsonl, e.g. runs/quickstart."
    )


def read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    """The records of metrics.jsonl. A torn last line (a crash while writing) is skipped with a note;
    a malformed line before it means the file was edited or corrupted, which is an error."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    records = []  # not smelt.jsonl: a torn last line is a note, and the messages name metrics.jsonl's format
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                notes.append(f"{path}:{number}: torn last line skipped (the run stopped while writing it)")
                continue
            raise UserError(
                f"{path}:{number} is not a JSON object ({exc.msg}). metrics.jsonl holds one JSON object per "
                f"line as the trainer writes it; restore the file or delete the broken line."
            ) from exc
        if not isinstance(record, dict) or "kind" not in record:
            raise UserError(
                f"{path}:{number} is not a metrics record (a JSON object with a 'kind'). Restore the file "
                f"or delete the line."
            )
        records.append(record)
    return records


def load_run(run_dir: str | Path) -> Run:
    """Everything the reports read from one run directory; UserError when it is not a trained run."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(
            f"run directory {path} does not exist. Pass a directory written by `smelt run` or "
            f"`smelt quickstart`, e.g. runs/quickstart."
        )
    metrics_path = find_metrics(path)
    notes: list[str] = []
    run = Run(path=path, metrics_path=metrics_path, records=read_metrics(metrics_path, notes), notes=notes)
    run.config = run.json_file("config.json")
    run.summary = run.json_file("summary.json")
    run.parent = parent_record(path, run.records)
    for stage in STAGE_DIRS:
        manifest = run.json_file(stage, "manifest.json")
        if manifest is not None:
            run.manifests[stage] = manifest
    eval_dir = path / "eval"
    if eval_dir.is_dir():
        for file in sorted(eval_dir.glob("step_*.json")):
            match = _STEP_FILE.search(file.name)
            content = _read_json(file, notes)
            if match and isinstance(content, dict):
                content.setdefault("step", int(match.group(1)))
                content["_file"] = file.name
                run.evals.append(content)
        run.evals.sort(key=lambda e: int(e.get("step") or 0))
        for file in sorted(eval_dir.glob("gallery*.json")):
            content = _read_json(file, notes)
            if content is not None:
                run.galleries.append((file.name, content))
    return run


def task_references(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per task, its chance level and the standard error of its score, where the harness gives them."""
    out: dict[str, dict[str, float]] = {}
    for name, value in task_entries(result):
        if isinstance(value, dict):
            refs = {k: float(value[k]) for k in ("chance", "stderr") if finite(value.get(k))}
            if refs:
                out[name] = refs
    return out


def throughput(run: Run) -> dict[str, float]:
    """Training tokens/s and MFU as the trainer's summary (the terminal, summary.json) computes them:
    the tokens trained over the time spent in training steps (evaluations and saves excluded), in the
    last launch of the run (the train records after its last start or resume event). Each train record
    holds its log window's tokens/s, and its window's tokens are its count minus the previous record's
    (or the launch's start), so the window took tokens / (tokens/s) seconds."""
    launches: list[tuple[dict[str, Any], list[dict[str, Any]]]] = [({}, [])]
    for record in run.records:
        if record.get("kind") == "event" and record.get("event") in ("start", "resume"):
            launches.append((record, []))
        elif record.get("kind") == "train":
            launches[-1][1].append(record)
    start, records = next(((s, r) for s, r in reversed(launches) if r), ({}, []))
    previous = float(start.get("tokens") or 0)
    tokens = seconds = 0.0
    per_token_flops = None  # MFU / (tokens/s), the same for every window of a launch
    for record in records:
        if not finite(record.get("tokens")):
            continue
        done, previous = float(record["tokens"]) - previous, float(record["tokens"])
        speed = record.get("tokens_per_s")
        if done > 0 and finite(speed) and speed > 0:
            tokens += done
            seconds += done / speed
            if finite(record.get("mfu")):
                per_token_flops = record["mfu"] / speed
    if not seconds:
        return {}
    out = {"tokens_per_s": tokens / seconds}
    flops, peak = start.get("flops_per_token"), start.get("peak_flops")
    if finite(flops) and finite(peak) and peak > 0:
        out["mfu"] = flops * out["tokens_per_s"] / peak
    elif per_token_flops is not None:
        out["mfu"] = per_token_flops * out["tokens_per_s"]
    return out


def final_metrics(run: Run) -> dict[str, float]:
    """The run's end figures by name (the comparison table and `smelt decide` read these)."""
    out: dict[str, float] = {}
    train = [r for r in run.kind("train") if finite(r.get("loss"))]
    if train:
        last = train[-1]
        out["final_train_loss"] = float(last["loss"])
        out["tokens"] = float(last.get("tokens") or 0)
        out.update(throughput(run))
    evals = [r for r in run.kind("eval") if finite(r.get("val_loss"))]
    if evals:
        out["final_val_loss"] = float(evals[-1]["val_loss"])
        for source, value in (evals[-1].get("val_loss_by_source") or {}).items():
            if finite(value):
                out[f"val_loss/{source}"] = float(value)
    fpt = run.flops_per_token()
    if fpt and "tokens" in out:
        out["flops"] = fpt * out["tokens"]
    end = run.events("end")
    if end and finite(end[-1].get("wall_time_s")):
        out["train_wall_time_s"] = float(end[-1]["wall_time_s"])
    if run.evals:
        last_eval = run.evals[-1]
        overall = (last_eval.get("heldout") or {}).get("overall") or {}
        for key in ("bits_per_byte", "loss"):
            if finite(overall.get(key)):
                out[f"heldout_{key}"] = float(overall[key])
        for name, value in task_scores(last_eval).items():
            out[f"task/{name}"] = value
    return out
