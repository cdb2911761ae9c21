"""The one training loop of every post-training stage: draw a batch from the data cursor, take one
optimizer step, log, evaluate and checkpoint when due, stop cleanly on SIGTERM/SIGINT, and resume.

A stage (SFT, DPO, GRPO) brings only what differs: its per-step work (`StepFn`: the forward, the
backward and the optimizer step on the batch the cursor drew) and its held-out figures. The loop owns
the rest, like the pretraining trainer:

- **checkpoints** every `optim.checkpoint_every` steps and at the end hold the weights, the optimizer
  moments, the data cursor (the shuffled order and its generator), every RNG of each rank, the stage's
  `carry` (figures a summary needs from before the resume: the held-out score at step 0, the reward
  curve) and the size of metrics.jsonl, so a run killed at any moment resumes from its last checkpoint
  and writes the records an uninterrupted run writes (timing fields aside). GRPO's sampler needs no
  state of its own: each step's samples are drawn from a generator seeded by (run seed, step).
- **SIGTERM and SIGINT** finish the step in flight, save and exit with SIGNAL_EXIT_CODE (75), as
  pretraining does (under torchrun the ranks agree after every step, so all save the same one); the
  next `smelt posttrain run` with the same config resumes.
"""

from __future__ import annotations

import random
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from smelt.checkpoint.rng import restore_rng, rng_state
from smelt.checkpoint.store import load_training_state, prune_checkpoints, read_meta, save_checkpoint
from smelt.config import hash_json
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS
from smelt.progress import log, progress
from smelt.train.cadence import Every
from smelt.train.ops.watchdog import StopRequested
from smelt.train.schedule import Schedule

# Held-out figures logged at step 0, before any update; a resumed run reads them from its checkpoint.
BEFORE = "before"


