"""Evaluating a run's checkpoints: work out what was asked for and the key of each part, score only
the parts the checkpoint's step file lacks, and merge them into it (results.py: the file, its keys
and the views). Held-out loss and bits per byte come from heldout.py, tasks from tasks.py and
harness.py, text sets (`--data`) from text_sets.py.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smelt.config import Config
from smelt.errors import UserError
from smelt.eval.harness import Prepared, prepare, prompt_ids, score_prepared
from smelt.eval.results import (
    CURVES,
    GALLERY,
    describe,
    kept,
    merge,
    missing,
    read_result,
    result_name,
    section_key,
    write_views,
)
from smelt.eval.tasks import (
    Task,
    TaskSpec,
    configured_tasks_dir,
    find_tasks_dir,
    get_spec,
    load_task,
    resolve_tasks_dir,
    task_fingerprint,
)
from smelt.layout import TOKENIZER_JSON
from smelt.manifest import combined_hash, hash_file, hash_files, read_manifest, write_json
from smelt.progress import log

__all__ = [
    "CURVES",
    "GALLERY",
    "TasksLeftOut",
    "evaluate_checkpoint",
    "evaluate_checkpoints",
    "evaluate_run",
    "write_views",
]


def default_tasks(cfg: Config) -> list[str]:
    """eval.tasks, or none (with a note) when eval.tasks_dir is unset and no benchmark files are found
    where it looks by default: held-out loss still works on a machine without the benchmark files.
    Tasks given as task file paths are kept: their files are relative to the task file."""
    if cfg.eval.tasks and not cfg.eval.tasks_dir and find_tasks_dir() is None:
        own = [n for n in cfg.eval.tasks if n.endswith(".toml")]  # task files name their own files
        if len(own) < len(cfg.eval.tasks):
            log("[eval] no benchmark files found (set eval.tasks_dir): scoring held-out loss only")
        return own
    return list(cfg.eval.tasks)


@dataclass
class Request:
    """What one evaluation asks for: the tasks (resolved to specs), the text sets, whether the
    held-out split and samples are wanted, and the key of every part (results.missing compares them
    with a step file's)."""

    specs: dict[str, TaskSpec]
    tasks_dir: Path | None
    limit: int
    data: dict[str, Path] = field(default_factory=dict)
    data_field: str = "text"
    keys: dict[str, Any] = field(default_factory=dict)
    loaded: dict[str, Task] = field(default_factory=dict)  # each task read and checked before scoring
    failed: dict[str, str] = field(default_factory=dict)  # task -> why it is left out (its file named)


class TasksLeftOut(UserError):
    """Some tasks asked for could not be read (a bad task file, a missing or malformed data file).
    They were checked before anything was scored and left out; everything else was scored and
    written. `results` holds what was written, so a command can still print it."""

    def __init__(self, failed: dict[str, str], results: list[dict[str, Any]]) -> None:
        lines = "\n".join(f"  {name}: {why}" for name, why in failed.items())
        rest = (
            "the rest was scored and written"
            if results
            else "nothing else was asked for, so nothing was scored"
        )
        super().__init__(f"{len(failed)} task(s) could not be read and were left out ({rest}):\n{lines}")
        self.failed, self.results = failed, results


def heldout_key(cfg: Config, run_dir: Path) -> str:
    """The held-out figures depend on the validation tokens, the window, doc masking and the mixture
    weights of the headline."""
    tokens = read_manifest(run_dir / "tokens") or {}
    e, t = cfg.eval, cfg.train
    mixture = cfg.to_dict()["tokens"]
    # A cap is met exactly since the last document is cut at it ("cut"): figures scored before, on
    # whole documents past the cap, are not reused.
    capped = [e.max_bytes, "cut"] if e.max_bytes else [e.max_bytes]
    return section_key({"heldout": [*capped, t.seq_len, t.doc_masking, t.tokens], "mixture": mixture,
                        "tokens": tokens.get("outputs_hash")})  # fmt: skip


def plan_request(
    cfg: Config,
    run_dir: Path,
    tasks: list[str] | None = None,
    limit: int | None = None,
    data: list[str] | tuple[str, ...] = (),
    data_field: str = "text",
    heldout: bool = True,
) -> Request:
    """Resolve tasks and text sets and compute every key. Raises UserError for an unknown task, a
    missing tasks directory that a task needs, or a text set that does not exist."""
    from smelt.eval.text_sets import text_files

    e = cfg.eval
    names = default_tasks(cfg) if tasks is None else list(tasks)
    limit = e.limit if limit is None else limit
    tasks_dir = configured_tasks_dir(e.tasks_dir)
    specs, loaded, failed = {}, {}, {}
    for name in names:
        try:
            spec = get_spec(name, tasks_dir)
        except UserError as exc:
            if tasks_dir is None:
                resolve_tasks_dir(e.tasks_dir)  # the task may be a file there: say where it looked
            failed[name] = str(exc)
            continue
        if spec.needs_files() and spec.root(tasks_dir) is None:
            resolve_tasks_dir(e.tasks_dir)  # says where it looked and how to set it
        try:  # read and check every task now, before minutes of scoring, not when its turn comes
            loaded[spec.name] = load_task(spec, tasks_dir, limit, e.shots)
        except UserError as exc:
            failed[spec.name] = str(exc)
            continue
        specs[spec.name] = spec
    for name, why in failed.items():
        log(f"[eval] task {name} left out: {why}")
    if failed and not specs and not heldout and not data:
        raise TasksLeftOut(failed, [])  # nothing else was asked for
    request = Request(specs, tasks_dir, limit, data_field=data_field, loaded=loaded, failed=failed)
    keys: dict[str, Any] = {}
    if heldout:
        keys["heldout"] = heldout_key(cfg, run_dir)
        samples = [e.prompts, e.max_new_tokens, e.temperature, e.top_k, cfg.run.seed, e.gallery_tokens]
        keys["samples"] = section_key({"samples": samples, "convention": e.convention})
    keys["tasks"] = {
        name: section_key(
            {
                "task": task_fingerprint(spec, tasks_dir),
                "limit": limit,
                "shots": e.shots,
                "overlong": e.overlong,
                "convention": e.convention,
            }
        )  # fmt: skip
        for name, spec in specs.items()
    }
    keys["data"] = {}
    for item in data:
        path = Path(item)
        files = text_files(path)
        content = hash_files(files, path) if path.is_dir() else hash_file(path)
        request.data[item] = path
        keys["data"][item] = section_key({"data": content, "field": data_field,
                                          "window": [cfg.train.seq_len, cfg.train.doc_masking]})  # fmt: skip
    request.keys = keys
    return request


def resolve_checkpoints(run_dir: Path, which: str) -> list[Path]:
    """`latest`, `all` (every retained checkpoint, oldest first), a step number, or a committed checkpoint
    directory (e.g. an average written by `smelt checkpoint average`)."""
    from smelt.layout import checkpoints_dir
    from smelt.layout import resolve_checkpoints as resolve

    return resolve(checkpoints_dir(run_dir), which)


def check_tokenizer(meta: dict[str, Any], tokenizer: Any, run_dir: Path, checkpoint: Path) -> None:
    """A checkpoint scored with another tokenizer than it was trained with gives meaningless figures."""
    fix = (
        "Evaluate it inside the run that trained it, or retrain the model after changing the tokenizer "
        "(`smelt run CONFIG`)."
    )
    recorded = meta.get("tokenizer_hash")
    # The trainer records the tokenizer's artifact hash, or without one that of tokenizer.json alone.
    known = {tokenizer.hash, hash_file(run_dir / "tokenizer" / TOKENIZER_JSON)}
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


def contamination(
    cfg: Config, run_dir: Path, specs: dict[str, TaskSpec], tasks_dir: Path | None
) -> dict[str, dict[str, Any]]:
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
    for name, spec in specs.items():
        root = spec.root(tasks_dir)
        task_file = (root / spec.path).resolve() if root is not None and spec.needs_files() else None
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
    """Tasks read and tokenized once for all checkpoints of one evaluation (per context length)."""

    def __init__(self, cfg: Config, request: Request):
        self.cfg, self.request = cfg, request
        self.prepared: dict[tuple[str, int], Prepared] = {}

    def get(self, name: str, tokenizer: Any, max_len: int) -> Prepared:
        if (name, max_len) not in self.prepared:
            e, r = self.cfg.eval, self.request
            task = r.loaded.get(name) or load_task(r.specs[name], r.tasks_dir, r.limit, e.shots)
            self.prepared[name, max_len] = prepare(task, tokenizer, max_len, e.overlong, e.convention)
        return self.prepared[name, max_len]


def check_context(cfg: Config, model_cfg: Any, checkpoint: Path) -> None:
    """Held-out loss and text sets are scored in windows of train.seq_len: no longer than the
    checkpoint's context."""
    if cfg.train.seq_len > model_cfg.max_seq_len:
        raise UserError(
            f"train.seq_len = {cfg.train.seq_len} is longer than the context of checkpoint {checkpoint} "
            f"({model_cfg.max_seq_len} tokens, its model.max_seq_len); held-out loss and --data are scored in "
            f"windows of train.seq_len. Evaluate at its context (--set train.seq_len={model_cfg.max_seq_len}), "
            f"or extend the model's context first (docs/lifecycle.md)."
        )


def _score(
    cfg: Config,
    run_dir: Path,
    path: Path,
    request: Request,
    todo: dict[str, Any],
    cache: TaskCache,
    device: torch.device,
) -> dict[str, Any]:
    """The figures of the parts in `todo`, from the checkpoint at `path`."""
    from smelt.checkpoint.store import load_model, read_meta
    from smelt.eval.heldout import heldout_bits_per_byte, samples, trained_lengths, training_mixture
    from smelt.tokenizer.load import Tokenizer

    e = cfg.eval
    tokenizer = Tokenizer.load(run_dir / "tokenizer")
    check_tokenizer(read_meta(path, verify=False), tokenizer, run_dir, path)  # before a shape error could
    model, meta = load_model(path, device=device)
    if "heldout" in todo or todo.get("data"):
        check_context(cfg, model.cfg, path)
    new: dict[str, Any] = {"keys": todo}
    if "heldout" in todo:
        new["heldout"] = heldout_bits_per_byte(
            model,
            run_dir / "tokens",
            run_dir / "documents",
            tokenizer.eos_id,
            cfg.train.seq_len,
            e.batch_size,
            e.max_bytes,
            device=device,
            doc_masking=cfg.train.doc_masking,
            weights=training_mixture(cfg, run_dir / "tokens"),
            trained_at=trained_lengths(model.cfg, meta),
            token_bytes=tokenizer.token_byte_lengths(),
        )
    if "samples" in todo:
        new["samples"] = samples(
            model, tokenizer, e.prompts, e.max_new_tokens, e.temperature, e.top_k, cfg.run.seed
        )
        new["gallery"] = gallery(model, tokenizer, e.prompts, e.gallery_tokens, e.convention)
    if todo.get("tasks"):
        overlap = contamination(cfg, run_dir, request.specs, request.tasks_dir)
        new["tasks"] = {}
        for name in todo["tasks"]:
            prepared = cache.get(name, tokenizer, model.cfg.max_seq_len)
            new["tasks"][name] = score_prepared(model, tokenizer, prepared, e.batch_size, device)
            if name in overlap:
                new["tasks"][name]["contamination"] = overlap[name]
    if todo.get("data"):
        from smelt.eval.text_sets import read_text_set, score_text_set

        new["data"] = {}
        for label in todo["data"]:
            texts = read_text_set(request.data[label], request.data_field)
            new["data"][label] = score_text_set(
                model, tokenizer, texts, cfg.train.seq_len, e.batch_size, device, cfg.train.doc_masking
            )
    if "samples" in todo or todo.get("tasks"):
        new["convention"] = e.convention
    return new


def evaluate_checkpoint(
    cfg: Config,
    run_dir: Path,
    out_dir: Path,
    path: Path,
    tasks: list[str] | None = None,
    limit: int | None = None,
    cache: TaskCache | None = None,
    device: torch.device | None = None,
    request: Request | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """Evaluate one checkpoint: score what its step file lacks (everything with `force`), merge it in
    and write the file; return the file's content, plus `wall_time_s` when anything was scored."""
    from smelt.checkpoint.store import read_meta

    if request is None:  # one checkpoint on its own: say which tasks were left out once it is written
        request = plan_request(cfg, run_dir, tasks, limit)
        result = evaluate_checkpoint(cfg, run_dir, out_dir, path, cache=cache, device=device, request=request,
                                     force=force)  # fmt: skip
        if request.failed:
            raise TasksLeftOut(request.failed, [result])
        return result
    started = time.time()
    meta = read_meta(path, verify=False)
    target = out_dir / result_name(path, meta)
    checkpoint_hash = combined_hash(meta.get("checksums", {}))
    existing = None if force else read_result(target, checkpoint_hash)
    todo = missing(existing, request.keys)
    if not todo:
        log(f"[eval] {path.name}: up to date, skipped")
        return existing or {}
    cached = kept(request.keys, todo)
    log(
        f"[eval] {path.name}: scoring {describe(todo)}"
        + (f" (up to date: {describe(cached)})" if cached else "")
    )
    cache = cache or TaskCache(cfg, request)
    new = _score(cfg, run_dir, path, request, todo, cache, device or torch.device("cpu"))
    head = {"step": int(meta["step"]), "tokens_seen": meta.get("tokens"), "checkpoint": str(path),
            "checkpoint_hash": checkpoint_hash}  # fmt: skip
    result = merge(existing, {**head, **new})
    # The file holds only what the checkpoint and the keys determine, so re-scoring writes the same bytes.
    write_json(target, result)
    return {**result, "wall_time_s": round(time.time() - started, 3)}


def evaluate_checkpoints(
    cfg: Config,
    run_dir: Path,
    which: str = "latest",
    tasks: list[str] | None = None,
    limit: int | None = None,
    device: torch.device | None = None,
    force: bool = False,
    data: list[str] | tuple[str, ...] = (),
    data_field: str = "text",
    heldout: bool = True,
    request: Request | None = None,
) -> list[dict[str, Any]]:
    """Evaluate `which` checkpoints, each scoring only what its step file lacks (unless `force`),
    then rebuild the views. `data`: text sets to score bits per byte on; `heldout`: whether the run's
    validation split and the samples are part of the request; `request`: all of these, planned.
    Tasks that cannot be read are left out and the rest scored; TasksLeftOut then names them, after
    everything else is written."""
    out_dir = run_dir / "eval"
    request = request or plan_request(cfg, run_dir, tasks, limit, data, data_field, heldout)
    cache = TaskCache(cfg, request)
    results = []
    for path in resolve_checkpoints(run_dir, which):
        result = evaluate_checkpoint(cfg, run_dir, out_dir, path, cache=cache, device=device, request=request,
                                     force=force)  # fmt: skip
        results.append(result)
    write_views(out_dir)
    if request.failed:
        raise TasksLeftOut(request.failed, results)
    return results


def evaluate_run(cfg: Config, run_dir: Path, out_dir: Path, checkpoint: str = "latest") -> dict[str, Any]:
    """Evaluate one checkpoint of a run (held-out figures, tasks, samples, gallery); write
    out_dir/step_NNNNNNN.json and return its figures. The pipeline's eval stage calls this."""
    if checkpoint == "all":
        raise ValueError("evaluate_run scores one checkpoint; use smelt.eval.run.evaluate_checkpoints")
    (path,) = resolve_checkpoints(run_dir, checkpoint)
    return evaluate_checkpoint(cfg, run_dir, out_dir, path)
