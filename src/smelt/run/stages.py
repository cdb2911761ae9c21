"""The table of pipeline stages: for each, its directory, the config sections that decide its output, the
stages it reads, the command that makes it, whether an interrupted run resumes it and whether a fork may
take it from its parent, and how it runs. pipeline.py orchestrates them; the names of the stage
directories are layout.py's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smelt import layout
from smelt.config import Config
from smelt.config.data import PLACEMENT_KEYS


@dataclass(frozen=True)
class StageSpec:
    """One stage of the pipeline."""

    name: str
    sections: tuple[str, ...]  # the config sections that decide its output (its cache key, with its inputs)
    inputs: tuple[str, ...]  # the stages whose outputs it reads
    command: str  # what (re)makes its output, for messages about stale or superseded work
    # Picks up an interrupted run where it stopped (per-shard completion markers) instead of starting over;
    # a finished stage whose config or inputs changed always starts from an empty directory.
    resumable: bool
    linkable: bool  # a fork takes it from its parent run when it would come out the same
    run: Callable[[Config, Path, bool], dict[str, Any]]  # (config, its directory, resume) -> result
    seeded: bool = False  # run.seed is part of its cache key

    def directory(self, run_dir: Path) -> Path:
        return layout.stage_dir(run_dir, self.name)


def _curate(cfg: Config, directory: Path, resume: bool) -> dict[str, Any]:
    from smelt.data.curate import curate

    return curate(cfg.data, directory)


def _tokenizer(cfg: Config, directory: Path, resume: bool) -> dict[str, Any]:
    from smelt.tokenizer.train import train_tokenizer

    return train_tokenizer(cfg.tokenizer, layout.stage_dir(cfg.run_dir, "curate"), directory, cfg.run.seed)


def _tokenize(cfg: Config, directory: Path, resume: bool) -> dict[str, Any]:
    from smelt.tokens.drop_list import drop_list_path, read_drop_list
    from smelt.tokens.tokenize import tokenize

    run_dir = cfg.run_dir
    return tokenize(cfg.tokens, layout.stage_dir(run_dir, "curate"), layout.stage_dir(run_dir, "tokenizer"),
                    directory, drops=read_drop_list(drop_list_path(run_dir)))  # fmt: skip


def _train(cfg: Config, directory: Path, resume: bool) -> dict[str, Any]:
    from smelt.run.training import with_goodput
    from smelt.train.trainer import train

    run_dir = cfg.run_dir
    summary = train(cfg, layout.stage_dir(run_dir, "tokenize"), layout.stage_dir(run_dir, "tokenizer"), directory,
                    resume="auto" if resume else None)  # fmt: skip
    return with_goodput(cfg, directory, summary)


def _eval(cfg: Config, directory: Path, resume: bool) -> dict[str, Any]:
    from smelt.eval.run import evaluate_run

    return evaluate_run(cfg, cfg.run_dir, directory)


STAGE_TABLE = (
    StageSpec("curate", ("data",), (), "smelt curate CONFIG", True, True, _curate),
    StageSpec(
        "tokenizer",
        ("tokenizer",),
        ("curate",),
        "smelt tokenizer train CONFIG",
        False,
        True,
        _tokenizer,
        seeded=True,
    ),  # fmt: skip
    StageSpec(
        "tokenize", ("tokens",), ("curate", "tokenizer"), "smelt tokenize CONFIG", True, True, _tokenize
    ),
    StageSpec(
        "train",
        ("model", "train", "checkpoint"),
        ("tokenizer", "tokenize"),
        "smelt train CONFIG",
        True,
        False,
        _train,
        seeded=True,
    ),  # fmt: skip
    StageSpec(
        "eval",
        ("eval",),
        ("curate", "tokenizer", "tokenize", "train"),
        "smelt eval RUN",
        False,
        False,
        _eval,
        seeded=True,
    ),  # fmt: skip
)
STAGE_SPECS = {spec.name: spec for spec in STAGE_TABLE}
assert tuple(STAGE_SPECS) == layout.STAGES, "the stage table and layout.STAGES list the same stages in order"


def stage_config(cfg: Config, stage: str) -> dict[str, Any]:
    """The settings that decide a stage's output: its sections, less the keys that never change it."""
    spec = STAGE_SPECS[stage]
    config = {name: asdict(getattr(cfg, name)) for name in spec.sections}
    if stage == "curate":  # the executor and the URL mirror never change the documents
        config["data"] = {k: v for k, v in config["data"].items() if k not in PLACEMENT_KEYS}
        if not config["data"]["canaries"]:  # none planted: documents curated before the key stay current
            del config["data"]["canaries"]
    if stage == "tokenize":  # the loader's keys (mixture, stages, FIM) do not change the shards
        config["tokens"] = cfg.tokens.shard_settings()
    if stage == "train":
        config["tokens"] = cfg.tokens.loader_settings()
        config["code_sources"] = sorted(s.name for s in cfg.data.sources if s.code)  # FIM's default
    if spec.seeded:
        config["seed"] = cfg.run.seed
    if stage == "eval":
        config["seq_len"] = cfg.train.seq_len
    return config
