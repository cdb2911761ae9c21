"""`smelt checkpoint drill RUN`: prove that the newest checkpoint restores the run.

A side process (`python -m smelt.train.replay`, so nothing of it touches this process's torch state
or the run) resumes the newest committed checkpoint that has logged steps after it into a scratch
directory, runs the next steps as the trainer would, and this side compares their losses, window by
window, with the train records of the run's metrics.jsonl (each record's loss is the mean over its log
window; a window is compared when it starts after the checkpoint and the drill ran all its steps).
The gradient norm of each window's last step is compared too.

On the CPU in fp32 with the run's world size of one process the replay is bitwise, so the drill asks
for equality; otherwise (a GPU, bf16/fp16, or a run on several processes, which the side process
replays on one) it allows a relative tolerance and says which. Exit 0 on a match, 1 on a mismatch or a
side process that failed, 2 on a user error (no run, no checkpoint with logged steps after it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt.checkpoint.store import list_checkpoints, read_meta
from smelt.checkpoint.tools import checkpoints_dir_of
from smelt.errors import UserError
from smelt.layout import step_of
from smelt.metric_records import METRICS, read_records

# Relative tolerances where the replay is not bitwise (a guide; --tolerance sets another).
TOLERANCE_FP32 = 1e-4
TOLERANCE_LOW_PRECISION = 2e-2
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")  # fmt: skip


@dataclass
class Window:
    """A logged train record: steps first..last, its mean loss and its last step's gradient norm."""

    first: int
    last: int
    loss: float | None
    grad_norm: float | None
    replayed_loss: float | None = None
    replayed_norm: float | None = None


@dataclass
class DrillResult:
    checkpoint: Path
    steps: int
    exact: bool
    tolerance: float
    windows: list[Window] = field(default_factory=list)
    why_tolerance: str = ""

    @property
    def worst(self) -> float:
        """The largest relative difference over the compared losses and gradient norms."""
        diffs = [_relative(w.loss, w.replayed_loss) for w in self.windows]
        diffs += [_relative(w.grad_norm, w.replayed_norm) for w in self.windows]
        return max(diffs, default=0.0)

    @property
    def passed(self) -> bool:
        return bool(self.windows) and (self.worst == 0.0 if self.exact else self.worst <= self.tolerance)


def _relative(logged: float | None, replayed: float | None) -> float:
    if logged is None and replayed is None:
        return 0.0
    if logged is None or replayed is None:
        return float("inf")
    if logged == replayed:
        return 0.0
    return abs(replayed - logged) / max(abs(logged), 1e-12)


def logged_windows(records: list[dict[str, Any]]) -> list[Window]:
    """Every train record as the window of steps it averages (from the step after the previous one)."""
    windows, previous = [], 0
    for record in records:
        if record.get("kind") != "train":
            continue
        step = int(record["step"])
        windows.append(Window(previous + 1, step, record.get("loss"), record.get("grad_norm")))
        previous = step
    return windows


def choose_checkpoint(checkpoints: Path, windows: list[Window], step: int | None) -> Path:
    """The checkpoint of `step`, or the newest committed one with a whole logged window after it."""
    committed = list_checkpoints(checkpoints)
    if step is not None:
        chosen = [p for p in committed if step_of(p) == step]
        if not chosen:
            steps = ", ".join(str(step_of(p)) for p in committed) or "none"
            raise UserError(
                f"no committed checkpoint of step {step} under {checkpoints} (committed: {steps})."
            )
        if not any(w.first > step for w in windows):
            raise UserError(f"metrics.jsonl has no train record after step {step}: nothing to compare with.")
        return chosen[0]
    for path in reversed(committed):
        if any(w.first > step_of(path) for w in windows):
            return path
    newest = step_of(committed[-1]) if committed else None
    raise UserError(
        f"no committed checkpoint under {checkpoints} has logged steps after it (the newest is step "
        f"{newest}, the last logged step is {windows[-1].last if windows else 'none'}), so there is "
        f"nothing to replay against. Save checkpoints during the run (checkpoint.every_steps) and keep "
        f"more than the final one (checkpoint.keep_last), or pass --step."
    )


def drill_config(meta: dict[str, Any], start: dict[str, Any]) -> tuple[dict[str, Any], bool, str]:
    """The side process's config (the checkpoint's, on one process, without sinks or in-loop tasks),
    whether its replay is bitwise, and why not."""
    config = json.loads(json.dumps(meta["config"]))
    train, evaluation = config.setdefault("train", {}), config.setdefault("eval", {})
    train.update({"tensorboard": False, "wandb_project": "", "watchdog_s": 0.0})
    evaluation["every_steps"] = 0
    device = str(start.get("device") or train.get("device") or "cpu")
    train["device"] = "cpu" if device.startswith("cpu") else device
    reasons = []
    world = int(meta.get("world_size") or 1)
    if world > 1:
        train.update({"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1, "data_parallel": 0,
                      "expert_parallel": 1, "parallel": "ddp"})  # fmt: skip
        if start.get("batch_tokens"):
            train["batch_tokens"] = int(start["batch_tokens"])
        reasons.append(f"the run trained on {world} processes, the drill replays on one")
    if not device.startswith("cpu"):
        reasons.append(f"the run trained on {device}")
    precision = str(meta.get("precision") or "fp32")
    if precision != "fp32":
        reasons.append(f"in {precision}")
    return config, not reasons, "; ".join(reasons)


