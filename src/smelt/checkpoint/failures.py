"""What a failed checkpoint save becomes: a CheckpointSaveError that says what happened in plain words
(a full disk as "no space left on device", with what the checkpoint needs and what is free), which
checkpoint is still good and what to run next, and a `checkpoint_failed` record for metrics.jsonl.
A save failure is a failure while running (exit 1), never bad input (exit 2): the supervisor
(`--max-restarts`) retries it.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.distributed.checkpoint.api import CheckpointException

from smelt.layout import step_dir_name

# What a failing write raises: OSError from plain writes, RuntimeError from torch's serializer (a short
# write), CheckpointException when DCP wraps a rank's error.
SAVE_ERRORS = (OSError, RuntimeError, CheckpointException)
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be written (a full disk, a failing filesystem).

    A failure while running (exit 1, which `--max-restarts` retries once space is freed), not bad
    input: the config is fine and the same command succeeds on storage with room.
    """

    def __init__(
        self,
        message: str,
        step: int,
        checkpoints_dir: Path,
        error: str,
        disk_full: bool,
        needed_bytes: int | None,
        free_bytes: int | None,
        previous: Path | None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.checkpoints_dir = checkpoints_dir
        self.error = error
        self.disk_full = disk_full
        self.needed_bytes = needed_bytes
        self.free_bytes = free_bytes
        self.previous = previous

    def event(self, tokens: int | None) -> dict[str, Any]:
        """The `checkpoint_failed` record for metrics.jsonl."""
        return {
            "kind": "event", "step": self.step, "tokens": tokens, "event": "checkpoint_failed",
            "path": str(self.checkpoints_dir / step_dir_name(self.step)), "error": self.error,
            "disk_full": self.disk_full, "needed_mb": _mb(self.needed_bytes), "free_mb": _mb(self.free_bytes),
            "previous": self.previous.name if self.previous is not None else None, "message": str(self),
        }  # fmt: skip


def _mb(n: int | None) -> float | None:
    return None if n is None else round(n / 1e6, 1)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, its causes and contexts, and the per-rank failures DCP wrapped, each once."""
    seen: set[int] = set()
    stack: list[Any] = [exc]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):  # DCP's (exception, traceback) pairs
            item = item[0] if item else None
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        stack += [item.__cause__, item.__context__]
        if isinstance(item, CheckpointException):
            stack += list(item.failures.values())


def _root_message(exc: BaseException) -> str:
    if isinstance(exc, CheckpointException):
        causes = [str(e[0] if isinstance(e, tuple) else e) for e in exc.failures.values()]
        return "; ".join(causes) or "a rank failed to write its files"
    return str(exc) or type(exc).__name__


def state_nbytes(state: Any) -> int:
    """Bytes of the tensors in a (nested) state dict: about what one checkpoint takes on disk."""
    leaves: Iterable[Any] = pytree.tree_leaves(state)
    return sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor))


def _free_bytes(directory: Path) -> int | None:
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def save_failed(
    exc: BaseException,
    step: int,
    checkpoints_dir: Path,
    needed_bytes: int | None = None,
    previous: Path | None = None,
) -> CheckpointSaveError:
    """The error a failed write becomes, once its unfinished files are removed (so the free space it
    reports is what the user has); `previous` is the newest committed checkpoint, still intact.

    A full disk shows as OSError(ENOSPC) from a plain write, but torch's serializer reports a short
    write as a RuntimeError ("unexpected pos ...") with the errno lost; so free space below what the
    checkpoint needs counts as a full disk too.
    """
    checkpoints_dir = Path(checkpoints_dir)
    free = _free_bytes(checkpoints_dir)
    no_space = any(isinstance(e, OSError) and e.errno in _NO_SPACE for e in _chain(exc))
    short = needed_bytes is not None and free is not None and free < needed_bytes
    disk_full = no_space or short
    intact = (
        f"the previous checkpoint {previous.name} is intact" if previous else "no earlier checkpoint exists"
    )
    error = _root_message(exc)
    if disk_full:
        room = f"{_mb(free):,} MB free" if free is not None else "free space unknown"
        need = f"needs ~{_mb(needed_bytes):,} MB, " if needed_bytes is not None else ""
        what = f"no space left on device at {checkpoints_dir} ({need}{room})"
        fix = "Free disk space (or set run.dir to a disk with room)"
    else:
        what = f"{error} (writing under {checkpoints_dir})"
        fix = "Fix the storage (permissions, a failing or full filesystem)"
    message = (
        f"saving the checkpoint of step {step} failed: {what}. Nothing partial was committed (the "
        f"unfinished files were removed) and {intact}. {fix}, then run the same `smelt train CONFIG` or "
        f"`smelt run CONFIG` again: an interrupted train stage resumes from its newest valid checkpoint "
        f"(`--max-restarts N` relaunches it on its own; `--resume-from STEP` picks an earlier checkpoint)."
    )
    return CheckpointSaveError(message, step, checkpoints_dir, error, disk_full, needed_bytes, free, previous)
