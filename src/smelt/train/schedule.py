"""Learning-rate schedule: linear warmup, then cosine decay to a floor. A pure function of the step."""

from __future__ import annotations

import math


def warmup_steps(warmup_tokens: int, total_tokens: int, batch_tokens: int, total_steps: int) -> int:
    """Warmup length in optimizer steps: warmup_tokens (0: 2% of all tokens), at least 1, at most all."""
    tokens = warmup_tokens or 0.02 * total_tokens
    return max(1, min(total_steps, round(tokens / batch_tokens)))


def lr_at(step: int, *, lr: float, warmup: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR for optimizer step `step` (0-based).

    Warmup ramps linearly to lr at step warmup - 1 (step 0 already gets lr / warmup, never 0); the
    cosine then runs from lr at step `warmup` to lr * min_lr_ratio at the last step, total_steps - 1.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    floor = lr * min_lr_ratio
    decay_steps = total_steps - 1 - warmup
    if decay_steps <= 0:
        return lr
    progress = min(1.0, (step - warmup) / decay_steps)
    return floor + (lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
