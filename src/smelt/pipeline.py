"""Stage orchestration: run the stages of a pipeline in order, skipping those that are up to date.

Each stage reads the artifacts of the stage before it and writes its own directory under the run
directory with a `manifest.json`. A stage is up to date when its config hash and its input hashes (the
raw files' content, or the output hashes of the stages it reads) match its manifest and its outputs are
intact; then it is skipped and its recorded result is reused.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smelt.config import Config
from smelt.errors import UserError
from smelt.manifest import Stage, hash_files, read_manifest, write_json
from smelt.progress import log

STAGES = ("curate", "tokenizer", "tokenize", "train", "eval")
STAGE_DIRS = {
    "curate": "documents",
    "tokenizer": "tokenizer",
    "tokenize": "tokens",
    "train": "train",
    "eval": "eval",
}
# Stages that pick up an interrupted run where it stopped (per-shard completion markers) instead of
# starting over; a finished stage whose config or inputs changed always starts from an empty directory.
RESUMABLE_STAGES = ("curate", "tokenize", "train")
# Written when a stage starts and removed when it ends: an interrupted stage resumes only when the
# attempt it would continue had the same config and inputs.
ATTEMPT = "attempt.json"
# Which config sections decide each stage's output (its cache key, with its inputs).
STAGE_SECTIONS = {
    "curate": ("data",),
    "tokenizer": ("tokenizer",),
    "tokenize": ("tokens",),
    "train": ("model", "train", "checkpoint"),
    "eval": ("eval",),
}
# The stages whose outputs each stage reads.
STAGE_INPUTS = {
    "curate": (),
    "tokenizer": ("curate",),
    "tokenize": ("curate", "tokenizer"),
    "train": ("tokenizer", "tokenize"),
    "eval": ("curate", "tokenizer", "tokenize", "train"),
}


@dataclass
class StageOutcome:
    stage: str
    directory: Path
    skipped: bool
    wall_time_s: float
    result: dict[str, Any]


def stage_dir(cfg: Config, stage: str) -> Path:
    return cfg.run_dir / STAGE_DIRS[stage]


def _stage_config(cfg: Config, stage: str) -> dict[str, Any]:
    config = {name: asdict(getattr(cfg, name)) for name in STAGE_SECTIONS[stage]}
    if stage == "tokenize":  # the loader's keys (mixture, stages, FIM) do not change the shards
        config["tokens"] = cfg.tokens.shard_settings()
    if stage == "train":
        config["tokens"] = cfg.tokens.loader_settings()
        config["code_sources"] = sorted(s.name for s in cfg.data.sources if s.code)  # FIM's default
    if stage in ("tokenizer", "train", "eval"):
        config["seed"] = cfg.run.seed
    if stage == "eval":
        config["seq_len"] = cfg.train.seq_len
    return config


def _stage_inputs(cfg: Config, stage: str) -> dict[str, str]:
    if stage == "curate":
        from smelt.data.curate import resolve_sources

        inputs = {}
        for source, files in resolve_sources(cfg.data).items():
            root = Path(_common_root(files))
            inputs[f"raw:{source}"] = hash_files(files, root)
        return inputs
    inputs = {}
    for upstream in STAGE_INPUTS[stage]:
        manifest = read_manifest(stage_dir(cfg, upstream))
        if manifest is None:
            raise UserError(
                f"stage {stage!r} needs the output of stage {upstream!r}, but {stage_dir(cfg, upstream)} "
                f"has no manifest.json. Run `smelt run CONFIG` (or the {upstream!r} stage) first."
            )
        inputs[upstream] = manifest["outputs_hash"]
    return inputs


def _common_root(files: list[Path]) -> str:
    return os.path.commonpath([str(f.parent) for f in files]) if files else "."


def _wait_for_attempt(directory: Path, attempt: dict[str, Any], timeout_s: float = 600.0) -> None:
    deadline = time.time() + timeout_s
    while _read_attempt(directory) != attempt:
        if time.time() > deadline:
            raise RuntimeError(f"rank 0 did not prepare {directory} within {timeout_s:.0f} s")
        time.sleep(0.2)


def _read_attempt(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / ATTEMPT).read_text())
    except (OSError, ValueError):
        return None


def _execute(cfg: Config, stage: str, directory: Path, resume: bool = False) -> dict[str, Any]:
    run_dir = cfg.run_dir
    if stage == "curate":
        from smelt.data.curate import curate

        return curate(cfg.data, directory)
    if stage == "tokenizer":
        from smelt.tokenizer.train import train_tokenizer

        return train_tokenizer(cfg.tokenizer, run_dir / STAGE_DIRS["curate"], directory, cfg.run.seed)
    if stage == "tokenize":
        from smelt.tokens.shards import tokenize

        return tokenize(
            cfg.tokens, run_dir / STAGE_DIRS["curate"], run_dir / STAGE_DIRS["tokenizer"], directory
        )
    if stage == "train":
        from smelt.train.trainer import train

        return train(
            cfg,
            run_dir / STAGE_DIRS["tokenize"],
            run_dir / STAGE_DIRS["tokenizer"],
            directory,
            resume="auto" if resume else None,
        )
    if stage == "eval":
        from smelt.eval.heldout import evaluate_run

        return evaluate_run(cfg, run_dir, directory)
    raise ValueError(stage)


def run_stage(cfg: Config, stage: str, force: bool = False) -> StageOutcome:
    """Run one stage unless it is up to date (or `force`); return its result either way."""
    directory = stage_dir(cfg, stage)
    spec = Stage(stage, directory, _stage_config(cfg, stage), _stage_inputs(cfg, stage), cfg.run.seed)
    if not force and spec.up_to_date():
        manifest = spec.read_manifest() or {}
        log(f"[{stage}] up to date, skipped ({directory})")
        return StageOutcome(stage, directory, True, 0.0, manifest.get("result", {}))
    log(f"[{stage}] running -> {directory}")
    attempt = {"config_hash": spec.config_hash, "inputs": spec.inputs}
    interrupted = directory.exists() and spec.read_manifest() is None
    resumable = interrupted and stage in RESUMABLE_STAGES and _read_attempt(directory) == attempt
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        if directory.exists() and not resumable:
            shutil.rmtree(directory)  # stale outputs would otherwise leak into the output hashes
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / ATTEMPT, attempt)
    else:  # under torchrun: rank 0 prepares the directory; the attempt file says it is ready
        _wait_for_attempt(directory, attempt)
    started = time.time()
    result = _execute(cfg, stage, directory, resume=resumable)
    if rank != 0:
        return StageOutcome(stage, directory, False, round(time.time() - started, 3), result)
    (directory / ATTEMPT).unlink()
    manifest = spec.write_manifest(started, extra={"result": result})
    log(f"[{stage}] done in {manifest['wall_time_s']:.1f}s")
    return StageOutcome(stage, directory, False, manifest["wall_time_s"], result)


def run_pipeline(
    cfg: Config,
    stages: tuple[str, ...] = STAGES,
    force: bool = False,
    on_stage: Callable[[StageOutcome], None] | None = None,
) -> dict[str, StageOutcome]:
    """Run `stages` in pipeline order. A stage that reruns forces every later stage to rerun too
    (their inputs changed), which the input hashes already guarantee."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    write_json(cfg.run_dir / "config.json", cfg.to_dict())
    outcomes: dict[str, StageOutcome] = {}
    for stage in STAGES:
        if stage not in stages:
            continue
        outcome = run_stage(cfg, stage, force=force)
        outcomes[stage] = outcome
        if on_stage:
            on_stage(outcome)
    return outcomes
