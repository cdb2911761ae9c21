"""Validation during training: each source scored once, one headline, a progress bar and a time budget.

Every evaluation scores the first tokens of each validation source (train.eval_tokens split evenly
across the sources; 0: every token) once. The headline `val_loss` is combined from the per-source
losses with the training mixture's weights (`smelt.eval.heldout.weighted_loss`, as `smelt eval` does),
so with a 70/30 mixture it is not the loss of whichever source sorts first.

The budget (train.eval_budget, a share of the training time) spaces periodic evaluations out instead
of shrinking them: every evaluation scores the same tokens, so the points of the validation curve
compare like with like, and the final figure does not depend on how busy the machine was. A periodic
evaluation runs when the evaluation time so far plus its predicted cost stays within the budget's
share of the training time so far; otherwise it is skipped and says so. The final evaluation always
runs, so its cost is reserved as the run goes (in proportion to the training done): the share holds
at the end too, unless the final evaluation alone is over it. The cost is predicted from the measured
rate of the evaluations before it; before the first, from the training rate (a forward pass is about
a third of the work of a training step).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from smelt.eval.heldout import weighted_loss
from smelt.progress import progress, speaks
from smelt.train.monitors import evaluate
from smelt.train.precision import Precision

# Evaluation tokens/s over training tokens/s before anything is measured: forward only against
# forward + backward (about twice the forward's FLOPs).
FORWARD_SPEEDUP = 3.0


@dataclass
class EvalBudget:
    """Whether a periodic evaluation fits in `share` of the training time; pure bookkeeping.

    `share` 0 turns the budget off (every evaluation runs). Times are in seconds; the training time
    is the time spent in training steps since the process started (or resumed).
    """

    share: float
    eval_s: float = 0.0
    eval_tokens: int = 0
    runs: int = 0
    skipped: int = 0

    def predict_s(self, tokens: int, train_tokens_per_s: float) -> float:
        """Seconds an evaluation of `tokens` tokens will take."""
        if self.eval_tokens > 0 and self.eval_s > 0:
            return tokens * self.eval_s / self.eval_tokens
        if train_tokens_per_s > 0:
            return tokens / (FORWARD_SPEEDUP * train_tokens_per_s)
        return 0.0

    def allows(self, predicted_s: float, train_s: float, done: float = 0.0) -> bool:
        """Whether an evaluation predicted to take `predicted_s` fits, `done` (0-1) of the run's training
        steps in. The final evaluation (the same tokens, so the same predicted cost) always runs; its
        cost is reserved in proportion to the training done, so that with it the share still holds at
        the end of the run."""
        reserve = predicted_s * min(max(done, 0.0), 1.0)
        return self.share <= 0 or self.eval_s + predicted_s + reserve <= self.share * train_s

    def record(self, seconds: float, tokens: int) -> None:
        self.eval_s += seconds
        self.eval_tokens += tokens
        self.runs += 1

    def share_of(self, train_s: float) -> float | None:
        """Evaluation time over training time so far (None before any training)."""
        return self.eval_s / train_s if train_s > 0 else None


def rank0_decides(flag: bool, device: torch.device) -> bool:
    """Rank 0's `flag` on every rank: a decision from timings must be the same everywhere, since every
    rank takes part in an evaluation's forward passes (FSDP gathers, DDP syncs buffers)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(value, src=0)
    return bool(value.item() > 0)


def windows_of(shards: Any, limit: int, seq_len: int) -> Iterator[np.ndarray]:
    """Consecutive windows of seq_len + 1 tokens (int64) over the first `limit` tokens of a ShardSet;
    consecutive windows share one token, so each token but the first is a target exactly once."""
    start = 0
    while start + 1 < limit:
        yield shards.read(start, min(seq_len + 1, limit - start)).astype(np.int64)
        start += seq_len


def _batches(windows: Iterable[np.ndarray], size: int) -> Iterator[list[np.ndarray]]:
    batch: list[np.ndarray] = []
    for window in windows:
        if len(window) < 2:
            continue
        batch.append(window)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def score_sources(
    model: torch.nn.Module,
    windows: dict[str, Iterable[np.ndarray]],
    seq_len: int,
    batch_size: int,
    precision: Precision,
    device: torch.device,
    eos_id: int | None = None,
    on_tokens: Callable[[int], None] | None = None,
) -> dict[str, tuple[float, int]]:
    """Mean loss and tokens scored per source, each source's windows passed through the model once.

    `on_tokens(n)` is called after each batch with the tokens it scored (a progress bar's update).
    """
    out: dict[str, tuple[float, int]] = {}
    for source, source_windows in windows.items():
        total, count = 0.0, 0
        for batch in _batches(source_windows, batch_size):
            loss, scored = evaluate(model, batch, seq_len, len(batch), precision, device, eos_id)
            if scored:
                total += loss * scored
                count += scored
                if on_tokens is not None:
                    on_tokens(scored)
        out[source] = (total / count if count else float("nan"), count)
    return out


