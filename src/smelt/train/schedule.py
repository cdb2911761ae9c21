"""Learning-rate schedules: a pure function of the optimizer step, so resume and branch runs are exact.

Warmup is counted in tokens (converted to steps once the batch is known). After it:
- cosine: to a floor (min_lr_ratio of peak, 10% by default) at the last step;
- wsd (warmup-stable-decay): constant peak, then a decay to the floor over the last decay_fraction of
  the steps (linear, cosine or 1-sqrt). `decay_start` may instead name the step where the decay
  starts: a branch run that loads a stable-phase checkpoint and decays from there, which is how one
  stable run yields several anneals of different lengths;
- constant: peak forever (after warmup);
- multistep: peak, multiplied by gamma at each milestone (fractions of the run).
At curriculum stage boundaries an optional re-warmup ramps the LR back up linearly over a few steps,
because a new mixture is, for Adam's moment estimates, a new distribution.

A decay reaches a positive floor at the last step. A floor of zero (min_lr_ratio = 0, as an anneal
has) is reached one step after the last, since a step at LR 0 trains nothing: the last step then
trains at the decay's last positive value (linear: lr / decay steps), as with transformers'
schedules, which reach zero at step num_training_steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def warmup_steps(warmup_tokens: int, total_tokens: int, batch_tokens: int, total_steps: int) -> int:
    """Warmup length in optimizer steps: warmup_tokens (0: 2% of all tokens), at least 1, at most all."""
    tokens = warmup_tokens or 0.02 * total_tokens
    return max(1, min(total_steps, round(tokens / batch_tokens)))


def lr_at(step: int, *, lr: float, warmup: int, total_steps: int, min_lr_ratio: float) -> float:
    """Cosine LR for optimizer step `step` (0-based).

    Warmup ramps linearly to lr at step warmup - 1 (step 0 already gets lr / warmup, never 0); the
    cosine then runs from lr at step `warmup` to lr * min_lr_ratio at the last step, total_steps - 1
    (a floor of 0 one step later, so that the last step still trains).
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = lr * min_lr_ratio
    decay_steps = total_steps - 1 - warmup + (floor == 0)
    if decay_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup) / decay_steps)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def decay_factor(progress: float, shape: str) -> float:
    """From 1 at progress 0 to 0 at progress 1. 1-sqrt keeps the LR high longer than linear and
    drops it steeply at the end (Hägele et al. 2024 find it matches cosine with a short tail)."""
    progress = min(1.0, max(0.0, progress))
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "1-sqrt":
        return 1.0 - math.sqrt(progress)
    raise ValueError(f"unknown decay shape {shape!r}; use linear, cosine or 1-sqrt")


@dataclass(frozen=True)
class Schedule:
    kind: str  # cosine, wsd, constant, multistep
    lr: float
    warmup: int  # steps
    total_steps: int
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2  # wsd
    decay_shape: str = "1-sqrt"  # wsd
    decay_start: int = 0  # wsd: 0-based step where the decay starts (0: from decay_fraction)
    milestones: tuple[float, ...] = (0.8, 0.9)  # multistep
    gamma: float = 0.316  # multistep
    rewarmup: int = 0  # steps of re-warmup after each stage boundary
    stage_starts: tuple[int, ...] = ()  # 0-based first steps of stages after the first

    def __post_init__(self) -> None:
        if self.kind not in ("cosine", "wsd", "constant", "multistep"):
            raise ValueError(f"unknown schedule {self.kind!r}")
        if self.kind == "wsd" and self.decay_start and not self.warmup <= self.decay_start < self.total_steps:
            raise ValueError(
                f"train.decay_start_step = {self.decay_start} must lie in the stable phase, between the end "
                f"of warmup ({self.warmup}) and the last step ({self.total_steps - 1})."
            )

    @property
    def wsd_decay_start(self) -> int:
        if self.decay_start:
            return self.decay_start
        return max(self.warmup, self.total_steps - round(self.decay_fraction * self.total_steps))

    def base(self, step: int) -> float:
        """The LR of 0-based `step` before any stage re-warmup."""
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        floor = self.lr * self.min_lr_ratio
        if self.kind == "cosine":
            return lr_at(step, lr=self.lr, warmup=self.warmup, total_steps=self.total_steps,
                         min_lr_ratio=self.min_lr_ratio)  # fmt: skip
        if self.kind == "constant":
            return self.lr
        if self.kind == "multistep":
            drops = sum(step >= round(m * self.total_steps) for m in self.milestones)
            return self.lr * self.gamma**drops
        start = self.wsd_decay_start
        if step < start:
            return self.lr
        length = self.total_steps - 1 - start + (floor == 0)  # a zero floor: one step past the last
        progress = 1.0 if length <= 0 else (step - start) / length
        return floor + (self.lr - floor) * decay_factor(progress, self.decay_shape)

    def __call__(self, step: int) -> float:
        lr = self.base(step)
        if self.rewarmup:
            for first in self.stage_starts:
                if first <= step < first + self.rewarmup:
                    lr *= (step - first + 1) / (self.rewarmup + 1)
        return lr
