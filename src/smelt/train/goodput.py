"""Cluster operations: how fast each rank is, how much of the wall time trained the model, and how
often to checkpoint.

- Per-rank step times (`RankTimes`): every rank keeps its own step times over a log window; at the
  window's end one small all_gather gives rank 0 every rank's p50 and p99. Ranks synchronise inside
  every step (the gradient all-reduce), so a slow rank's delay shows up as the others' waiting and
  every rank's wall step time is about the same. The straggler test therefore compares each rank's
  *own* time per step: the time between two step ends minus the time it spent inside the step's
  synchronised section (forward, backward, gradient sync), i.e. its data loading, update, logging
  and other host work. A rank whose own-time p50 is more than `train.straggler_ratio` times the
  median rank's is named in one `straggler` alert per window.
- Goodput (`goodput`): read after the fact from metrics.jsonl and metrics.superseded.jsonl, the wall
  time from the first process start to the end split into productive step time, work lost to
  restarts (steps redone after a resume), the downtime between a crash and the resumed process,
  checkpoint stalls, evaluation and the rest (start-up, logging).
- The checkpoint interval (`interval_advice`): Young-Daly, sqrt(2 x save cost x MTBF), from the
  measured checkpoint stall and `checkpoint.mtbf_hours`.
"""

from __future__ import annotations

import math
import os
import statistics
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from smelt.metric_records import read_records
from smelt.train.evaluation import say
from smelt.train.monitors import SUPERSEDED_METRICS


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


# --- goodput, from the run's metrics files -------------------------------------------------------------


def _attempts(records: Iterable[dict[str, Any]]) -> list[list[float]]:
    """[process start, last Unix time seen] per process that logged a timed train record or end
    event, in order."""
    spans: list[list[float]] = []
    for record in records:
        if not _finite(record.get("time")):
            continue
        if record.get("kind") == "train":
            since_start = record.get("elapsed_s")
        elif record.get("event") == "end":
            since_start = record.get("wall_time_s")
        else:
            continue
        now = float(record["time"])
        start = now - float(since_start or 0.0)
        span = next((s for s in spans if abs(s[0] - start) < 0.01), None)
        if span is None:
            spans.append([start, now])
        else:
            span[1] = max(span[1], now)
    return sorted(spans)


def _after(record: dict[str, Any], start: float) -> bool:
    """Whether a set-aside record was written by a process that started at or after `start` (records
    without a clock, such as the `superseded` headers, are kept)."""
    if not _finite(record.get("time")):
        return True
    since_start = record.get("elapsed_s") if record.get("kind") == "train" else record.get("wall_time_s")
    return float(record["time"]) - float(since_start or 0.0) >= start - 0.01


def _own_step_s(record: dict[str, Any]) -> float:
    return max(0.0, float(record.get("step_time_s") or 0.0) - float(record.get("checkpoint_wait_s") or 0.0))


# The parts wall time is split into, as (name, key of `goodput`'s result); they add up to wall_s.
GOODPUT_PARTS = (
    ("productive step time", "productive_s"),
    ("steps redone after a resume", "lost_s"),
    ("restart downtime", "restart_downtime_s"),
    ("checkpoint stalls", "checkpoint_stall_s"),
    ("evaluation", "eval_s"),
    ("other (start-up, logging, the end)", "other_s"),
)


def goodput(train_dir: Path) -> dict[str, Any] | None:
    """Where the wall time of the run in `train_dir` went, from its metrics files; None when they hold
    no timed train records (a run logged before these fields existed, or not yet logging).

    wall = productive + lost + restart downtime + checkpoint stalls + eval + other; goodput is
    productive / wall. Productive is the step time (less waits for a checkpoint's host copy) of the
    steps in metrics.jsonl; lost is that of steps a resume redid (metrics.superseded.jsonl); the
    downtime of a restart runs from the crashed process's last record to the resumed one's start.
    lost_steps counts every step a resume ran again, from the step each dead process reached (its
    resume event's `reached_step`, from StepMarker), logged or not; lost_s holds the logged windows'
    time only: the redone steps after a dead process's last log line fall in other_s.
    """
    train_dir = Path(train_dir)
    kept = read_records(train_dir / "metrics.jsonl")
    kept_spans = _attempts(kept)
    if not kept_spans:
        return None
    # metrics.superseded.jsonl outlives a fresh start over an old metrics.jsonl (moved to .N): only
    # what this history's processes set aside counts (its first process always keeps its first record).
    moved = [r for r in read_records(train_dir / SUPERSEDED_METRICS) if _after(r, kept_spans[0][0])]
    spans = _attempts([*kept, *moved])
    ends = [r for r in kept if r.get("event") == "end" and _finite(r.get("wall_time_s"))]
    if ends and not _finite(ends[-1].get("time")):  # an end without a clock closes the last process
        spans[-1][1] = max(spans[-1][1], spans[-1][0] + float(ends[-1]["wall_time_s"]))
    wall = spans[-1][1] - spans[0][0]
    downtime = sum(max(0.0, nxt[0] - prev[1]) for prev, nxt in zip(spans, spans[1:], strict=False))
    productive = sum(_own_step_s(r) for r in kept if r.get("kind") == "train")
    lost = sum(_own_step_s(r) for r in moved if r.get("kind") == "train")
    lost_steps = _redone_steps(kept, moved)
    checkpoints = [r for r in [*kept, *moved] if r.get("event") == "checkpoint"]
    stall = sum(float(r.get("stall_s") or 0.0) for r in checkpoints)
    evals = sum(float(r.get("eval_s") or 0.0) for r in [*kept, *moved] if r.get("kind") == "eval")
    other = max(0.0, wall - productive - lost - downtime - stall - evals)
    step_p50 = [r["step_time_p50_s"] for r in kept if _finite(r.get("step_time_p50_s"))]
    save_costs = [float(r["stall_s"]) for r in checkpoints if _finite(r.get("stall_s"))]
    return {
        "goodput": productive / wall if wall > 0 else None,
        "wall_s": wall,
        "productive_s": productive,
        "lost_s": lost,
        "lost_steps": lost_steps,
        "restarts": len(spans) - 1,
        "restart_downtime_s": downtime,
        "checkpoint_stall_s": stall,
        "checkpoints": len(checkpoints),
        "eval_s": evals,
        "other_s": other,
        "step_time_p50_s": statistics.median(step_p50) if step_p50 else None,
        "save_cost_s": statistics.median(save_costs) if save_costs else None,
    }


