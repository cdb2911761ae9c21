"""The decision log: what question a set of runs answered, on which metric, with what outcome.

`smelt decide "TITLE" --runs A B --metric M` appends one JSON line to the project's log (by default
`decisions.jsonl` in the directory that holds the runs, e.g. runs/decisions.jsonl). Each record keeps the
metric's value for every run at the time of the decision, so the log stays meaningful after runs are
deleted, and the report of every run involved shows the decisions it took part in.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.report.run import Run, final_metrics, load_run

LOG_NAME = "decisions.jsonl"
# Metrics where lower is better; every other known metric is higher-is-better. Unknown: no "best".
_LOWER = ("loss", "bits_per_byte", "bpb", "perplexity", "wall_time")
_HIGHER = ("acc", "accuracy", "exact_match", "f1", "mfu", "tokens_per_s", "score")


def default_log(run_dirs: list[Path]) -> Path:
    """decisions.jsonl in the runs' common parent directory (the project's runs directory)."""
    parents = {p.resolve().parent for p in run_dirs}
    if len(parents) != 1:
        raise UserError(
            f"the runs live in different directories ({', '.join(sorted(map(str, parents)))}), so there is "
            f"no one default decision log; pass --log FILE."
        )
    return parents.pop() / LOG_NAME


def direction(metric: str) -> str | None:
    name = metric.lower()
    if any(key in name for key in _LOWER):
        return "lower"
    if any(key in name for key in _HIGHER):
        return "higher"
    return None


def _config_hash(run: Run) -> str | None:
    value = run.start().get("config_hash")
    return value if isinstance(value, str) else None


def decide(
    title: str,
    run_dirs: list[str | Path],
    metric: str,
    outcome: str | None = None,
    log: str | Path | None = None,
) -> dict[str, Any]:
    """Append a decision record to the log and return it."""
    if not title.strip():
        raise UserError('the decision needs a title: the question it answers, e.g. "Does QK-norm help?".')
    if not run_dirs:
        raise UserError("a decision needs the runs it rests on: --runs RUN [RUN ...].")
    runs = [load_run(d) for d in run_dirs]
    entries = []
    for run in runs:
        figures = final_metrics(run)
        if metric not in figures:
            available = ", ".join(sorted(figures)) or "none"
            raise UserError(
                f"run {run.path} has no metric {metric!r}. Its metrics: {available}. Pass one of them to --metric."
            )
        entries.append(
            {
                "name": run.name,
                "path": str(run.path.resolve()),
                "config_hash": _config_hash(run),
                "value": figures[metric],
            }
        )
    way = direction(metric)
    best = None
    if way is not None and len(entries) > 1:
        pick = min if way == "lower" else max
        best = pick(entries, key=lambda e: e["value"])["name"]
    record = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "question": title.strip(),
        "metric": metric,
        "better": way,
        "runs": entries,
        "best": best,
        "outcome": outcome,
    }
    path = Path(log) if log else default_log([r.path for r in runs])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    record["log"] = str(path)
    return record


def read_log(path: Path) -> list[dict[str, Any]]:
    """Every record of a decision log; a broken line is a UserError naming it."""
    if not path.is_file():
        return []
    records = []  # not smelt.jsonl: its messages say FILE:LINE, and a line that is not an object is skipped
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(
                f"{path}:{number} is not a JSON object ({exc.msg}); fix or delete that line of the decision log."
            ) from exc
        if isinstance(record, dict):
            records.append(record)
    return records


def decisions_for(run: Run, log: Path | None = None) -> list[dict[str, Any]]:
    """The decisions that name this run: by its path, or by its name and config hash when it moved."""
    path = log or run.path.resolve().parent / LOG_NAME
    here, config_hash = str(run.path.resolve()), _config_hash(run)
    found = []
    for record in read_log(path):
        for entry in record.get("runs", []):
            moved = config_hash is not None and entry.get("config_hash") == config_hash
            if entry.get("path") == here or (moved and entry.get("name") == run.name):
                found.append(record)
                break
    return found