def run_drill(
    run: str | Path, steps: int | None = None, step: int | None = None, tolerance: float | None = None
) -> DrillResult:
    """Replay the steps after a checkpoint of `run` in a side process and compare them with its log."""
    checkpoints = checkpoints_dir_of(run)
    train_dir = checkpoints.parent
    metrics = train_dir / METRICS
    if not metrics.is_file():
        raise UserError(f"{metrics} does not exist: the drill compares against the run's log.")
    records = read_records(metrics)
    windows = logged_windows(records)
    checkpoint = choose_checkpoint(checkpoints, windows, step)
    at = step_of(checkpoint)
    run_dir = train_dir.parent
    tokens, tokenizer = run_dir / "tokens", run_dir / "tokenizer"
    for needed in (tokens, tokenizer):
        if not needed.is_dir():
            raise UserError(
                f"{needed} does not exist: the drill replays on the run's own tokens and tokenizer."
            )
    after = [w for w in windows if w.first > at]
    count = steps if steps is not None else after[0].last - at
    if count < 1:
        raise UserError(f"--steps {count}: the drill needs at least one step.")
    meta = read_meta(checkpoint, verify=False)
    start = next((r for r in records if r.get("event") in ("start", "resume")), {})
    config, exact, why = drill_config(meta, start)
    precision = str(meta.get("precision") or "fp32")
    default = TOLERANCE_FP32 if precision == "fp32" else TOLERANCE_LOW_PRECISION
    result = DrillResult(checkpoint, count, exact and tolerance is None,
                         tolerance if tolerance is not None else (0.0 if exact else default), why_tolerance=why)  # fmt: skip
    replayed = {s["step"]: s for s in side_process(config, checkpoint, tokens, tokenizer, count)["steps"]}
    for window in after:
        if window.last > at + count:
            break
        losses = [replayed[s]["loss"] for s in range(window.first, window.last + 1)]
        finite = [loss for loss in losses if loss == loss and abs(loss) != float("inf")]
        window.replayed_loss = sum(finite) / len(finite) if finite else None  # the trainer's window mean
        norm = replayed[window.last]["grad_norm"]
        window.replayed_norm = norm if norm == norm and abs(norm) != float("inf") else None
        result.windows.append(window)
    return result


def side_process(
    config: dict[str, Any], checkpoint: Path, tokens: Path, tokenizer: Path, steps: int, **extra: Any
) -> dict[str, Any]:
    """Run `python -m smelt.train.replay` on one process; its result ({"steps": [...], ...}). `extra`
    goes into the request (a spike's triage asks for "probe_step")."""
    with tempfile.TemporaryDirectory(prefix="smelt-drill-") as scratch:
        request, result = Path(scratch) / "request.json", Path(scratch) / "result.json"
        request.write_text(json.dumps({
            "config": config, "checkpoint": str(checkpoint), "tokens": str(tokens),
            "tokenizer": str(tokenizer), "steps": steps, "scratch": str(Path(scratch) / "train"), **extra,
        }), encoding="utf-8")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}  # one process, never a group
        done = subprocess.run(
            [sys.executable, "-m", "smelt.train.replay", str(request), str(result)],
            env={**env, "SMELT_QUIET": "1"}, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0 or not result.is_file():
            raise DrillFailed(f"the side process failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(result.read_text(encoding="utf-8"))


class DrillFailed(RuntimeError):
    """The side process could not replay the checkpoint (exit 1, not a user error)."""


def drill_report(result: DrillResult) -> str:
    """The table of compared windows and the verdict line."""

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.9g}"

    at = step_of(result.checkpoint)
    lines = [f"checkpoint {result.checkpoint} (step {at}); replayed steps {at + 1}-{at + result.steps} in a side process",
             f"{'steps':<12} {'logged loss':>14} {'drill loss':>14} {'logged norm':>14} {'drill norm':>14}  rel diff"]  # fmt: skip
    for w in result.windows:
        diff = max(_relative(w.loss, w.replayed_loss), _relative(w.grad_norm, w.replayed_norm))
        lines.append(f"{f'{w.first}-{w.last}':<12} {fmt(w.loss):>14} {fmt(w.replayed_loss):>14} "
                     f"{fmt(w.grad_norm):>14} {fmt(w.replayed_norm):>14}  {diff:.2e}")  # fmt: skip
    if not result.windows:
        lines.append(
            f"no logged window lies wholly within the {result.steps} replayed steps: pass more --steps"
        )
    how = "exactly (CPU fp32, one process: the replay is bitwise)" if result.exact else (
        f"within a relative tolerance of {result.tolerance:g}" + (f" ({result.why_tolerance})" if result.why_tolerance else ""))  # fmt: skip
    verdict = "PASS" if result.passed else "FAIL"
    lines.append(f"{verdict}: {len(result.windows)} logged window(s) after step {at} "
                 f"{'match' if result.passed else 'do not match'} {how}; largest relative difference "
                 f"{result.worst:.2e}")  # fmt: skip
    return "\n".join(lines)
