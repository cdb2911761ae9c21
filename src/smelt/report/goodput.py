"""Goodput, after the fact: from a run's metrics files (metrics.jsonl and metrics.superseded.jsonl),
the wall time from the first process start to the end split into productive step time, work lost to
restarts (steps redone after a resume), the downtime between a crash and the resumed process,
checkpoint stalls, evaluation and the rest (start-up, logging); and the checkpoint interval
(`interval_advice`): Young-Daly, sqrt(2 x save cost x MTBF), from the measured checkpoint stall and
`checkpoint.mtbf_hours`. The records it reads are the trainer's (train/step_times.py times the steps);
the train stage adds these figures to the trainer's summary (run/training.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from smelt.metric_records import METRICS, read_records
from smelt.train.evaluation import say
from smelt.train.monitors import SUPERSEDED_METRICS


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
    kept = read_records(train_dir / METRICS)
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
