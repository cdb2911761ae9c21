"""Checkpoints from inside the training loop: snapshot, background write, commit, retention.

With `checkpoint.async_save` the copy to host memory (DCP's stager, into buffers reused from save to
save) runs on a background thread while the next step's forward and backward passes run, which only
read the weights; the loop blocks only if the copy is not finished when the optimizer is about to
change them (`before_update`). The write, the checksums, the commit and pruning then run on another
background thread (under torchrun over a separate gloo group, so checkpoint collectives never
interleave with the training ones). A save that finds the previous one still writing waits for it
and says so in metrics.jsonl. Every finished save becomes an event with its stall and write times.
A save that fails (a full disk) removes its unfinished files and raises CheckpointSaveError, from
save() when synchronous, else from the next poll(), wait() or save().
"""

from __future__ import annotations

import shutil
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.utils._pytree as pytree
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from smelt.checkpoint.failures import SAVE_ERRORS, save_failed, state_nbytes
from smelt.checkpoint.store import (
    _is_main,
    _quiet_dcp,
    commit,
    discard_partial,
    latest_checkpoint,
    model_optim_state,
    prepare_tmp,
    prune_checkpoints,
    save_checkpoint,
    step_dir_name,
    write_rank_state,
)

# dcp.async_save runs dcp.save on DCP's own thread after async_save has returned, so the
# warnings.catch_warnings of _quiet_dcp around the call no longer holds there; without a process group
# that save warns on every checkpoint that it assumes "the intent is to save in a single process",
# which is exactly the intent. This filter matches that one message from DCP and nothing else.
warnings.filterwarnings(
    "ignore",
    message="torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to save",
    category=UserWarning,
    module=r"torch\.distributed\.checkpoint",
)


@dataclass
class _Pending:
    step: int
    tokens: int
    started: float
    stall_s: float
    milestone: bool
    staged: Future
    done: Future


# PyTorch 2.11's DefaultStager closes its state-dict stager at the end of every stage, so a second
# async_save through the same stager fails with KeyError: <class 'type'> (pytorch/pytorch#183413; 2.13
# keeps it open). There each save gets a new stager, and pinned host buffers are allocated anew.
STAGER_REUSABLE = (
    not (2, 11) <= tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 13)
)


def staging_options(device_type: str) -> StagingOptions:
    """How an async save copies tensors to the host: CUDA tensors into pinned buffers with
    non-blocking copies (the copy overlaps the next step's kernels), others by plain copies."""
    cuda = device_type == "cuda"
    return StagingOptions(
        use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=cuda
    )


