"""What a config change means for work already done: which keys can change a stage's result, what
changed since a stage ran, moving superseded outputs aside, and one writer per stage at a time.

A stage's cache key is its trajectory config: the resolved config of its sections minus the keys
that cannot change what it produces (logging, metric sinks, evaluation and checkpoint cadence, the
watchdog, progress, worker counts whose outputs are byte-identical). Changing only those resumes or
keeps the stage; changing any other key, or an upstream artifact, makes the stage's outputs stale.
What took compute to make (committed checkpoints, outputs that took more than a minute) is never
removed because of such a change: the command stops and names the keys, or, when asked to restart,
moves the old directory to RUN/superseded/ and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smelt.config.train import LAYOUT_KEYS
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS, MARKER, STAGE_DIRS

# Keys (per config section) that cannot change a stage's outputs or a training trajectory.
NEUTRAL_KEYS: dict[str, frozenset[str]] = {
    "data": frozenset({"workers"}),
    "tokens": frozenset({"workers", "mixture_window", "drift_tolerance", "prefetch"}),
    "model": frozenset({"activation_checkpointing"}),
    "train": frozenset(
        {
            "log_every",
            "eval_every",
            "eval_tokens",
            "eval_budget",
            "tensorboard",
            "wandb_project",
            "wandb_mode",
            "watchdog_s",
            "monitor_every",
            # Telemetry and the run-health alerts read the run and log; they never change it
            # (train/telemetry.py, train/health.py).
            "telemetry_every",
            "alert_val_regression",
            "alert_domain_rise",
            "alert_loader_wait",
            "alert_clip_rate",
            "alert_update_ratio_max",
            "alert_update_ratio_min",
            "alert_throughput_drop",
            "alert_moe_load",
            "grad_alert_factor",
            "threads",
            "straggler_ratio",
            # The pre-registered trajectory and its alert only compare and log (train/trajectory.py).
            "expect",
            "expect_tolerance_tokens",
            "keep_host_memory",
            "spike_triage",
            # Compiled kernels round differently from eager ones (as other thread counts may), but the
            # plan (data order, schedule, model) is the same, so switching it stops nothing.
            "compile",
            # Same arithmetic up to the kernels' reduction order, like compile.
            "deterministic",
            *LAYOUT_KEYS,
        }
    ),  # fmt: skip
    "checkpoint": frozenset(
        {
            "every_steps",
            "keep_last",
            "async_save",
            "milestone_every_steps",
            "milestone_every_tokens",
            "mtbf_hours",
        }
    ),
    "eval": frozenset(
        {
            "batch_size",
            "every_steps",
            "inloop_items",
            "inloop_tasks",
            "contamination_tasks",
            "contamination_items",
            "contamination_k",
            "contamination_inloop",
        }
    ),  # fmt: skip
}
# Work that took longer than this is moved aside, never deleted, when a change supersedes it.
COSTLY_S = 60.0
SUPERSEDED = "superseded"
LOCKS = ".locks"
# Stage directories a training run depends on: while train/ holds committed checkpoints they are
# costly too, so `smelt tokenizer train` or `smelt tokenize` moves them aside instead of replacing them.
TRAINING_INPUTS = (STAGE_DIRS["tokenizer"], STAGE_DIRS["tokenize"])


def trajectory_config(config: dict[str, Any]) -> dict[str, Any]:
    """A stage config (`{section: {key: value}}`) without the keys that cannot change its result.

    train.fork_data counts only for a fork (train.init_from); a fork recorded before the key existed
    read its data from the beginning, which is 'restart'."""
    out: dict[str, Any] = {}
    for section, values in config.items():
        neutral = NEUTRAL_KEYS.get(section, frozenset())
        if isinstance(values, dict):
            out[section] = {k: v for k, v in values.items() if k not in neutral}
        else:
            out[section] = values
    train = out.get("train")
    if isinstance(train, dict):
        if train.get("init_from"):
            train.setdefault("fork_data", "restart")
        else:
            train.pop("fork_data", None)
    return out


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Dotted keys whose value differs between two stage configs, neutral keys left out, as
    `key: old -> new` lines."""
    before, after = _flatten(trajectory_config(old)), _flatten(trajectory_config(new))
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key, "<unset>") != after.get(key, "<unset>"):
            lines.append(
                f"{key}: {_short(before.get(key, '<unset>'))} -> {_short(after.get(key, '<unset>'))}"
            )
    return lines


