"""Evaluating a run's checkpoints: `RUN/eval/step_NNNNNNN.json` per checkpoint, and views across them.

A step file holds what the checkpoint and the task set determine: held-out loss and bits-per-byte,
task scores (with the decontamination overlap of each task when curation measured it), sampled
continuations and the greedy gallery, and the prompt convention the tasks and gallery were tokenized
under (eval.convention, see harness.py). It is keyed by the checkpoint's hash and the task-set version
(a hash of everything else that decides the figures), so `--checkpoint all` skips checkpoints that
already have a current file. The views are rebuilt from the step files after every evaluation:
    curves.jsonl   one {"step", "kind": "eval", ...} record per evaluated checkpoint, in step order
    gallery.json   each gallery prompt with its greedy completion at every evaluated step
They are not written by the pipeline's eval stage (which records its outputs' hashes), so filling
in other checkpoints later never makes that stage look stale.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from smelt.config import Config, hash_json
from smelt.errors import UserError
from smelt.eval.harness import Prepared, prepare, prompt_ids, score_prepared
from smelt.eval.tasks import SPECS, get_spec, load_task, resolve_tasks_dir
from smelt.manifest import combined_hash, hash_file, read_manifest, write_json
from smelt.progress import log

HARNESS_VERSION = "tasks-v2"  # v2: prompts under eval.convention (lm-eval by default)
CURVES = "curves.jsonl"
GALLERY = "gallery.json"


def default_tasks(cfg: Config) -> list[str]:
    """eval.tasks, or none (with a note) when eval.tasks_dir is unset and no benchmark files are found
    where it looks by default: held-out loss still works on a machine without the benchmark files."""
    from smelt.eval.tasks import find_tasks_dir

    if cfg.eval.tasks and not cfg.eval.tasks_dir and find_tasks_dir() is None:
        log("[eval] no benchmark files found (set eval.tasks_dir): scoring held-out loss only")
        return []
    return list(cfg.eval.tasks)


def task_set_version(cfg: Config, tasks: list[str], limit: int) -> str:
    """Everything but the checkpoint that decides a step file's figures."""
    e = cfg.eval
    key = {
        "harness": HARNESS_VERSION,
        "tasks": {name: get_spec(name).fingerprint() for name in tasks},
        "limit": limit,
        "shots": e.shots,
        "overlong": e.overlong,
        "convention": e.convention,
        "heldout": [e.max_bytes, cfg.train.seq_len, cfg.train.doc_masking],
        "samples": [e.prompts, e.max_new_tokens, e.temperature, e.top_k, cfg.run.seed, e.gallery_tokens],
    }
    return f"{HARNESS_VERSION}-{hash_json(key)[:16]}"


def resolve_checkpoints(run_dir: Path, which: str) -> list[Path]:
    """`latest`, `all` (every retained checkpoint, oldest first), a step number, or a committed checkpoint
    directory (e.g. an average written by `smelt checkpoint average`)."""
    from smelt.checkpoint.store import latest_checkpoint, list_checkpoints

    checkpoints = run_dir / "train" / "checkpoints"
    if which == "all":
        found = list_checkpoints(checkpoints)
    elif which == "latest":
        latest = latest_checkpoint(checkpoints)
        found = [latest] if latest else []
    elif (Path(which) / "COMMITTED").is_file():
        found = [Path(which)]
    else:
        try:
            step = int(which)
        except ValueError as exc:
            raise UserError(
                f"--checkpoint {which!r} must be `latest`, `all`, a step number or a checkpoint directory."
            ) from exc
        path = checkpoints / f"step_{step:07d}"
        if not (path / "COMMITTED").is_file():
            steps = [p.name for p in list_checkpoints(checkpoints)]
            raise UserError(
                f"checkpoint {path} does not exist or is incomplete. Retained: {', '.join(steps) or 'none'}; "
                f"or use `latest` / `all`."
            )
        found = [path]
    if not found:
        raise UserError(f"no committed checkpoint under {checkpoints}. Run `smelt train CONFIG` first.")
    return found


