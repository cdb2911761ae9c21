"""Stage orchestration: run the stages of a pipeline in order, skipping those that are up to date.

Each stage reads the artifacts of the stage before it and writes its own directory under the run
directory with a `manifest.json`. A stage is up to date when its config hash and its input hashes (the
raw files' content, or the output hashes of the stages it reads) match its manifest and its outputs are
intact; then it is skipped and its recorded result is reused.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt import layout
from smelt.config import Config
from smelt.errors import UserError
from smelt.layout import STAGE_DIRS, STAGES
from smelt.manifest import Stage, hash_file, hash_files, read_manifest, write_json
from smelt.progress import log
from smelt.run.lifecycle import (
    changed_inputs,
    changed_keys,
    costly_work,
    move_aside,
    replace_cheap,
    stage_lock,
    trajectory_config,
)
from smelt.run.stages import STAGE_SPECS, STAGE_TABLE, stage_config
from smelt.tokens.drop_list import DROP_LIST, drop_inputs

# Written when a stage starts and removed when it ends: an interrupted stage resumes only when the
# attempt it would continue had the same config and inputs.
ATTEMPT = "attempt.json"


@dataclass
class StageOutcome:
    stage: str
    directory: Path
    skipped: bool
    wall_time_s: float
    result: dict[str, Any]


def stage_dir(cfg: Config, stage: str) -> Path:
    return layout.stage_dir(cfg.run_dir, stage)


def _stage_config(cfg: Config, stage: str) -> dict[str, Any]:
    return stage_config(cfg, stage)


def _stage_inputs(cfg: Config, stage: str) -> dict[str, str]:
    if stage == "curate":
        from smelt.data.curate import resolve_sources
        from smelt.storage import StoreFile, listing_hash

        inputs = {}
        for source, files in resolve_sources(cfg.data).items():
            if files and isinstance(files[0], StoreFile):  # a store's files, by the versions it lists
                inputs[f"raw:{source}"] = listing_hash(files)
                continue
            root = Path(_common_root(files))
            inputs[f"raw:{source}"] = hash_files(files, root)
        return inputs
    inputs = {}
    for upstream in STAGE_SPECS[stage].inputs:
        manifest = read_manifest(stage_dir(cfg, upstream))
        if manifest is None:
            raise UserError(
                f"stage {stage!r} needs the output of stage {upstream!r}, but {stage_dir(cfg, upstream)} "
                f"has no manifest.json. Run `smelt run CONFIG` (or the {upstream!r} stage) first."
            )
        inputs[upstream] = manifest["outputs_hash"]
    if stage == "tokenize":  # documents on the run's drop list are left out (tokens/drop_list.py)
        inputs.update(drop_inputs(cfg.run_dir))
    return inputs


def _common_root(files: list[Path]) -> str:
    return os.path.commonpath([str(f.parent) for f in files]) if files else "."


def _wait_for_attempt(directory: Path, attempt: dict[str, Any], timeout_s: float = 600.0) -> None:
    deadline = time.time() + timeout_s
    # Rank 0 writes the attempt with its start time added; the rest must match what this rank expects.
    while {k: v for k, v in (_read_attempt(directory) or {}).items() if k in attempt} != attempt:
        if time.time() > deadline:
            raise RuntimeError(f"rank 0 did not prepare {directory} within {timeout_s:.0f} s")
        time.sleep(0.2)


def _read_attempt(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / ATTEMPT).read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Assessment:
    """What running a stage now would do to its directory."""

    spec: Stage
    action: str  # "skip", "resume", "run", "link"
    changes: list[str]  # trajectory keys and inputs that differ from what the directory holds
    costly: str | None  # why the directory's contents must not be deleted
    link_to: Path | None = None


def fork_parent(cfg: Config) -> Any:
    """The parent checkpoint of a fork (train.init_from), or None."""
    if not cfg.train.init_from:
        return None
    from smelt.checkpoint.lineage import resolve_parent

    return resolve_parent(cfg.train.init_from)


def _stage_spec(cfg: Config, stage: str) -> Stage:
    return Stage(
        stage, stage_dir(cfg, stage), trajectory_config(_stage_config(cfg, stage)), _stage_inputs(cfg, stage),
        cfg.run.seed,
    )  # fmt: skip


def _outputs_intact(directory: Path, manifest: dict[str, Any]) -> bool:
    return all(
        (directory / rel).is_file() and hash_file(directory / rel) == digest
        for rel, digest in manifest.get("outputs", {}).items()
    )


def _differences(recorded: dict[str, Any] | None, spec: Stage) -> list[str] | None:
    """Changed trajectory keys and inputs against a manifest or attempt record; None when the record
    cannot say (none, or written before configs were recorded)."""
    if not recorded:
        return None
    if "config" not in recorded:  # an attempt recorded by hash only: equal hashes and inputs say enough
        same = recorded.get("config_hash") == spec.config_hash and recorded.get("inputs") == spec.inputs
        return [] if same else None
    changes = changed_keys(recorded["config"], spec.config)
    changes += [f"input {name} changed" for name in changed_inputs(recorded.get("inputs", {}), spec.inputs)]
    return changes


def assess(cfg: Config, stage: str, force: bool = False, parent: Any = None) -> Assessment:
    """Decide whether a stage is skipped, resumed, run afresh or linked from a fork's parent."""
    directory = stage_dir(cfg, stage)
    spec = _stage_spec(cfg, stage)
    manifest = spec.read_manifest()
    attempt = _read_attempt(directory) if manifest is None else None
    if parent is not None and STAGE_SPECS[stage].linkable:
        linked = _assess_link(cfg, stage, spec, parent)
        if linked is not None:
            return linked
    if manifest is not None:
        changes = _differences(manifest, spec)
        if changes == [] and not force and _outputs_intact(directory, manifest):
            return Assessment(spec, "skip", [], None)
        if changes is None:
            changes = ["its manifest predates recorded configs"]
        elif not changes:
            changes = ["--force" if force else "its outputs are damaged or incomplete"]
        return Assessment(spec, "run", changes, costly_work(directory, manifest, None))
    if not directory.exists() and not directory.is_symlink():
        return Assessment(spec, "run", [], None)
    changes = _differences(attempt, spec)
    if changes == [] and STAGE_SPECS[stage].resumable:
        return Assessment(spec, "resume", [], None)
    if changes is None:
        changes = ["an interrupted attempt whose config was not recorded"]
    elif not changes:
        changes = [f"stage {stage!r} cannot resume an interrupted attempt"]
    return Assessment(spec, "run", changes, costly_work(directory, None, attempt))