def _short(value: Any) -> str:
    text = (
        json.dumps(value, sort_keys=True, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    )
    return text if len(text) <= 60 else text[:57] + "..."


def changed_inputs(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The upstream artifacts whose content differs from what a stage consumed."""
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


# --- what took compute ------------------------------------------------------------------------


def committed_checkpoints(stage_dir: Path) -> int:
    folder = Path(stage_dir) / CHECKPOINTS
    if not folder.is_dir():
        return 0
    return sum(1 for p in folder.iterdir() if p.name.startswith("step_") and (p / MARKER).is_file())


def costly_work(
    stage_dir: Path, manifest: dict[str, Any] | None, attempt: dict[str, Any] | None
) -> str | None:
    """Why a stage directory must not be deleted (committed checkpoints, the tokenizer or tokens that
    train/'s committed checkpoints were trained with, more than a minute of work), or None when
    replacing it loses nothing that matters."""
    stage_dir = Path(stage_dir)
    if not stage_dir.exists() or stage_dir.is_symlink():
        return None
    checkpoints = committed_checkpoints(stage_dir)
    if checkpoints:
        return f"{checkpoints} committed checkpoint{'s' if checkpoints != 1 else ''}"
    if stage_dir.name in TRAINING_INPUTS:  # the checkpoints cannot be used or resumed without it
        trained = committed_checkpoints(stage_dir.parent / STAGE_DIRS["train"])
        if trained:
            plural = "s in train/ were" if trained != 1 else " in train/ was"
            return f"what the {trained} committed checkpoint{plural} trained with"
    seconds = float((manifest or {}).get("wall_time_s") or 0.0)
    if not manifest and attempt and attempt.get("started"):
        newest = max((p.stat().st_mtime for p in stage_dir.rglob("*") if p.is_file()), default=0.0)
        seconds = max(0.0, newest - float(attempt["started"]))
    if seconds > COSTLY_S:
        return f"{seconds / 60:.1f} minutes of work"
    return None


def move_aside(stage_dir: Path, run_dir: Path) -> Path | None:
    """Move a stage directory to RUN/superseded/<name>-<time>/ (a link to a parent run's directory is
    only unlinked); returns where it went."""
    stage_dir = Path(stage_dir)
    if stage_dir.is_symlink():
        stage_dir.unlink()
        return None
    if not stage_dir.exists():
        return None
    target_root = Path(run_dir) / SUPERSEDED
    target_root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target = target_root / f"{stage_dir.name}-{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = target_root / f"{stage_dir.name}-{stamp}-{n}"
    os.replace(stage_dir, target)
    return target


def replace_cheap(stage_dir: Path) -> None:
    """Remove a stage directory whose work is cheap to redo (or unlink a link to a parent's)."""
    stage_dir = Path(stage_dir)
    if stage_dir.is_symlink():
        stage_dir.unlink()
    elif stage_dir.exists():
        shutil.rmtree(stage_dir)


# --- one writer per stage ---------------------------------------------------------------------


@contextlib.contextmanager
def stage_lock(run_dir: Path, stage: str) -> Iterator[None]:
    """Hold RUN/.locks/<stage>.lock while a stage writes; a second command on the same stage of the
    same run directory stops with exit 2 naming the holder. The lock dies with its process; on every
    way out the file goes, then RUN/.locks/ and RUN itself where nothing else is in them (a fork that
    failed on its input leaves no stub behind)."""
    folder = Path(run_dir) / LOCKS
    created = not Path(run_dir).exists()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stage}.lock"
    handle = _locked(path, run_dir, stage)
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "command": " ".join(sys.argv[:6]),
                    "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                }
            )
        )
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while still held: a command waiting on it retries (_locked)
        handle.close()
        with contextlib.suppress(OSError):  # only when empty
            folder.rmdir()
            if created:
                Path(run_dir).rmdir()


def _locked(path: Path, run_dir: Path, stage: str) -> Any:
    """The lock file at `path`, opened and locked. A holder removes it as it lets go, so a command
    that locked the file just before it went retries on the new one (the path must still name it)."""
    while True:
        try:
            handle = open(path, "a+")  # noqa: SIM115 - held for the whole stage
        except FileNotFoundError:  # a holder letting go removed RUN/.locks/ just now
            path.parent.mkdir(parents=True, exist_ok=True)
            continue
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = _describe_holder(handle.read())
            handle.close()
            raise UserError(
                f"stage {stage!r} of {run_dir} is being written by another smelt command ({holder}). "
                f"Wait for it to finish or stop it; two commands writing one stage would corrupt it. "
                f"To run both, give the second its own run directory (--set run.name=...)."
            ) from None
        try:
            same = os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return handle
        handle.close()  # locked a file its holder had already removed: take the new one


def _describe_holder(text: str) -> str:
    try:
        info = json.loads(text)
    except ValueError:
        return "holder unknown"
    return (
        f"pid {info.get('pid')} on {info.get('host')}, `{info.get('command')}`, since {info.get('started')}"
    )