def check_tokenizer(meta: dict[str, Any], tokenizer: Any, run_dir: Path, checkpoint: Path) -> None:
    """A checkpoint scored with another tokenizer than it was trained with gives meaningless figures."""
    fix = (
        "Evaluate it inside the run that trained it, or retrain the model after changing the tokenizer "
        "(`smelt run CONFIG`)."
    )
    recorded = meta.get("tokenizer_hash")
    # The trainer records the tokenizer's artifact hash, or without one that of tokenizer.json alone.
    known = {tokenizer.hash, hash_file(run_dir / "tokenizer" / "tokenizer.json")}
    if recorded and recorded not in known:
        raise UserError(
            f"checkpoint {checkpoint} was trained with tokenizer {recorded[:12]} but {run_dir / 'tokenizer'} "
            f"is {tokenizer.hash[:12]}. {fix}"
        )
    if int(meta.get("vocab_size", tokenizer.vocab_size)) != tokenizer.vocab_size:
        raise UserError(
            f"checkpoint {checkpoint} has a vocabulary of {meta['vocab_size']} tokens but the run's tokenizer "
            f"({run_dir / 'tokenizer'}) has {tokenizer.vocab_size}: it is not the tokenizer the model was "
            f"trained with. {fix}"
        )
    train, tok = read_manifest(run_dir / "train"), read_manifest(run_dir / "tokenizer")
    if train and tok and train.get("inputs", {}).get("tokenizer") not in (None, tok.get("outputs_hash")):
        raise UserError(
            f"{run_dir / 'tokenizer'} changed after the model in {run_dir / 'train'} was trained (its hash is "
            f"not the one the train stage recorded). {fix}"
        )


