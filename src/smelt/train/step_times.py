"""Per-rank step times as the run goes: how fast each rank is, and how far the running process got.

- Per-rank step times (`RankTimes`): every rank keeps its own step times over a log window; at the
  window's end one small all_gather gives rank 0 every rank's p50 and p99. Ranks synchronise inside
  every step (the gradient all-reduce), so a slow rank's delay shows up as the others' waiting and
  every rank's wall step time is about the same. The straggler test therefore compares each rank's
  *own* time per step: the time between two step ends minus the time it spent inside the step's
  synchronised section (forward, backward, gradient sync), i.e. its data loading, update, logging
  and other host work. A rank whose own-time p50 is more than `train.straggler_ratio` times the
  median rank's is named in one `straggler` alert per window.
- The step marker (`StepMarker`): the last step this process finished, which a resume reads to count
  the steps it redoes.
- The clock fields (`clock`) that place a record in wall time. Goodput, the analysis of these records
  after the fact, is report/goodput.py's.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from smelt.train.evaluation import say


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between the nearest ranks; nan if empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def timed(action: Callable[[], Any]) -> float:
    """Run `action`; return the seconds it took."""
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def clock(started: float) -> dict[str, float]:
    """The fields that place a record in wall time: seconds since this process started and the Unix
    time (their difference identifies the process, which is how goodput tells restarts apart)."""
    now = time.time()
    return {"elapsed_s": now - started, "time": now}


# In the train directory: the last optimizer step this history's running process finished, rewritten
# in place after every step, so that a resume after a kill knows how far the dead process got even
# past its last log line (metrics.jsonl has a train record every train.log_every steps only).
STEP_MARKER = "last_step"


class StepMarker:
    """`advance()` after every optimizer step writes the step reached into RUN/train/last_step: one
    fixed-width pwrite, no fsync (a killed process's page cache survives it; a machine crash may lose
    the last steps, which then count as not redone)."""

    WIDTH = 20

    def __init__(self, train_dir: Path, step: int) -> None:
        self.step = step
        self.fd = os.open(Path(train_dir) / STEP_MARKER, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.close = weakref.finalize(self, os.close, self.fd)  # at the latest when the trainer goes
        self._write()

    def advance(self) -> None:
        self.step += 1
        self._write()

    def _write(self) -> None:
        os.pwrite(self.fd, f"{self.step:>{self.WIDTH - 1}}\n".encode(), 0)

    @staticmethod
    def read(train_dir: Path) -> int | None:
        """The step the last process of this history reached, or None without a readable marker."""
        try:
            return int((Path(train_dir) / STEP_MARKER).read_text().strip())
        except (OSError, ValueError):
            return None


class RankTimes:
    """One rank's step times over a log window: wall step time, the synchronised part of it, the wait
    for a checkpoint's host copy inside it, and the rank's own time between step ends. `marker` (rank
    0): the StepMarker it advances after every step."""

    def __init__(self) -> None:
        self.last_end: float | None = None
        self.synced_now = 0.0
        self.marker: StepMarker | None = None
        self.reset()

    def reset(self) -> None:
        self.step_s: list[float] = []
        self.own_s: list[float] = []
        self.checkpoint_wait_s = 0.0

    def synced(self, seconds: float) -> None:
        """Time of the current step spent in its synchronised section (every rank waits there)."""
        self.synced_now += seconds

    def add_step(self, seconds: float) -> None:
        now = time.perf_counter()
        cycle = now - self.last_end if self.last_end is not None else seconds
        self.step_s.append(seconds)
        self.own_s.append(max(0.0, cycle - self.synced_now))
        self.last_end, self.synced_now = now, 0.0
        if self.marker is not None:
            self.marker.advance()

    def state_dict(self) -> dict[str, Any]:
        return {
            "step_s": list(self.step_s),
            "own_s": list(self.own_s),
            "checkpoint_wait_s": self.checkpoint_wait_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_s, self.own_s = list(state["step_s"]), list(state["own_s"])
        self.checkpoint_wait_s = float(state["checkpoint_wait_s"])

    def figures(self) -> list[float]:
        """[step p50, step p99, own p50, own p99] of this window (seconds)."""
        return [percentile(self.step_s, 50), percentile(self.step_s, 99),
                percentile(self.own_s, 50), percentile(self.own_s, 99)]  # fmt: skip

    def window_fields(
        self, step: int, tokens: int, ratio: float, device: torch.device
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The train record's step-time fields and the straggler alert (if any) of this window.
        Collective: every rank calls it at the same log step (one all_gather of four numbers)."""
        per_rank = gather_figures(self.figures(), device)
        fields: dict[str, Any] = {
            "step_time_s": sum(self.step_s), "checkpoint_wait_s": self.checkpoint_wait_s,
            "step_time_p50_s": per_rank[0][0], "step_time_p99_s": per_rank[0][1],
        }  # fmt: skip
        if len(per_rank) > 1:
            fields["rank_step_time_p50_s"] = [figures[0] for figures in per_rank]
            fields["rank_step_time_p99_s"] = [figures[1] for figures in per_rank]
            fields["rank_own_time_p50_s"] = [figures[2] for figures in per_rank]
        alert = straggler_alert([figures[2] for figures in per_rank], ratio, step, tokens)
        if alert is None:
            return fields, []
        if not dist.is_initialized() or dist.get_rank() == 0:
            say(f"warning: step {step}: {alert['message']}")
        return fields, [alert]


def gather_figures(figures: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `figures`, in rank order (one all_gather; just this rank's without a process group)."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return [list(figures)]
    # NCCL only moves CUDA tensors and gloo only CPU ones.
    where = device if device.type == "cuda" else torch.device("cpu")
    mine = torch.tensor(figures, dtype=torch.float64, device=where)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return [t.cpu().tolist() for t in gathered]


def straggler_alert(own_p50: list[float], ratio: float, step: int, tokens: int) -> dict[str, Any] | None:
    """One alert naming the slowest rank when its own-time p50 exceeds `ratio` x the median rank's
    (and every other rank past the ratio); None when no rank does, with one rank, or `ratio` 0 (off)."""
    finite = [value for value in own_p50 if math.isfinite(value)]
    if ratio <= 0 or len(finite) < 2:
        return None
    median = statistics.median(finite)
    slow = [rank for rank, value in enumerate(own_p50) if math.isfinite(value) and value > ratio * median]
    if not slow or median <= 0:
        return None
    worst = max(slow, key=lambda rank: own_p50[rank])
    return {
        "kind": "event", "step": step, "tokens": tokens, "event": "alert", "alert": "straggler",
        "action": "log", "rank": worst, "ranks": slow, "value": own_p50[worst], "median": median,
        "threshold": ratio * median,
        "message": f"rank {worst} is a straggler: its own time per step (p50 {own_p50[worst]:.4f} s) is "
        f"{own_p50[worst] / median:.2f}x the median rank's ({median:.4f} s; train.straggler_ratio = {ratio:g})"
        + (f"; also slow: ranks {', '.join(str(r) for r in slow if r != worst)}" if len(slow) > 1 else ""),
    }  # fmt: skip
