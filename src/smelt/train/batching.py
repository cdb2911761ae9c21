"""Batch arithmetic: the global batch in tokens, gradient accumulation, and the batch-size ramp.

Without a ramp every optimizer step takes one loader step of train.batch_tokens. With a ramp
(train.batch_ramp_tokens > 0) the loader's step is the starting batch, train.batch_ramp_start tokens,
and optimizer step k takes n_k of those units: the batch grows linearly with the tokens consumed, from
the starting batch to train.batch_tokens over the first batch_ramp_tokens tokens, in whole units. The
number of units each step takes depends on the tokens before it only, so the plan is the same on
every rank and after a resume; the data order is exactly the loader's, whatever the ramp.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from itertools import accumulate

from smelt.config import TrainConfig
from smelt.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    seq_len: int
    micro_batch: int
    world_size: int
    batch_tokens: int  # global tokens per optimizer step (after the ramp)
    grad_accum: int  # micro steps per loader step, per process
    steps: int  # optimizer steps
    unit_tokens: int = 0  # with a ramp: tokens of one loader step (the starting batch)
    units: tuple[int, ...] = ()  # with a ramp: loader steps taken by each optimizer step
    _consumed: tuple[int, ...] = field(default=(), repr=False)  # loader steps done after each step

    @property
    def loader_batch_tokens(self) -> int:
        return self.unit_tokens or self.batch_tokens

    @property
    def loader_steps(self) -> int:
        return self._consumed[-1] if self.units else self.steps

    @property
    def tokens(self) -> int:
        return self.tokens_at(self.steps)

    def units_at(self, step: int) -> int:
        """Loader steps that optimizer step `step` (1-based) takes."""
        return self.units[step - 1] if self.units else 1

    def tokens_at(self, step: int) -> int:
        """Tokens consumed once `step` optimizer steps are done."""
        if not self.units:
            return step * self.batch_tokens
        return (self._consumed[step - 1] if step > 0 else 0) * self.unit_tokens

    def step_of_loader_step(self, loader_step: int) -> int:
        """The optimizer step (1-based) that takes loader step `loader_step` (1-based)."""
        if not self.units:
            return loader_step
        return bisect.bisect_left(self._consumed, loader_step) + 1

    def step_at_tokens(self, tokens: float) -> int:
        """The number of optimizer steps after which at least `tokens` tokens are consumed (>= 1)."""
        if not self.units:
            return max(1, min(self.steps, round(tokens / self.batch_tokens)))
        needed = math.ceil(tokens / self.unit_tokens)
        return max(1, min(self.steps, bisect.bisect_left(self._consumed, needed) + 1))


def batch_plan(cfg: TrainConfig, world_size: int = 1) -> BatchPlan:
    """Resolve batch_tokens into gradient-accumulation steps and the number of optimizer steps."""
    per_micro = cfg.seq_len * cfg.micro_batch * world_size
    batch_tokens = cfg.batch_tokens or per_micro
    _check_multiple("train.batch_tokens", batch_tokens, per_micro, cfg, world_size)
    if not cfg.batch_ramp_tokens:
        return BatchPlan(
            seq_len=cfg.seq_len,
            micro_batch=cfg.micro_batch,
            world_size=world_size,
            batch_tokens=batch_tokens,
            grad_accum=batch_tokens // per_micro,
            steps=math.ceil(cfg.tokens / batch_tokens),
        )
    start = cfg.batch_ramp_start or per_micro
    _check_multiple("train.batch_ramp_start", start, per_micro, cfg, world_size)
    if batch_tokens % start or start >= batch_tokens:
        raise ConfigError(
            f"train.batch_ramp_start = {start} must be smaller than train.batch_tokens = {batch_tokens} and "
            f"divide it (the batch grows in whole starting batches); e.g. {batch_tokens // 8 or per_micro}."
        )
    total_units, full = math.ceil(cfg.tokens / start), batch_tokens // start
    units: list[int] = []
    consumed = 0
    while consumed < total_units:
        progress = min(1.0, consumed * start / cfg.batch_ramp_tokens)
        n = int((start + (batch_tokens - start) * progress) // start)
        n = min(max(n, 1), full, total_units - consumed)
        units.append(n)
        consumed += n
    return BatchPlan(
        seq_len=cfg.seq_len,
        micro_batch=cfg.micro_batch,
        world_size=world_size,
        batch_tokens=batch_tokens,
        grad_accum=start // per_micro,
        steps=len(units),
        unit_tokens=start,
        units=tuple(units),
        _consumed=tuple(accumulate(units)),
    )


def _check_multiple(key: str, value: int, per_micro: int, cfg: TrainConfig, world_size: int) -> None:
    if value % per_micro:
        lower = value // per_micro * per_micro
        valid = [v for v in (lower, lower + per_micro) if v > 0]
        raise ConfigError(
            f"{key} = {value} is not a multiple of seq_len x micro_batch x world size = "
            f"{cfg.seq_len} x {cfg.micro_batch} x {world_size} = {per_micro}. Nearest valid values: "
            f"{' or '.join(map(str, valid))} (or 0 for exactly {per_micro})."
        )