def _assess_link(cfg: Config, stage: str, spec: Stage, parent: Any) -> Assessment | None:
    """A fork reuses its parent's tokenizer always, and its documents and token shards when its own
    config would make the same ones."""
    directory, source = stage_dir(cfg, stage), parent.run_dir / STAGE_DIRS[stage]
    if directory.is_symlink() and directory.resolve() == source.resolve():
        return (
            Assessment(spec, "skip", [], None)
            if stage == "tokenizer" or _parent_matches(source, spec)
            else None
        )
    if directory.exists():
        if stage == "tokenizer":
            own, theirs = read_manifest(directory) or {}, read_manifest(source) or {}
            if own.get("outputs_hash") != theirs.get("outputs_hash"):
                raise UserError(
                    f"{directory} holds a tokenizer other than the parent's ({source}); a fork trains with "
                    f"its parent's tokenizer. Use a new run directory (--set run.name=...) for the fork."
                )
            return Assessment(spec, "skip", [], None)
        return None
    if stage == "tokenizer" or _parent_matches(source, spec):
        if read_manifest(source) is None:
            raise UserError(f"the fork's parent has no finished {STAGE_DIRS[stage]}/ ({source}).")
        return Assessment(spec, "link", [], None, link_to=source)
    return None


def _link_from_parent(cfg: Config, parent: Any, rank: int, timeout_s: float = 120.0) -> None:
    """Before a fork's own stages run: take the parent's tokenizer, and its documents and shards where
    this config would make the same ones (a fork with new data makes its own: `smelt run`)."""
    for stage in (spec.name for spec in STAGE_TABLE if spec.linkable):
        directory = stage_dir(cfg, stage)
        if rank != 0:  # rank 0 makes the links; the others wait for them
            deadline = time.time() + timeout_s
            while not directory.exists() and time.time() < deadline:
                time.sleep(0.2)
            continue
        if directory.exists() or directory.is_symlink():
            continue
        try:
            found = assess(cfg, stage, False, parent)
        except UserError:
            return  # an upstream of it is missing too; the stage's own check names it
        if found.action != "link":
            return
        directory.parent.mkdir(parents=True, exist_ok=True)
        directory.symlink_to(found.link_to.resolve(), target_is_directory=True)
        log(f"[{stage}] taken from the parent run: {directory} -> {found.link_to}")


