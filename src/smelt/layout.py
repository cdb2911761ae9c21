"""The layout of a run directory: where each stage writes, how checkpoint directories are named and
committed, and which checkpoint a `--checkpoint latest|all|STEP|DIR` argument means.

    RUN/documents/ tokenizer/ tokens/ train/ eval/      one directory per stage (STAGE_DIRS)
    RUN/train/checkpoints/step_NNNNNNN/                 one per saved step (step_dir_name)
        meta.json, COMMITTED                            the marker is written last: a directory
                                                        without it does not exist as a checkpoint

Only paths and names live here (no torch), so commands, reports and the pipeline can share them.
"""

from __future__ import annotations

import re
from pathlib import Path

from smelt.errors import UserError

STAGES = ("curate", "tokenizer", "tokenize", "train", "eval")
STAGE_DIRS = {
    "curate": "documents",
    "tokenizer": "tokenizer",
    "tokenize": "tokens",
    "train": "train",
    "eval": "eval",
}
CHECKPOINTS = "checkpoints"
MARKER = "COMMITTED"
META = "meta.json"
TOKENIZER_JSON = "tokenizer.json"  # the Hugging Face tokenizers file of a trained tokenizer
TOKENIZER_INFO = "smelt.json"  # its vocab size, special ids and hash (tokenizer/load.py reads it)
STEP_DIR = re.compile(r"^step_(\d{7,})$")


def stage_dir(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / STAGE_DIRS[stage]


def checkpoints_dir(run_dir: Path) -> Path:
    """RUN/train/checkpoints."""
    return stage_dir(run_dir, "train") / CHECKPOINTS


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def step_of(checkpoint_dir: Path) -> int:
    match = STEP_DIR.match(Path(checkpoint_dir).name)
    if match is None:
        raise UserError(
            f"{checkpoint_dir} is not a checkpoint directory (expected a name like step_0000100)."
        )
    return int(match.group(1))


def is_committed(checkpoint_dir: Path) -> bool:
    return (Path(checkpoint_dir) / MARKER).is_file()


def step_dirs(checkpoints: Path) -> list[Path]:
    """Every step_NNNNNNN directory, committed or not, oldest step first."""
    checkpoints = Path(checkpoints)
    if not checkpoints.is_dir():
        return []
    return sorted((p for p in checkpoints.iterdir() if STEP_DIR.match(p.name) and p.is_dir()), key=step_of)


def list_checkpoints(checkpoints: Path) -> list[Path]:
    """Committed checkpoint directories, oldest step first."""
    return [p for p in step_dirs(checkpoints) if is_committed(p)]


def latest_checkpoint(checkpoints: Path) -> Path | None:
    found = list_checkpoints(checkpoints)
    return found[-1] if found else None


def resolve_checkpoints(checkpoints: Path, which: str, allow_all: bool = True) -> list[Path]:
    """The committed checkpoints `which` names under `checkpoints`: `latest`, `all` (every retained
    one, oldest first; only where `allow_all`), a step number, or a committed checkpoint directory
    anywhere (e.g. an average written by `smelt checkpoint average`). A UserError otherwise."""
    checkpoints = Path(checkpoints)
    if which == "all" and allow_all:
        found = list_checkpoints(checkpoints)
    elif which == "latest":
        latest = latest_checkpoint(checkpoints)
        found = [latest] if latest else []
    elif is_committed(Path(which)):
        found = [Path(which)]
    else:
        try:
            step = int(which)
        except ValueError as exc:
            choices = "`latest`, `all`, a step number" if allow_all else "`latest`, a step number"
            raise UserError(f"--checkpoint {which!r} must be {choices} or a checkpoint directory.") from exc
        path = checkpoints / step_dir_name(step)
        if not is_committed(path):
            steps = [p.name for p in list_checkpoints(checkpoints)]
            raise UserError(
                f"checkpoint {path} does not exist or is incomplete. Retained: {', '.join(steps) or 'none'}; "
                f"or use `latest`{' / `all`' if allow_all else ''}."
            )
        found = [path]
    if not found:
        raise UserError(f"no committed checkpoint under {checkpoints}. Run `smelt train CONFIG` first.")
    return found