def _redone_steps(kept: list[dict[str, Any]], moved: list[dict[str, Any]]) -> int:
    """Steps a resume ran again. Each resume event that says which step the dead process reached
    (`reached_step`) counts reached - resumed step, whether the dead process logged those steps or
    not. A resume without it (written before the marker) counts its `superseded` block instead: the
    last step the moved train records reached past the step it resumed at."""
    marked: dict[int, int] = {}  # resumed-at step -> resumes at it that carry reached_step
    total = 0
    for record in [*kept, *moved]:
        if (
            record.get("event") == "resume"
            and _finite(record.get("reached_step"))
            and _finite(record.get("step"))
        ):
            total += max(0, int(record["reached_step"]) - int(record["step"]))
            marked[int(record["step"])] = marked.get(int(record["step"]), 0) + 1
    resumed_at, reached = None, 0
    for record in [*moved, {"event": "superseded"}]:  # the sentinel closes the last block
        if record.get("event") == "superseded":
            if resumed_at is not None:
                if marked.get(resumed_at, 0) > 0:  # counted from its resume event
                    marked[resumed_at] -= 1
                else:
                    total += max(0, reached - resumed_at)
            resumed_at = int(record.get("resumed_at_step") or 0) if "resumed_at_step" in record else None
            reached = resumed_at or 0
        elif record.get("kind") == "train":
            reached = max(reached, int(record.get("step") or 0))
    return total


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# --- checkpoint interval -------------------------------------------------------------------------------


def interval_advice(
    save_cost_s: float | None, step_s: float | None, mtbf_hours: float, every_steps: int
) -> dict[str, Any] | None:
    """Young-Daly: the checkpoint interval that minimises the expected time lost to saves and to the
    work redone after a failure is sqrt(2 x save cost x MTBF). In steps, with the expected share of
    wall time lost (save cost / interval + interval / (2 MTBF)) at that interval and at the configured
    one, and a hint when checkpoint.every_steps is more than 2x away. None without an MTBF (0) or
    without a measured save cost or step time."""
    if mtbf_hours <= 0 or not _finite(save_cost_s) or not _finite(step_s) or not step_s or step_s <= 0:
        return None
    mtbf_s = mtbf_hours * 3600.0
    cost = max(float(save_cost_s), 1e-6)
    optimal_s = math.sqrt(2.0 * cost * mtbf_s)
    steps = max(1, round(optimal_s / step_s))

    def waste(interval_s: float) -> float:
        return cost / interval_s + interval_s / (2.0 * mtbf_s)

    advice: dict[str, Any] = {
        "mtbf_hours": mtbf_hours, "save_cost_s": cost, "step_time_s": step_s,
        "optimal_interval_s": optimal_s, "optimal_every_steps": steps,
        "expected_waste_at_optimal": waste(steps * step_s), "every_steps": every_steps,
        "expected_waste_at_every_steps": waste(every_steps * step_s) if every_steps else None,
    }  # fmt: skip
    far = every_steps == 0 or not 0.5 <= every_steps / steps <= 2.0
    current = f"checkpoint.every_steps = {every_steps}" if every_steps else "no periodic checkpoint"
    advice["hint"] = (
        f"{current} is far from the Young-Daly interval: save every {steps} steps "
        f"(sqrt(2 x {cost:.3g} s save cost x {mtbf_hours:g} h MTBF) = {optimal_s:,.0f} s at "
        f"{step_s:.3g} s per step); set checkpoint.every_steps = {steps}"
        if far
        else None
    )
    return advice


def run_goodput(train_dir: Path, mtbf_hours: float, every_steps: int) -> dict[str, Any] | None:
    """`goodput(train_dir)` with the checkpoint-interval advice under "checkpoint_interval"."""
    figures = goodput(train_dir)
    if figures is None:
        return None
    advice = interval_advice(figures["save_cost_s"], figures["step_time_p50_s"], mtbf_hours, every_steps)
    return {**figures, "checkpoint_interval": advice}


def say_interval_hint(figures: dict[str, Any] | None) -> None:
    """Print the checkpoint-interval hint at the end of a run, when there is one (rank 0)."""
    hint = ((figures or {}).get("checkpoint_interval") or {}).get("hint")
    if hint:
        say(f"hint: {hint}")