def _parent_matches(source: Path, spec: Stage) -> bool:
    manifest = read_manifest(source)
    return manifest is not None and _differences(manifest, spec) == []


def stale_upstream(cfg: Config, stage: str, parent: Any = None) -> list[str]:
    """Upstream stages of `stage` whose outputs no longer match the config or the artifacts they were
    made from, as lines naming what changed (raw files are not rehashed: `smelt curate` does that)."""
    seen: set[str] = set()
    todo = list(STAGE_SPECS[stage].inputs)
    while todo:
        upstream = todo.pop()
        if upstream not in seen:
            seen.add(upstream)
            todo.extend(STAGE_SPECS[upstream].inputs)
    closure = [s for s in STAGES if s in seen]
    lines = []
    for upstream in closure:
        if parent is not None and upstream == "tokenizer":
            continue  # a fork's tokenizer is its parent's, whatever [tokenizer] says
        manifest = read_manifest(stage_dir(cfg, upstream))
        if manifest is None:
            continue  # _stage_inputs names a missing upstream with its own message
        recorded = manifest.get("config")
        if recorded is not None:
            for change in changed_keys(recorded, trajectory_config(_stage_config(cfg, upstream))):
                lines.append(f"{STAGE_DIRS[upstream]}/ was made with another config: {change}")
        if upstream != "curate":
            current = _stage_inputs(cfg, upstream)
            for name in changed_inputs(manifest.get("inputs", {}), current):
                what = f"{STAGE_DIRS[name]}/" if name in STAGE_DIRS else DROP_LIST  # the run's drop list
                lines.append(
                    f"{STAGE_DIRS[upstream]}/ was made from an older {what} ({name} has changed since)"
                )
    return lines


def _must_stop(stage: str, found: Assessment, restart: bool) -> bool:
    """A changed plan stops only for training with committed checkpoints or real work: its weights
    cannot be remade from the new config. Other costly outputs (curated documents, shards, eval
    results) are moved aside and remade."""
    return stage == "train" and found.action == "run" and found.costly is not None and not restart


def _stop_for_costly(cfg: Config, stage: str, found: Assessment) -> UserError:
    directory = stage_dir(cfg, stage)
    what = "\n  ".join(found.changes) or "(unknown)"
    ways = (
        f"fork a new run from its checkpoint, which keeps the weights and follows the new plan "
        f"(`smelt train CONFIG --from {cfg.run_dir} --set run.name=NEW_NAME`), or pass --restart to move "
        f"{directory.name}/ to {cfg.run_dir / 'superseded'}/ and start over from step 0"
    )
    return UserError(
        f"{directory} holds {found.costly} made under a different plan; nothing was changed or deleted. "
        f"What differs:\n  {what}\nTo continue the existing work, undo these changes (logging, sinks, eval "
        f"and checkpoint cadence may change freely). Otherwise {ways}."
    )


def run_stage(
    cfg: Config, stage: str, force: bool = False, restart: bool = False, check_upstream: bool = False
) -> StageOutcome:
    """Run one stage unless it is up to date (or `force`); return its result either way.

    A change of trajectory keys or inputs reruns a stage whose earlier output is cheap to remake; one
    that holds committed checkpoints or more than a minute of work stops with exit 2 unless `restart`
    (or `force`), and is then moved to RUN/superseded/, never deleted. `check_upstream` (single-stage
    commands) first refuses stale upstream artifacts.
    """
    rank = int(os.environ.get("RANK", "0"))
    lock = stage_lock(cfg.run_dir, stage) if rank == 0 else contextlib.nullcontext()
    with lock:
        return _run_stage_locked(cfg, stage, force, restart, check_upstream, rank)


