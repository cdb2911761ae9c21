"""A checkpoint's evaluation results, `RUN/eval/step_NNNNNNN.json`, cached by content and merged.

A step file holds one checkpoint's figures in sections: `heldout` (loss and bits per byte of the run's
validation split), `samples` and `gallery`, `tasks` (one entry per task) and `data` (bits per byte of
text sets scored with `--data`, one entry per set). Each section and each task or set carries its own
key in `keys`: a hash of everything but the checkpoint that decides its figures (for a task: its task
file's bytes, the content hashes of its data files, limit, shots, overlong, convention). A file whose
`checkpoint_hash` is the checkpoint's is reused section by section: `smelt eval --tasks a` then
`--tasks b` keeps both tasks and computes the held-out loss once, and a changed task file re-scores
that task only. `task_set_version` is a hash over all the keys of the file.

The views are rebuilt from the step files after every evaluation:
    curves.jsonl   one {"step", "kind": "eval", ...} record per evaluated checkpoint, in step order
    gallery.json   each gallery prompt with its greedy completion at every evaluated step
They are not written by the pipeline's eval stage (which records its outputs' hashes), so filling
in other checkpoints later never makes that stage look stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from smelt.config import hash_json
from smelt.manifest import write_json

HARNESS_VERSION = "tasks-v3"  # v3: a key per task and section, results merged into the step file
CURVES = "curves.jsonl"
GALLERY = "gallery.json"


def section_key(value: Any) -> str:
    return hash_json({"harness": HARNESS_VERSION, **value})[:16]


def task_set_version(keys: dict[str, Any]) -> str:
    """One hash over every key of a step file: equal versions mean equal inputs to every figure."""
    return f"{HARNESS_VERSION}-{hash_json(keys)[:16]}"


def result_name(path: Path, meta: dict[str, Any]) -> str:
    """step_NNNNNNN.json; a weights-only checkpoint (an average) is named after its directory, so it
    never overwrites the step it was made at nor joins the training curves."""
    if meta.get("weights_only"):
        return f"weights_only-{path.name}.json"
    return f"step_{int(meta['step']):07d}.json"


def read_result(target: Path, checkpoint_hash: str) -> dict[str, Any] | None:
    """The step file at `target` when it was written for this checkpoint's weights, else None."""
    try:
        existing = json.loads(target.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(existing, dict) or existing.get("checkpoint_hash") != checkpoint_hash:
        return None
    if not isinstance(existing.get("keys"), dict):
        return None  # written before sections had keys: nothing in it can be matched
    return existing


def missing(existing: dict[str, Any] | None, wanted: dict[str, Any]) -> dict[str, Any]:
    """The part of `wanted` (keys of the sections asked for, as `keys` holds them) that `existing`
    does not hold with the same key."""
    have = (existing or {}).get("keys", {})
    out: dict[str, Any] = {}
    for section, key in wanted.items():
        if isinstance(key, dict):
            held = have.get(section, {})
            stale = {name: k for name, k in key.items() if held.get(name) != k}
            if stale:
                out[section] = stale
        elif have.get(section) != key:
            out[section] = key
    return out


def describe(keys: dict[str, Any]) -> str:
    """The parts named by some keys, for a log line: "held-out, samples, tasks copa, piqa"."""
    parts = [
        {"heldout": "held-out", "samples": "samples"}.get(s, s)
        for s, k in keys.items()
        if not isinstance(k, dict)
    ]
    for section in ("tasks", "data"):
        if keys.get(section):
            parts.append(f"{section} {', '.join(keys[section])}")
    return ", ".join(parts) or "nothing"


def kept(wanted: dict[str, Any], todo: dict[str, Any]) -> dict[str, Any]:
    """The part of `wanted` not in `todo`: what a step file already held."""
    out: dict[str, Any] = {}
    for section, key in wanted.items():
        if isinstance(key, dict):
            held = {n: k for n, k in key.items() if n not in todo.get(section, {})}
            if held:
                out[section] = held
        elif section not in todo:
            out[section] = key
    return out


def merge(existing: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """`new` figures over `existing` ones: per task and per data set, and per top-level section."""
    merged = dict(existing or {})
    keys = {k: (dict(v) if isinstance(v, dict) else v) for k, v in merged.get("keys", {}).items()}
    for section, value in new.items():
        if section in ("tasks", "data"):
            merged[section] = {**merged.get(section, {}), **value}
        elif section != "keys":
            merged[section] = value
    for section, key in new.get("keys", {}).items():
        if isinstance(key, dict):
            keys[section] = {**keys.get(section, {}), **key}
        else:
            keys[section] = key
    for section in ("tasks", "data"):  # sorted, so the same figures always give the same bytes
        if section in merged:
            merged[section] = dict(sorted(merged[section].items()))
        if section in keys:
            keys[section] = dict(sorted(keys[section].items()))
    merged.setdefault("tasks", {})
    merged["keys"] = keys
    merged["task_set_version"] = task_set_version(keys)
    return merged


def curve_record(result: dict[str, Any]) -> dict[str, Any]:
    """One curves.jsonl line: the figures a plot over training needs, from one step file."""
    overall = result.get("heldout", {}).get("overall", {})
    return {
        "step": result["step"],
        "kind": "eval",
        "tokens": result.get("tokens_seen"),
        "checkpoint_hash": result.get("checkpoint_hash"),
        "task_set_version": result.get("task_set_version"),
        "convention": result.get("convention"),
        "val_loss": overall.get("loss"),
        "bits_per_byte": overall.get("bits_per_byte"),
        "bits_per_byte_by_source": {
            s: f.get("bits_per_byte") for s, f in result.get("heldout", {}).get("per_source", {}).items()
        },
        "tasks": {
            name: {k: v for k, v in t.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
            for name, t in result.get("tasks", {}).items()
        },
        "data_bits_per_byte": {label: f.get("bits_per_byte") for label, f in result.get("data", {}).items()},
    }


def write_views(out_dir: Path) -> None:
    """Rebuild curves.jsonl and gallery.json from every step file under out_dir."""
    results = []
    for path in sorted(out_dir.glob("step_*.json")):
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    results.sort(key=lambda r: r["step"])
    lines = "".join(json.dumps(curve_record(r), sort_keys=True) + "\n" for r in results)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / f".{CURVES}.tmp"
    tmp.write_text(lines)
    tmp.replace(out_dir / CURVES)
    prompts: dict[str, dict[str, str]] = {}
    for r in results:
        for item in r.get("gallery", []):
            prompts.setdefault(item["prompt"], {})[str(r["step"])] = item["completion"]
    write_json(
        out_dir / GALLERY,
        {
            "steps": [r["step"] for r in results],
            "prompts": [{"prompt": p, "completions": c} for p, c in prompts.items()],
        },
    )