def contamination(cfg: Config, run_dir: Path, tasks_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Per task, the decontamination report of the benchmark set that is the same task (same name, or
    the same file or directory) when curation ran decontamination; {} otherwise."""
    path = run_dir / "documents" / "decontamination.json"
    if not path.is_file():
        return {}
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    found: dict[str, dict[str, Any]] = {}
    sets = list(enumerate(cfg.data.decontam.evals))
    for name, spec in SPECS.items():
        task_file = (tasks_dir / spec.path).resolve() if tasks_dir else None
        for i, es in sets:
            bench = es.name or f"eval{i}"
            if bench not in report:
                continue
            same_file = False
            if task_file is not None and es.path:
                p = Path(es.path).resolve()
                same_file = p == task_file or p in task_file.parents or task_file in p.parents
            if bench == name or same_file:
                found[name] = {"benchmark": bench, **report[bench]}
                break
    return found


class TaskCache:
    """Tasks read and tokenized once for all checkpoints of one evaluation."""

    def __init__(self, cfg: Config, tasks: list[str], limit: int, tokenizer: Any, max_len: int):
        from_files = [name for name in tasks if get_spec(name).reader != "synthetic"]
        self.tasks_dir = resolve_tasks_dir(cfg.eval.tasks_dir) if from_files else None
        self.prepared: dict[str, Prepared] = {}
        for name in tasks:
            task = load_task(get_spec(name), self.tasks_dir, limit, cfg.eval.shots)
            self.prepared[name] = prepare(task, tokenizer, max_len, cfg.eval.overlong, cfg.eval.convention)


def gallery(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    max_new_tokens: int,
    convention: str = "lm-eval",
) -> list[dict]:
    """Greedy continuations of fixed prompts: deterministic, so checkpoints compare side by side. Each
    prompt is fed as `prompt_ids` gives it, so under the "lm-eval" convention `transformers` greedy
    generate on the exported model, from `tokenizer(prompt)`, continues it with the same tokens."""
    from smelt.model.generate import generate

    if not prompts or not max_new_tokens:
        return []
    ids = [prompt_ids(tokenizer, p, convention) for p in prompts]
    rows = [generate(model, p, max_new_tokens, temperature=0.0, eos_id=tokenizer.eos_id) for p in ids]
    return [
        {"prompt": p, "completion": tokenizer.decode(r[len(i) :])}
        for p, i, r in zip(prompts, ids, rows, strict=True)
    ]


def evaluate_checkpoint(
    cfg: Config,
    run_dir: Path,
    out_dir: Path,
    path: Path,
    tasks: list[str] | None = None,
    limit: int | None = None,
    cache: TaskCache | None = None,
    device: torch.device | None = None,
) -> dict[str, Any]:
    """Evaluate one checkpoint; write out_dir/step_NNNNNNN.json and return it (plus wall time)."""
    from smelt.checkpoint.store import load_model, read_meta
    from smelt.eval.heldout import heldout_bits_per_byte, samples, trained_lengths, training_mixture
    from smelt.tokenizer.load import Tokenizer

    started = time.time()
    device = device or torch.device("cpu")
    tasks = default_tasks(cfg) if tasks is None else list(tasks)
    limit = cfg.eval.limit if limit is None else limit
    tokenizer = Tokenizer.load(run_dir / "tokenizer")
    check_tokenizer(read_meta(path, verify=False), tokenizer, run_dir, path)  # before a shape error could
    model, meta = load_model(path, device=device)
    if cache is None:
        cache = TaskCache(cfg, tasks, limit, tokenizer, model.cfg.max_seq_len)
    heldout = heldout_bits_per_byte(
        model,
        run_dir / "tokens",
        run_dir / "documents",
        tokenizer.eos_id,
        cfg.train.seq_len,
        cfg.eval.batch_size,
        cfg.eval.max_bytes,
        device=device,
        doc_masking=cfg.train.doc_masking,
        weights=training_mixture(cfg, run_dir / "tokens"),
        trained_at=trained_lengths(model.cfg, meta),
    )
    e = cfg.eval
    sampled = samples(model, tokenizer, e.prompts, e.max_new_tokens, e.temperature, e.top_k, cfg.run.seed)
    scores: dict[str, Any] = {}
    overlap = contamination(cfg, run_dir, cache.tasks_dir)
    for name in tasks:
        scores[name] = score_prepared(model, tokenizer, cache.prepared[name], e.batch_size, device)
        if name in overlap:
            scores[name]["contamination"] = overlap[name]
    step = int(meta["step"])
    result = {
        "step": step,
        "tokens_seen": meta.get("tokens"),
        "checkpoint": str(path),
        "checkpoint_hash": combined_hash(meta.get("checksums", {})),
        "task_set_version": task_set_version(cfg, tasks, limit),
        "convention": e.convention,
        "heldout": heldout,
        "tasks": scores,
        "samples": sampled,
        "gallery": gallery(model, tokenizer, e.prompts, e.gallery_tokens, e.convention),
    }
    # The file holds only what the checkpoint and task set determine, so re-scoring rewrites the same bytes.
    write_json(out_dir / result_name(path, meta), result)
    return {**result, "wall_time_s": round(time.time() - started, 3)}


def result_name(path: Path, meta: dict[str, Any]) -> str:
    """step_NNNNNNN.json; a weights-only checkpoint (an average) is named after its directory, so it
    never overwrites the step it was made at nor joins the training curves."""
    if meta.get("weights_only"):
        return f"weights_only-{path.name}.json"
    return f"step_{int(meta['step']):07d}.json"


def _current(out_dir: Path, path: Path, version: str) -> dict[str, Any] | None:
    """The step file of a checkpoint when it is for this checkpoint's hash and this task set."""
    from smelt.checkpoint.store import read_meta

    meta = read_meta(path, verify=False)
    target = out_dir / result_name(path, meta)
    try:
        existing = json.loads(target.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if existing.get("task_set_version") != version:
        return None
    if existing.get("checkpoint_hash") != combined_hash(meta.get("checksums", {})):
        return None
    return existing


def evaluate_checkpoints(
    cfg: Config,
    run_dir: Path,
    which: str = "latest",
    tasks: list[str] | None = None,
    limit: int | None = None,
    device: torch.device | None = None,
    force: bool = False,
) -> list[dict[str, Any]]:
    """Evaluate `which` checkpoints (skipping those with a current step file unless `force`), then
    rebuild the views."""
    from smelt.tokenizer.load import Tokenizer

    out_dir = run_dir / "eval"
    tasks = default_tasks(cfg) if tasks is None else list(tasks)
    limit = cfg.eval.limit if limit is None else limit
    version = task_set_version(cfg, tasks, limit)
    results, cache = [], None
    for path in resolve_checkpoints(run_dir, which):
        existing = None if force else _current(out_dir, path, version)
        if existing is not None:
            log(f"[eval] {path.name}: up to date, skipped")
            results.append(existing)
            continue
        if cache is None:
            from smelt.checkpoint.store import read_meta

            max_len = int(read_meta(path, verify=False)["model_config"]["max_seq_len"])
            cache = TaskCache(cfg, tasks, limit, Tokenizer.load(run_dir / "tokenizer"), max_len)
        log(f"[eval] {path.name}")
        results.append(evaluate_checkpoint(cfg, run_dir, out_dir, path, tasks, limit, cache, device))
    write_views(out_dir)
    return results


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