class Cursor:
    """Shuffled epochs over `size` items, drawn `k` at a time (a new shuffle when an epoch runs out).
    Its state (the generator's and the rest of the epoch) is the data cursor a checkpoint holds."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.rng = random.Random(seed)
        self.order: list[int] = []

    def take(self, k: int) -> list[int]:
        index: list[int] = []
        while len(index) < k:
            if not self.order:
                self.order = list(range(self.size))
                self.rng.shuffle(self.order)
            index.append(self.order.pop())
        return index

    def state_dict(self) -> dict[str, Any]:
        version, internal, gauss = self.rng.getstate()
        return {"size": self.size, "rng": [version, list(internal), gauss], "order": list(self.order)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["size"]) != self.size:
            raise UserError(
                f"the checkpoint's data cursor is over {state['size']} items but this run's data has "
                f"{self.size}: the data changed since it was saved. Pass --force to start again."
            )
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.order = [int(i) for i in state["order"]]


@dataclass
class StopSignal:
    """SIGTERM/SIGINT while the loop runs: the step in flight finishes, then the loop saves and exits."""

    signum: int = 0

    @contextmanager
    def installed(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

        def request(signum: int, frame: Any) -> None:
            if self.signum:  # a second signal: stop now
                raise SystemExit(128 + signum)
            self.signum = signum
            log(f"post-training got signal {signum}: finishing this step, then saving a checkpoint")

        for s in previous:
            signal.signal(s, request)
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


StepFn = Callable[[list[int], float, int], dict[str, Any]]  # (batch index, lr, step) -> stats with "tokens"


@dataclass
class Loop:
    """A stage's optimizer, schedule and data cursor, and what its checkpoints carry."""

    stage: Any  # posttrain.stage.Stage (not imported: stage.py imports this module)
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    cursor: Cursor
    batch_size: int
    carry: dict[str, Any] = field(default_factory=dict)
    start_step: int = 0

    @property
    def steps(self) -> int:
        return int(self.stage.cfg.optim.steps)

    @property
    def checkpoints_dir(self) -> Path:
        return self.stage.train_dir / CHECKPOINTS

    # --- resume -------------------------------------------------------------------------------------

    def restore(self) -> int:
        """Load the stage's resume checkpoint (chosen by open_stage) into the model, the optimizer, the
        cursor, the RNGs and the carry; returns the step to continue from (0 for a fresh run)."""
        checkpoint = self.stage.resume_from
        if checkpoint is None:
            return 0
        meta, rank_state = load_training_state(checkpoint, self.stage.model, self.optimizer)
        loop = meta["posttrain_loop"]
        self.cursor.load_state_dict(loop["cursor"])
        self.carry.update(loop["carry"])
        self.stage.tokens = int(meta.get("tokens", 0))
        self.stage.train_seconds = float(loop.get("train_seconds", 0.0))
        self.stage.earlier_wall_s = float(loop.get("wall_seconds", 0.0))
        if rank_state is not None and "rng" in rank_state:
            restore_rng(rank_state["rng"], self.stage.device)
        self.start_step = int(meta["step"])
        return self.start_step

    # --- the loop -----------------------------------------------------------------------------------

    def run(self, step_fn: StepFn, heldout: Callable[[int], Any] | None = None, show: str = "loss") -> dict:
        """Steps start_step .. steps; returns the last step's stats (empty for a run of no steps)."""
        stage, o = self.stage, self.stage.cfg.optim
        stop = StopSignal()
        # The pretraining trainer's cadences (train/cadence.py): the last step's eval and save are finish()'s.
        log_due = Every(o.log_every, self.steps, first=True, at_last=True)
        eval_due = Every(o.eval_every, self.steps)
        save_due = Every(o.checkpoint_every, self.steps)
        bar = progress(total=self.steps, desc=stage.name, unit="step")
        bar.update(self.start_step)
        with stop.installed():
            for step in range(self.start_step, self.steps):
                index = self.cursor.take(self.batch_size)
                lr = self.schedule(step)
                stats = stage.timed(lambda index=index, lr=lr, step=step: step_fn(index, lr, step))
                stage.tokens += int(stats.pop("tokens"))
                self.carry["last_train"] = dict(stats)  # what a summary reads, also after a resume at the end
                if log_due.due(step + 1):
                    stage.log_record({"kind": "train", "step": step + 1, "tokens": stage.tokens, **stats, "lr": lr,
                                      "tokens_per_s": stage.tokens_per_s()})  # fmt: skip
                done = step + 1 == self.steps
                if heldout is not None and eval_due.due(step + 1):
                    heldout(step + 1)
                bar.update(1)
                bar.set_postfix({show: f"{stats.get(show, float('nan')):.3f}"})
                if self.stop_agreed(stop) and not done:
                    path = self.save(step + 1)
                    bar.close()
                    raise StopRequested(
                        f"[{stage.name}] stopped by signal {stop.signum or 'on another rank'} after step "
                        f"{step + 1}; checkpoint {path}. Run the same command again to resume.",
                        stop.signum,
                    )
                if save_due.due(step + 1):
                    self.save(step + 1)
        bar.close()
        return dict(self.carry.get("last_train", {}))

    def stop_agreed(self, stop: StopSignal) -> bool:
        """Whether any rank got a stop signal: the ranks decide together, so all save the same step."""
        if not self.stage.ctx.distributed:
            return bool(stop.signum)
        return bool(self.stage.all_sum(torch.tensor(float(stop.signum > 0))) > 0)

    def save(self, step: int) -> Path:
        """A full checkpoint (see the module's docstring); keeps the last optim.keep_last before it."""
        stage = self.stage
        metrics = stage.metrics
        meta = {
            "model_config": stage.model_config(), "vocab_size": stage.tokenizer.vocab_size,
            "tokens": stage.tokens, "tokenizer_hash": stage.tokenizer.hash, "stage": stage.name,
            "config_hash": hash_json(stage.cfg.to_dict()), "parent": stage.parent.record(),
            "world_size": stage.world_size, "metrics_offset": metrics.offset if metrics else None,
            "posttrain_loop": {"cursor": self.cursor.state_dict(), "carry": self.carry,
                               "train_seconds": stage.train_seconds, "wall_seconds": stage.wall_seconds()},
        }  # fmt: skip
        path = save_checkpoint(self.checkpoints_dir, step, stage.model, self.optimizer, meta,
                               rank_state={"rng": rng_state(stage.device)})  # fmt: skip
        stage.log_record({"kind": "event", "event": "checkpoint", "step": step, "tokens": stage.tokens,
                          "path": str(path)})  # fmt: skip
        if stage.is_main:
            prune_checkpoints(self.checkpoints_dir, max(1, stage.cfg.optim.keep_last), protect=(path,))
        return path


def resume_point(checkpoint: Path | None, config_hash: str) -> tuple[Path | None, str]:
    """(the checkpoint to resume from, or None, and why not when one exists but does not fit): a run
    resumes only from a full post-training checkpoint written with the same config."""
    if checkpoint is None:
        return None, ""
    meta = read_meta(checkpoint, verify=False)
    if "posttrain_loop" not in meta:
        return None, "it holds weights only (written before post-training could resume)"
    if meta.get("config_hash") != config_hash:
        return None, "it was written with another post-training config"
    return checkpoint, ""