@dataclass
class ValidationResult:
    loss: float  # the headline: per-source losses weighted as `weighting` says
    weighting: str  # "mixture" (training weights) or "tokens" (see weighted_loss)
    weights: dict[str, float]  # the weights used, summing to 1 over the scored sources
    by_source: dict[str, float]
    tokens: int  # tokens scored, all sources
    seconds: float = 0.0

    def fields(self) -> dict[str, Any]:
        """The figures of a metrics.jsonl eval record."""
        several = len(self.by_source) > 1
        return {
            "val_loss": self.loss,
            "val_loss_weighting": self.weighting,
            "val_tokens": self.tokens,
            **({"val_loss_by_source": self.by_source, "val_loss_weights": self.weights} if several else {}),
            "eval_s": round(self.seconds, 3),
        }


class Validation:
    """The validation windows of a run (the same tokens at every evaluation) and their scoring."""

    def __init__(
        self,
        tokens_dir: Path,
        sources: list[str],
        seq_len: int,
        eval_tokens: int,
        batch_size: int,
        precision: Precision,
        device: torch.device,
        eos_id: int | None,
        weights: dict[str, float],
    ) -> None:
        from smelt.tokens.shards import ShardSet  # lazy: tokens/ is a sibling stage

        # Checked once here, not at every evaluation.
        self.shards = {s: ShardSet(tokens_dir, "val", s) for s in sources}
        per_source = max(2, eval_tokens // len(sources)) if eval_tokens > 0 and sources else 0
        self.limits = {
            s: shards.total_tokens if per_source == 0 else min(per_source, shards.total_tokens)
            for s, shards in self.shards.items()
        }
        self.seq_len, self.batch_size = seq_len, batch_size
        self.precision, self.device, self.eos_id = precision, device, eos_id
        self.weights = weights

    @property
    def tokens(self) -> int:
        """Tokens scored per evaluation (targets: every token of a source's stream but its first)."""
        return sum(max(limit - 1, 0) for limit in self.limits.values())

    def run(self, model: torch.nn.Module, desc: str = "eval", show: bool = True) -> ValidationResult:
        started = time.perf_counter()
        windows = {s: windows_of(self.shards[s], self.limits[s], self.seq_len) for s in self.shards}
        bar = progress(total=self.tokens, desc=desc, unit="tok", unit_scale=True) if show else None
        try:
            scores = score_sources(
                model, windows, self.seq_len, self.batch_size, self.precision, self.device, self.eos_id,
                on_tokens=bar.update if bar is not None else None,
            )  # fmt: skip
        finally:
            if bar is not None:
                bar.close()
        losses = {s: loss for s, (loss, _) in scores.items()}
        counts = {s: n for s, (_, n) in scores.items()}
        loss, weighting, weights = weighted_loss(losses, counts, self.weights)
        return ValidationResult(
            loss=loss,
            weighting=weighting,
            weights=weights,
            by_source={s: v for s, v in losses.items() if counts[s]},
            tokens=sum(counts.values()),
            seconds=time.perf_counter() - started,
        )


def say(message: str) -> None:
    """A status line for the terminal printed above the progress bars (a plain print while the training
    bar is drawn would land on the bar's own line)."""
    if speaks():
        tqdm.write(message, file=sys.stderr)


def budget_note(budget: EvalBudget, train_s: float) -> str:
    """The line printed at the end of a run: how many evaluations ran and what they cost."""
    share = budget.share_of(train_s)
    spent = f"{budget.eval_s:.1f} s" + (f", {100 * share:.1f}% of the training time" if share else "")
    limit = (
        f"train.eval_budget = {budget.share:g}" if budget.share > 0 else "no budget (train.eval_budget = 0)"
    )
    skipped = f", {budget.skipped} skipped to stay within it" if budget.skipped else ""
    return f"validation: {budget.runs} evaluation(s) in {spent}; {limit}{skipped}"


def skip_note(step: int, predicted_s: float, budget: EvalBudget, train_s: float) -> str:
    """Why the evaluation at `step` did not run (printed once, then recorded as events)."""
    return (
        f"validation at step {step} skipped: about {predicted_s:.1f} s more (after {budget.eval_s:.1f} s so far, "
        f"and the final validation's share reserved) would exceed train.eval_budget = {budget.share:g} of "
        f"the {train_s:.0f} s trained; later evaluations run as the budget allows (raise train.eval_budget, "
        f"lower train.eval_tokens, or set train.eval_budget = 0 to run every one)."
    )
