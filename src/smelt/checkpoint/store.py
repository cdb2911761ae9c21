"""Checkpoints: `checkpoints/step_NNNNNNN/` written with torch.distributed.checkpoint (DCP).

Layout of one checkpoint directory:
    .metadata, __0_0.distcp   DCP files: {"model": ..., "optimizer": ...}
    train_state.pt            RNG states (torch CPU/CUDA) and anything not JSON-safe
    meta.json                 step, tokens, loader state, config + hash, model config, vocab size,
                              sha256 of every other file
    COMMITTED                 written last; a directory without it does not exist

Everything is written into a hidden temporary directory that is renamed into place, so a crash
leaves either nothing or a directory without its marker, which readers ignore.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.manifest import hash_file, write_json
from smelt.model.transformer import Transformer

MARKER = "COMMITTED"
META = "meta.json"
TRAIN_STATE = "train_state.pt"
_STEP_DIR = re.compile(r"^step_(\d{7,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


@contextlib.contextmanager
def _quiet_dcp() -> Iterator[None]:
    # DCP warns on every call that no process group exists; single-process use is intended here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        yield


def _checksums(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): hash_file(p)
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name not in (META, MARKER)
    }


def save_checkpoint(
    checkpoints_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoints_dir/step_{step:07d}/ and return its path.

    `meta` must be JSON-safe and should carry at least "model_config" (a ModelConfig or its dict) and
    "vocab_size" so that load_model can rebuild the model. `train_state` (RNG states, ...) goes
    through torch.save. Single process for now; under torchrun dcp.save is collective and only rank
    0 should write meta.json and the marker (left for the distributed issue).
    """
    checkpoints_dir = Path(checkpoints_dir)
    final = checkpoints_dir / step_dir_name(step)
    tmp = checkpoints_dir / f".tmp-{step_dir_name(step)}"
    if tmp.exists():
        shutil.rmtree(tmp)  # left over from a crash mid-save
    tmp.mkdir(parents=True)

    # get_state_dict keys optimizer state by parameter name (not position), the form that survives
    # DDP/FSDP wrapping and resharding.
    model_sd, optim_sd = get_state_dict(model, optimizer)
    with _quiet_dcp():
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=tmp)
    torch.save(train_state or {}, tmp / TRAIN_STATE)

    meta = dict(meta)
    if dataclasses.is_dataclass(meta.get("model_config")):
        meta["model_config"] = dataclasses.asdict(meta["model_config"])
    meta["step"] = step
    meta["checksums"] = _checksums(tmp)
    write_json(tmp / META, meta)

    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    (final / MARKER).write_text(f"{step}\n")
    return final


def list_checkpoints(checkpoints_dir: Path) -> list[Path]:
    """Committed checkpoint directories, oldest step first."""
    checkpoints_dir = Path(checkpoints_dir)
    if not checkpoints_dir.is_dir():
        return []
    found = [p for p in checkpoints_dir.iterdir() if _STEP_DIR.match(p.name) and (p / MARKER).is_file()]
    return sorted(found, key=lambda p: int(_STEP_DIR.match(p.name).group(1)))


def latest_checkpoint(checkpoints_dir: Path) -> Path | None:
    found = list_checkpoints(checkpoints_dir)
    return found[-1] if found else None


def prune_checkpoints(checkpoints_dir: Path, keep_last: int, protect: tuple[Path, ...] = ()) -> list[Path]:
    """Delete committed checkpoints beyond the keep_last newest, never those in `protect`."""
    protected = {Path(p).resolve() for p in protect}
    candidates = [p for p in list_checkpoints(checkpoints_dir) if p.resolve() not in protected]
    doomed = candidates[: max(0, len(candidates) - keep_last)]
    for path in doomed:
        # Remove the marker first: a half-deleted directory must not look like a checkpoint.
        (path / MARKER).unlink(missing_ok=True)
        shutil.rmtree(path)
    return doomed


def read_meta(checkpoint_dir: Path, verify: bool = True) -> dict[str, Any]:
    """meta.json of a committed checkpoint, after checking every file against its checksum."""
    checkpoint_dir = Path(checkpoint_dir)
    if not (checkpoint_dir / MARKER).is_file():
        raise UserError(
            f"{checkpoint_dir} is not a committed checkpoint (no {MARKER} marker): it was never finished "
            f"or is not a checkpoint directory. Pick another one, e.g. the latest under its parent."
        )
    try:
        meta = json.loads((checkpoint_dir / META).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"checkpoint {checkpoint_dir}: {META} is missing or unreadable ({exc}).") from exc
    if verify:
        for rel, digest in meta.get("checksums", {}).items():
            path = checkpoint_dir / rel
            if not path.is_file():
                raise UserError(
                    f"checkpoint {checkpoint_dir}: file {rel} is missing; the checkpoint is damaged."
                )
            if hash_file(path) != digest:
                raise UserError(
                    f"checkpoint {checkpoint_dir}: file {rel} does not match its sha256 in {META}; the "
                    f"checkpoint is corrupt. Use an earlier checkpoint or retrain from it."
                )
    return meta


def load_model(
    checkpoint_dir: Path, device: str | torch.device = "cpu"
) -> tuple[Transformer, dict[str, Any]]:
    """Rebuild the model from a checkpoint's meta.json and load its weights (checksums verified)."""
    checkpoint_dir = Path(checkpoint_dir)
    meta = read_meta(checkpoint_dir)
    model = Transformer(ModelConfig(**meta["model_config"]), int(meta["vocab_size"]))
    state = {"model": model.state_dict()}
    with _quiet_dcp():
        dcp.load(state, checkpoint_id=checkpoint_dir)  # loads in place into the module's tensors
    model.load_state_dict(state["model"])
    return model.to(device), meta


def load_training_state(
    checkpoint_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load weights and optimizer state into existing objects (for resuming); returns (meta, train_state)."""
    checkpoint_dir = Path(checkpoint_dir)
    meta = read_meta(checkpoint_dir)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optimizer": optim_sd}
    with _quiet_dcp():
        dcp.load(state, checkpoint_id=checkpoint_dir)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
    train_state = torch.load(checkpoint_dir / TRAIN_STATE, weights_only=False)
    return meta, train_state
