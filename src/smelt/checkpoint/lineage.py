"""Forks: a new run that starts from another run's committed checkpoint.

`train.init_from` (or `smelt train CONFIG --from ...`) names the parent as a run directory (its
newest valid checkpoint), `RUN:STEP`, a checkpoints folder, or one `step_NNNNNNN` directory. The child
loads the parent's weights (and, with `train.init_optimizer`, its AdamW moments) and then follows its
own plan from step 0: its own schedule, mixture, data, sequence length and layout. What it records
about the parent (run, checkpoint, step, tokens, config hash, cumulative token offset) is the lineage
that reports draw curves and trees from.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

from smelt.checkpoint.store import (
    _dcp_load,
    latest_valid_checkpoint,
    load_training_state,
    read_meta,
    step_dir_name,
    step_of,
)
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS, MARKER, checkpoints_dir

# Keys that fix the shapes of the weights; a fork may change anything else (RoPE, sequence length, ...).
SHAPE_KEYS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "tie_embeddings", "qk_norm", "mlp",
              "value_embeddings")  # fmt: skip
_STEP_SUFFIX = re.compile(r"^(.*):(\d+|latest)$")


@dataclass(frozen=True)
class Parent:
    """A committed checkpoint another run starts from."""

    run_dir: Path
    checkpoint: Path
    step: int
    tokens: int
    config_hash: str | None
    tokens_offset: int  # the parent's own cumulative offset: a fork of a fork draws at the right place

    @property
    def cumulative_tokens(self) -> int:
        return self.tokens_offset + self.tokens

    def record(self) -> dict[str, Any]:
        out = asdict(self)
        out["run_dir"], out["checkpoint"] = str(self.run_dir), str(self.checkpoint)
        out["cumulative_tokens"] = self.cumulative_tokens
        return out


def resolve_parent(spec: str) -> Parent:
    """`RUN`, `RUN:STEP`, `RUN/train/checkpoints[:STEP]` or `.../step_NNNNNNN` -> the parent checkpoint."""
    text = spec.strip()
    step: int | None = None
    match = _STEP_SUFFIX.match(text)
    if match and not Path(text).exists():
        text = match.group(1)
        step = None if match.group(2) == "latest" else int(match.group(2))
    path = Path(text)
    if (path / MARKER).is_file() or path.name.startswith("step_"):
        checkpoint = path
    else:
        folder = next((c for c in (checkpoints_dir(path), path / CHECKPOINTS, path) if c.is_dir()), None)
        if folder is None or not any(p.name.startswith("step_") for p in folder.iterdir()):
            raise UserError(
                f"train.init_from = {spec!r}: {path} is not a run directory with committed checkpoints "
                f"(no train/checkpoints/step_NNNNNNN/). Name a run directory, RUN:STEP, or a step_NNNNNNN "
                f"checkpoint directory."
            )
        if step is None:
            found, _ = latest_valid_checkpoint(folder)
            if found is None:
                raise UserError(f"train.init_from = {spec!r}: no valid committed checkpoint under {folder}.")
            checkpoint = found
        else:
            checkpoint = folder / step_dir_name(step)
            if not checkpoint.is_dir():
                steps = sorted(step_of(p) for p in folder.iterdir() if (p / MARKER).is_file())
                raise UserError(
                    f"train.init_from = {spec!r}: no checkpoint at step {step} under {folder}; committed "
                    f"steps: {', '.join(map(str, steps)) or 'none'}."
                )
    meta = read_meta(checkpoint, verify=True)
    if meta.get("weights_only") and "tokens" not in meta:
        meta.setdefault("tokens", 0)
    run_dir = checkpoint.resolve().parent.parent.parent
    if not (run_dir / "tokenizer").is_dir():
        raise UserError(
            f"train.init_from = {spec!r}: {checkpoint} is not inside a run directory "
            f"(RUN/train/checkpoints/step_NNNNNNN with RUN/tokenizer beside it); a fork trains with its "
            f"parent's tokenizer, so it needs the parent run."
        )
    run_manifest = _read_json(run_dir / "train" / "run.json")
    grand = run_manifest.get("parent") or {}
    return Parent(
        run_dir=run_dir,
        checkpoint=checkpoint.resolve(),
        step=int(meta["step"]),
        tokens=int(meta.get("tokens", 0)),
        config_hash=meta.get("config_hash") or run_manifest.get("config_hash"),
        tokens_offset=int(grand.get("cumulative_tokens", 0)),
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def check_fits(parent: Parent, model_config: dict[str, Any], vocab_size: int) -> None:
    """A UserError naming every shape key where the child model cannot take the parent's weights."""
    meta = read_meta(parent.checkpoint, verify=False)
    saved = meta.get("model_config") or {}
    problems = [
        f"model.{key}: parent {saved[key]!r}, this run {model_config.get(key)!r}"
        for key in SHAPE_KEYS
        if key in saved and saved[key] != model_config.get(key)
    ]
    if meta.get("vocab_size") != vocab_size:
        problems.append(f"vocab size: parent {meta.get('vocab_size')}, this run {vocab_size}")
    if problems:
        raise UserError(
            f"the fork's model cannot take the weights of {parent.checkpoint}: {'; '.join(problems)}. "
            f"A fork keeps its parent's shapes and tokenizer; change only schedule, data, sequence length, "
            f"RoPE or layout keys."
        )


def load_parent(
    parent: Parent, model: torch.nn.Module, optimizer: torch.optim.Optimizer, with_optimizer: bool
) -> None:
    """Load the parent's weights (and its optimizer moments) into the child's (possibly wrapped) model.
    Every rank calls this; DCP reads the shards each rank needs."""
    if with_optimizer:
        meta = read_meta(parent.checkpoint, verify=False)
        if meta.get("weights_only"):
            raise UserError(
                f"{parent.checkpoint} holds weights only (e.g. an average): set train.init_optimizer = false "
                f"to fork from it."
            )
        load_training_state(parent.checkpoint, model, optimizer)
        return
    state = {"model": get_model_state_dict(model)}
    _dcp_load(state, parent.checkpoint)
    set_model_state_dict(model, state["model"])