class Checkpointer:
    """Saves for one run directory; every rank makes one and calls save/poll/wait in the same order."""

    def __init__(
        self,
        checkpoints_dir: Path,
        keep_last: int,
        async_save: bool = True,
        milestone_every_steps: int = 0,
        milestone_every_tokens: int = 0,
    ) -> None:
        self.dir = Path(checkpoints_dir)
        self.keep_last = keep_last
        self.async_save = async_save
        self.milestone_every_steps = milestone_every_steps
        self.milestone_every_tokens = milestone_every_tokens
        distributed = dist.is_initialized() and dist.get_world_size() > 1
        # DCP's async path plans and gathers over a CPU-capable group of its own (new_group is collective).
        self.group = dist.new_group(backend="gloo") if async_save and distributed else None
        self.pending: _Pending | None = None
        self.stager: DefaultStager | None = None
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smelt-checkpoint")
        if _is_main() and self.dir.is_dir():
            for stale in self.dir.glob(".tmp-step_*"):  # partial saves of a crashed run, never committed
                shutil.rmtree(stale, ignore_errors=True)

    def is_milestone(self, step: int, tokens: int, batch_tokens: int) -> bool:
        """Milestones (every N steps or X tokens) are kept forever, whatever keep_last says."""
        by_steps = self.milestone_every_steps > 0 and step % self.milestone_every_steps == 0
        every = self.milestone_every_tokens
        by_tokens = every > 0 and tokens // every > max(tokens - batch_tokens, 0) // every
        return by_steps or by_tokens

    def save(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        meta: dict[str, Any],
        rank_state: dict[str, Any],
        batch_tokens: int,
    ) -> list[dict[str, Any]]:
        """Start (async) or do (sync) the save of `step`; returns events of saves that finished meanwhile."""
        events: list[dict[str, Any]] = []
        backlog = self.pending is not None and not self.pending.done.done()
        waited = time.perf_counter()
        events += self.wait()
        if backlog:
            waited = time.perf_counter() - waited
            events.append({
                "kind": "event", "step": step, "tokens": meta.get("tokens"), "event": "alert",
                "alert": "checkpoint_backlog", "action": "wait", "value": waited, "threshold": 0.0,
                "message": f"the previous checkpoint was still being written at step {step}; waited "
                f"{waited:.2f} s (save less often or on faster storage)",
            })  # fmt: skip
        tokens = int(meta.get("tokens", 0))
        milestone = self.is_milestone(step, tokens, batch_tokens)
        meta = {**meta, "milestone": milestone}
        started = time.perf_counter()
        if not self.async_save:
            path = save_checkpoint(self.dir, step, model, optimizer, meta, rank_state)
            elapsed = time.perf_counter() - started
            if _is_main():
                self._prune(path)
            events.append(self._event(step, tokens, path, elapsed, elapsed, milestone, asynchronous=False))
            return events
        tmp = prepare_tmp(self.dir, step)
        # Fresh containers now (the copy thread then sees no later change to step counts or LR
        # values); the tensors themselves are copied in the background until before_update.
        state = pytree.tree_map(lambda leaf: leaf, model_optim_state(model, optimizer))
        needed = state_nbytes(state)
        try:
            write_rank_state(tmp, rank_state)
            with _quiet_dcp():
                response = dcp.async_save(
                    state, checkpoint_id=tmp, process_group=self.group, async_stager=self._stager(model)
                )
        except SAVE_ERRORS as exc:
            discard_partial(tmp, step)
            raise save_failed(exc, step, self.dir, needed, latest_checkpoint(self.dir)) from exc
        stall = time.perf_counter() - started
        done = self.worker.submit(self._finish, response.upload_completion, tmp, step, meta, needed)
        self.pending = _Pending(step, tokens, started, stall, milestone, response.staging_completion, done)
        return events

    def _stager(self, model: torch.nn.Module) -> DefaultStager:
        if self.stager is not None and not STAGER_REUSABLE:
            self.stager.close()
            self.stager = None
        if self.stager is None:
            self.stager = DefaultStager(staging_options(next(model.parameters()).device.type))
        return self.stager

    def before_update(self) -> None:
        """Call before anything changes weights or optimizer state: waits for the host copy if needed."""
        if self.pending is None or self.pending.staged.done():
            return
        waited = time.perf_counter()
        self.pending.staged.result()
        self.pending.stall_s += time.perf_counter() - waited

    def _finish(
        self, written: Future, tmp: Path, step: int, meta: dict[str, Any], needed: int
    ) -> tuple[Path, float]:
        try:
            written.result()
            # Rank 0's write ends after DCP gathered every rank's write results, so all shards are on disk.
            path = commit(tmp, step, meta) if _is_main() else self.dir / step_dir_name(step)
        except SAVE_ERRORS as exc:
            if _is_main():
                discard_partial(tmp, step)
            raise save_failed(exc, step, self.dir, needed, latest_checkpoint(self.dir)) from exc
        finished = time.perf_counter()
        if _is_main():
            self._prune(path)
        return path, finished

    def _prune(self, newest: Path) -> None:
        prune_checkpoints(self.dir, self.keep_last, protect=(newest,))

    def _event(
        self,
        step: int,
        tokens: int,
        path: Path,
        stall: float,
        write: float,
        milestone: bool,
        asynchronous: bool,
    ) -> dict[str, Any]:
        return {
            "kind": "event", "step": step, "tokens": tokens, "event": "checkpoint", "path": str(path),
            "stall_s": stall, "write_s": write, "async": asynchronous, "milestone": milestone,
        }  # fmt: skip

    def poll(self) -> list[dict[str, Any]]:
        """Events of a background save that has finished (its error, if it failed); never blocks."""
        if self.pending is None or not self.pending.done.done():
            return []
        return self.wait()

    def wait(self) -> list[dict[str, Any]]:
        """Block until the background save (if any) is committed; its event, or its error raised."""
        if self.pending is None:
            return []
        self.before_update()
        pending, self.pending = self.pending, None
        path, finished = pending.done.result()
        write = finished - pending.started
        return [
            self._event(pending.step, pending.tokens, path, pending.stall_s, write, pending.milestone, True)
        ]

    def close(self) -> list[dict[str, Any]]:
        try:
            return self.wait()
        finally:
            self.worker.shutdown(wait=True)
            if self.stager is not None:
                self.stager.close()
                self.stager = None