def _run_stage_locked(
    cfg: Config, stage: str, force: bool, restart: bool, check_upstream: bool, rank: int
) -> StageOutcome:
    directory = stage_dir(cfg, stage)
    parent = fork_parent(cfg)
    if check_upstream:
        stale = stale_upstream(cfg, stage, parent)
        if stale:
            raise UserError(
                f"`{STAGE_SPECS[stage].command}` would use stale inputs:\n  "
                + "\n  ".join(stale)
                + "\nRefresh them first (`smelt run CONFIG` reruns every stale stage in order), or undo the "
                "config change."
            )
    if parent is not None and not STAGE_SPECS[stage].linkable:
        _link_from_parent(cfg, parent, rank)
    found = assess(cfg, stage, force, parent)  # --restart replaces changed work; it never reruns the rest
    spec = found.spec
    if found.action == "skip":
        manifest = spec.read_manifest() or {}
        log(f"[{stage}] up to date, skipped ({directory})")
        return StageOutcome(stage, directory, True, 0.0, manifest.get("result", {}))
    if found.action == "link":
        if rank == 0:
            directory.parent.mkdir(parents=True, exist_ok=True)
            directory.symlink_to(found.link_to.resolve(), target_is_directory=True)
        log(f"[{stage}] taken from the parent run: {directory} -> {found.link_to}")
        return StageOutcome(stage, directory, True, 0.0, (read_manifest(directory) or {}).get("result", {}))
    if rank == 0 and _must_stop(stage, found, force or restart):
        raise _stop_for_costly(cfg, stage, found)
    log(f"[{stage}] {'resuming' if found.action == 'resume' else 'running'} -> {directory}")
    attempt = {"config_hash": spec.config_hash, "inputs": spec.inputs, "config": spec.config}
    if rank == 0:
        if found.action == "run" and (directory.exists() or directory.is_symlink()):
            if found.costly:
                moved = move_aside(directory, cfg.run_dir)
                log(f"[{stage}] previous output ({found.costly}) moved to {moved}, not deleted")
            else:
                replace_cheap(directory)  # stale outputs would otherwise leak into the output hashes
                if found.changes:
                    log(f"[{stage}] rerunning: " + "; ".join(found.changes[:6]))
        directory.mkdir(parents=True, exist_ok=True)
        write_json(directory / ATTEMPT, {**attempt, "started": time.time()})
    else:  # under torchrun: rank 0 prepares the directory; the attempt file says it is ready
        _wait_for_attempt(directory, attempt)
    started = time.time()
    result = STAGE_SPECS[stage].run(cfg, directory, found.action == "resume")
    if rank != 0:
        return StageOutcome(stage, directory, False, round(time.time() - started, 3), result)
    (directory / ATTEMPT).unlink()
    extra: dict[str, Any] = {"result": result, "settings": _stage_config(cfg, stage)}
    if parent is not None and stage == "train":
        extra["parent"] = parent.record()
    manifest = spec.write_manifest(started, extra=extra)
    log(f"[{stage}] done in {manifest['wall_time_s']:.1f}s")
    return StageOutcome(stage, directory, False, manifest["wall_time_s"], result)


def preflight(cfg: Config, stages: tuple[str, ...], force: bool = False, restart: bool = False) -> None:
    """Before `smelt run` changes anything: stop when some stage would have to replace costly work
    (its own config changed, or an upstream stage will rerun) and neither --restart nor --force is given."""
    if force or restart:
        return
    parent = fork_parent(cfg)
    rerunning: list[str] = []
    for stage in STAGES:
        if stage not in stages:
            continue
        upstream = [u for u in STAGE_SPECS[stage].inputs if u in rerunning]
        directory = stage_dir(cfg, stage)
        try:
            found = assess(cfg, stage, False, parent)
        except UserError:
            if upstream or not (directory.exists() or directory.is_symlink()):
                rerunning.append(stage)
                continue
            raise
        if upstream and found.action in ("skip", "resume"):
            manifest = read_manifest(directory)
            found = Assessment(
                found.spec, "run", [f"{u} will rerun" for u in upstream],
                costly_work(directory, manifest, _read_attempt(directory)),
            )  # fmt: skip
        if found.action == "run":
            rerunning.append(stage)
            if _must_stop(stage, found, False):
                raise _stop_for_costly(cfg, stage, found)


def run_pipeline(
    cfg: Config,
    stages: tuple[str, ...] = STAGES,
    force: bool = False,
    on_stage: Callable[[StageOutcome], None] | None = None,
    restart: bool = False,
) -> dict[str, StageOutcome]:
    """Run `stages` in pipeline order. A stage that reruns makes every later stage rerun too (their
    inputs changed), which the input hashes guarantee; costly work in the way stops the run first."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    preflight(cfg, stages, force, restart)
    write_json(cfg.run_dir / "config.json", cfg.to_dict())
    outcomes: dict[str, StageOutcome] = {}
    for stage in STAGES:
        if stage not in stages:
            continue
        outcome = run_stage(cfg, stage, force=force, restart=restart)
        outcomes[stage] = outcome
        if on_stage:
            on_stage(outcome)
    return outcomes
