"""The statistics of one log window (the steps since the last `kind: train` record) and the run's
totals of time spent training and waiting for data."""

from __future__ import annotations

import math
from typing import Any

import torch

from smelt.train.step_times import RankTimes


class Window:
    """Accumulates steps; `mean_loss` and the rates describe the window, `reset` starts the next one.
    The loss of a window is the mean over its steps with a finite loss (skipped steps included)."""

    def __init__(self, sources: list[str]) -> None:
        self.sources = sources
        self.source_sums = torch.zeros((len(sources), 2), dtype=torch.float64)  # loss sum, tokens
        self.train_time = 0.0  # the run's, since this process started training
        self.total_wait = 0.0
        self.ranks = RankTimes()  # step-time percentiles and the straggler test (step_times.py)
        self.reset()

    def reset(self) -> None:
        self.losses: list[float] = []
        self.time = self.wait = 0.0
        self.tokens = self.clipped = self.skipped = self.steps = 0
        self.source_sums.zero_()
        self.ranks.reset()

    def add_sources(self, sums: torch.Tensor | None) -> None:
        if sums is not None:
            self.source_sums += sums.cpu()

    def add_step(
        self, seconds: float, wait: float, tokens: int, loss: float, clipped: bool, skipped: bool
    ) -> None:
        self.time += seconds
        self.wait += wait
        self.steps += 1
        self.tokens += tokens
        self.train_time += seconds
        self.total_wait += wait
        self.ranks.add_step(seconds)
        if math.isfinite(loss):
            self.losses.append(loss)
        self.clipped += int(clipped)
        self.skipped += int(skipped)

    def mean_loss(self) -> float:
        return sum(self.losses) / len(self.losses) if self.losses else float("nan")

    def tokens_per_s(self) -> float:
        return self.tokens / max(self.time, 1e-9)

    def state_dict(self) -> dict[str, Any]:
        return {
            "losses": list(self.losses), "time": self.time, "wait": self.wait, "tokens": self.tokens,
            "clipped": self.clipped, "skipped": self.skipped, "steps": self.steps,
            "source_sums": self.source_sums.tolist(), "train_time": self.train_time,
            "total_wait": self.total_wait, "ranks": self.ranks.state_dict(),
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.losses = list(state["losses"])
        self.time, self.wait, self.tokens = state["time"], state["wait"], state["tokens"]
        self.clipped, self.skipped, self.steps = state["clipped"], state["skipped"], state["steps"]
        self.source_sums = torch.tensor(state["source_sums"], dtype=torch.float64)
        self.train_time, self.total_wait = state["train_time"], state["total_wait"]
        if "ranks" in state:
            self.ranks.load_state_dict(state["ranks"])
