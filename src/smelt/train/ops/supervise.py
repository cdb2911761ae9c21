"""`smelt train CONFIG --max-restarts N`: relaunch a crashed training run from its latest checkpoint.

The supervisor runs the training command as a child process. When the child dies (a crash, an
out-of-memory kill, the watchdog), it waits an exponential backoff and launches the same command
again; the train stage resumes an interrupted run from the latest committed checkpoint on its own.
Bad input (exit code 2) is not retried: the same config fails the same way. Nor is a run that
stopped itself on purpose (an `on_* = "stop"` alert, too many skipped steps in a row, non-finite
weights): the child exits with STOPPED_EXIT_CODE and its end record in metrics.jsonl says
`"deterministic": true`, since a restart from the last checkpoint would replay the same data to the
same stop; the supervisor then exits with STOPPED_EXIT_CODE too. A child stopped by SIGTERM or SIGINT
after committing a checkpoint (SIGNAL_EXIT_CODE) is not relaunched either. Nor is a crash when the
disk holding the checkpoints has less room than one checkpoint takes: the next save would fail the
same way (exit code 1, saying so). After N restarts it gives up with a summary and exit code 1.

Every launch and exit goes to RUN/restarts.jsonl (the child owns RUN/train/metrics.jsonl). The
child sees SMELT_ATTEMPT=1, 2, ... in its environment.

`smelt train CONFIG --resume-from STEP` (prepare_resume_from) continues an interrupted run from an
earlier checkpoint than its newest: the later ones move to train/checkpoints/superseded/, so the
stage's ordinary resume, and every restart after it, starts from STEP.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from smelt import layout
from smelt.checkpoint.store import (
    SUPERSEDED,
    checkpoint_at_step,
    latest_checkpoint,
    read_meta,
    set_aside_after,
)
from smelt.config import Config
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS
from smelt.metric_records import METRICS, read_records
from smelt.progress import log
from smelt.train.ops.watchdog import SIGNAL_EXIT_CODE, STOPPED_EXIT_CODE, WATCHDOG_EXIT_CODE, stop_grace_s

RESTARTS_LOG = "restarts.jsonl"
DEFAULT_BACKOFF_S = 5.0
MAX_BACKOFF_S = 300.0
BAD_INPUT_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130
# How much of the end of metrics.jsonl is read for the child's end record.
_TAIL_BYTES = 1 << 16


def backoff_s(restart: int, base_s: float, cap_s: float = MAX_BACKOFF_S) -> float:
    """Seconds to wait before restart number `restart` (1-based): base, 2 base, 4 base, ... capped."""
    return min(cap_s, base_s * 2 ** (restart - 1)) if base_s > 0 else 0.0


def describe_exit(code: int) -> str:
    """A few words on why a child ended, from its exit code."""
    if code == 0:
        return "finished"
    if code == 1:
        return "failed (the traceback above says where)"
    if code == BAD_INPUT_EXIT_CODE:
        return "bad input (the message above names the key or file)"
    if code == STOPPED_EXIT_CODE:
        return "stopped itself (an alert, skipped steps or non-finite weights; the message above says which)"
    if code == SIGNAL_EXIT_CODE:
        return "stopped by SIGTERM or SIGINT after committing a checkpoint"
    if code == WATCHDOG_EXIT_CODE:
        return "stopped by the watchdog (no progress; stacks in the log)"
    if code == INTERRUPTED_EXIT_CODE:
        return "interrupted"
    number = -code if code < 0 else code - 128 if 128 < code < 160 else None
    if number is not None:
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        hint = " (often the out-of-memory killer)" if name == "SIGKILL" else ""
        return f"killed by {name}{hint}"
    return f"exited with code {code}"


@dataclass
class Outcome:
    """What supervise() did: one exit code per launch, and the checkpoint step it ended at."""

    exit_code: int
    exit_codes: list[int] = field(default_factory=list)
    last_step: int | None = None

    @property
    def attempts(self) -> int:
        return len(self.exit_codes)


def checkpoint_step(checkpoints_dir: Path) -> tuple[int | None, Path | None]:
    """Step of the latest committed checkpoint, without hashing it (the child verifies on load)."""
    path = latest_checkpoint(checkpoints_dir)
    if path is None:
        return None, None
    try:
        return int(read_meta(path, verify=False)["step"]), path
    except (UserError, KeyError, TypeError, ValueError):
        return None, path


def last_event(metrics_path: Path, event: str) -> dict[str, Any] | None:
    """The last `event` record in the tail of metrics.jsonl, or None."""
    try:
        records = read_records(metrics_path, tail_bytes=_TAIL_BYTES)
    except OSError:
        return None
    return next((record for record in reversed(records) if record.get("event") == event), None)


def deterministic_stop(metrics_path: Path, since: float) -> dict[str, Any] | None:
    """The end record of a run that stopped itself in a way a restart would repeat, when it is the
    last end record of `metrics_path` and was written at or after `since` (a wall-clock time); else
    None. Only the file's tail is read; the events of a save that committed while the run was
    closing may follow the end record."""
    record = last_event(metrics_path, "end")
    if record is None or float(record.get("time") or 0.0) < since:
        return None
    return record if record.get("deterministic") is True else None


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def short_of_space(checkpoints_dir: Path) -> tuple[int, int, str] | None:
    """(free bytes, bytes of one checkpoint, which checkpoint) when the filesystem that holds
    `checkpoints_dir` has less room than one checkpoint takes, so the next save would fail; else None.
    One checkpoint's size is the newest committed one's or, before any was committed, what the last
    save that failed needed (its checkpoint_failed event in metrics.jsonl)."""
    _, newest = checkpoint_step(checkpoints_dir)
    if newest is not None:
        needed, which = directory_bytes(newest), newest.name
    else:
        failed = last_event(checkpoints_dir.parent / METRICS, "checkpoint_failed")
        if failed is None or not failed.get("needed_mb"):
            return None
        needed, which = (
            int(float(failed["needed_mb"]) * 1e6),
            f"the step {failed.get('step')} save that failed",
        )
    where = checkpoints_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free
    return (free, needed, which) if free < needed else None


def supervise(
    command: Sequence[str],
    checkpoints_dir: Path,
    log_path: Path,
    max_restarts: int,
    backoff_base_s: float = DEFAULT_BACKOFF_S,
    backoff_max_s: float = MAX_BACKOFF_S,
    restart_command: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    sleep: Callable[[float], object] | None = None,
) -> Outcome:
    """Run `command` and relaunch `restart_command` (default: the same) after each crash, at most
    `max_restarts` times. Returns the Outcome; its exit_code is 0 on success, 1 after giving up,
    2 for bad input, STOPPED_EXIT_CODE when the run stopped itself in a way a restart would repeat
    (its exit code or its end record in checkpoints_dir/../metrics.jsonl says so), SIGNAL_EXIT_CODE
    when the child stopped on SIGTERM or SIGINT with its checkpoint committed, 128 + the signal number
    when stopped otherwise by SIGINT or SIGTERM, 1 (without relaunching) when the disk lacks room for
    one checkpoint. `sleep` replaces the backoff wait (tests); by default a SIGTERM cuts
    the wait short."""
    if max_restarts < 0:
        raise UserError(f"--max-restarts {max_restarts} must be 0 or more.")
    if backoff_base_s < 0:
        raise UserError(f"--restart-backoff {backoff_base_s} must be 0 or more seconds.")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    outcome = Outcome(exit_code=1)
    no_space = False  # stopped short of the restarts left, for want of disk space
    stopping: list[int] = []  # signal numbers received; a stopping supervisor launches nothing new
    woken = threading.Event()
    child: subprocess.Popen | None = None

    def forward(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        woken.set()
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    previous = _install(signal.SIGTERM, forward)
    try:
        attempt = 0
        while True:
            attempt += 1
            step, path = checkpoint_step(checkpoints_dir)
            argv = list(command if attempt == 1 or restart_command is None else restart_command)
            _record(log_path, {"event": "launch", "attempt": attempt, "resume_step": step,
                               "checkpoint": str(path) if path else None, "command": argv})  # fmt: skip
            started, launched_at = time.monotonic(), time.time()
            child = subprocess.Popen(argv, env={**(env or os.environ), "SMELT_ATTEMPT": str(attempt)})
            try:
                code = child.wait()
            except KeyboardInterrupt:  # Ctrl-C reached the child too (same process group)
                stopping.append(signal.SIGINT)
                code = _wait_after_interrupt(child)
            outcome.exit_codes.append(code)
            outcome.last_step, _ = checkpoint_step(checkpoints_dir)
            _record(log_path, {"event": "exit", "attempt": attempt, "exit_code": code,
                               "reason": describe_exit(code), "duration_s": round(time.monotonic() - started, 3),
                               "checkpoint_step": outcome.last_step})  # fmt: skip
            if code == 0:
                outcome.exit_code = 0
                break
            if code == SIGNAL_EXIT_CODE:  # a stop someone asked for; the checkpoint is committed
                outcome.exit_code = SIGNAL_EXIT_CODE
                _say(
                    f"supervisor: not restarting: training stopped on a signal after committing its checkpoint "
                    f"of step {outcome.last_step}; run the same command again to continue from it"
                )
                break
            if stopping or code == INTERRUPTED_EXIT_CODE:
                outcome.exit_code = 128 + (stopping[0] if stopping else signal.SIGINT)
                _say(f"supervisor: stopping after a signal; attempt {attempt} {describe_exit(code)}")
                break
            if code == BAD_INPUT_EXIT_CODE:
                outcome.exit_code = BAD_INPUT_EXIT_CODE
                _say("supervisor: not restarting: a run that stops on bad input fails the same way again")
                break
            stop = deterministic_stop(checkpoints_dir.parent / METRICS, launched_at - 1.0)
            if stop is not None or code == STOPPED_EXIT_CODE:
                stop = stop or {}
                outcome.exit_code = STOPPED_EXIT_CODE
                _record(log_path, {"event": "deterministic_stop", "attempt": attempt, "step": stop.get("step"),
                                   "reason": stop.get("reason")})  # fmt: skip
                at = f" at step {stop['step']} ({stop.get('reason')};" if "step" in stop else " (exit 3;"
                _say(
                    f"supervisor: not restarting: the run stopped itself{at} the message above says why), and a "
                    f"restart from its last checkpoint would replay the same data to the same stop"
                )
                break
            restart = attempt  # restarts so far + 1
            if restart > max_restarts:
                outcome.exit_code = 1
                break
            short = short_of_space(checkpoints_dir)
            if short is not None:
                free, needed, which = short
                outcome.exit_code, no_space = 1, True
                _record(log_path, {"event": "no_space", "attempt": attempt, "free_mb": round(free / 1e6, 1),
                                   "needed_mb": round(needed / 1e6, 1), "checkpoint": which})  # fmt: skip
                resume = (
                    f"from step {outcome.last_step}" if outcome.last_step is not None else "from the start"
                )
                _say(
                    f"supervisor: not restarting: {free / 1e6:.1f} MB free on the disk of {checkpoints_dir}, "
                    f"less than one checkpoint takes ({needed / 1e6:.1f} MB, {which}), so the next save would "
                    f"fail the same way. Free disk space (or set run.dir to a disk with room), then run the "
                    f"same command again: it resumes {resume}."
                )
                break
            wait = backoff_s(restart, backoff_base_s, backoff_max_s)
            _say(
                f"supervisor: attempt {attempt} {describe_exit(code)} (exit code {code}); restart "
                f"{restart}/{max_restarts} in {wait:g} s from "
                + (f"checkpoint step {outcome.last_step}" if outcome.last_step is not None else "the start")
            )
            _record(log_path, {"event": "restart", "restart": restart, "max_restarts": max_restarts,
                               "backoff_s": wait, "resume_step": outcome.last_step})  # fmt: skip
            try:
                (sleep or woken.wait)(wait)
            except KeyboardInterrupt:
                stopping.append(signal.SIGINT)
            if stopping:
                outcome.exit_code = 128 + stopping[0]
                break
    finally:
        if previous is not None:
            _install(signal.SIGTERM, previous)

    gave_up = outcome.exit_code == 1 and not no_space
    summary = {
        "event": "done" if outcome.exit_code == 0 else "gave_up" if gave_up else "stopped",
        "attempts": outcome.attempts,
        "restarts": outcome.attempts - 1,
        "exit_codes": outcome.exit_codes,
        "last_step": outcome.last_step,
    }
    _record(log_path, summary)
    if gave_up:
        _say(
            f"supervisor: giving up after {outcome.attempts} attempts ({max_restarts} restarts); exit codes "
            f"{outcome.exit_codes}; latest checkpoint step {outcome.last_step}. The log of each attempt is "
            f"above; restarts are recorded in {log_path}."
        )
    elif outcome.exit_code == 0 and outcome.attempts > 1:
        _say(f"supervisor: finished after {outcome.attempts} attempts (exit codes {outcome.exit_codes})")
    return outcome


def child_command(
    config: str | Path,
    overrides: Sequence[str],
    first: bool,
    force: bool = False,
    restart: bool = False,
    resume_from: int | None = None,
) -> list[str]:
    """The `smelt train` command line of one attempt.

    --force, --restart and --resume-from only on the first attempt: a restart must continue the run
    from its newest checkpoint, never start it over or rewind it.
    """
    argv = [sys.executable, "-m", "smelt.cli", "train", str(config)]
    for item in overrides:
        argv += ["--set", item]
    if first and force:
        argv.append("--force")
    if first and restart:
        argv.append("--restart")
    if first and resume_from is not None:
        argv += ["--resume-from", str(resume_from)]
    return argv


def prepare_resume_from(cfg: Config, step: int, restart: bool = False) -> list[Path]:
    """`smelt train CONFIG --resume-from STEP`, before the train stage runs: check that STEP is a
    committed, intact checkpoint of an interrupted run and move every later step directory to
    checkpoints/superseded/ (kept, not deleted), so the stage resumes from STEP. Rank 0 alone moves;
    returns where the moved directories went."""
    from smelt.manifest import read_manifest

    train_dir = layout.stage_dir(cfg.run_dir, "train")
    if restart:
        raise UserError(
            f"--resume-from {step} continues the run from a checkpoint, and --restart/--force start it over "
            f"from step 0: pass one of them."
        )
    if read_manifest(train_dir) is not None:
        raise UserError(
            f"--resume-from {step}: the train stage in {train_dir} is finished, and --resume-from continues an "
            f"interrupted run. To train on from step {step} under a changed plan, fork a new run from that "
            f"checkpoint: `smelt train CONFIG --from {cfg.run_dir}:{step} --set run.name=NEW_NAME`."
        )
    checkpoints_dir = train_dir / CHECKPOINTS
    checkpoint_at_step(checkpoints_dir, step)
    if int(os.environ.get("RANK", "0")) != 0:
        return []
    moved = set_aside_after(checkpoints_dir, step)
    if moved:
        log(
            f"--resume-from {step}: {len(moved)} later checkpoint directories moved to "
            f"{checkpoints_dir / SUPERSEDED} ({', '.join(p.name for p in moved)})"
        )
    return moved


def run_supervised(
    config: str | Path,
    overrides: Sequence[str],
    max_restarts: int,
    backoff_base_s: float = DEFAULT_BACKOFF_S,
    force: bool = False,
    restart: bool = False,
    resume_from: int | None = None,
) -> int:
    """`smelt train CONFIG --max-restarts N [--restart-backoff S]`: train in a supervised child."""
    from smelt.config import load_config

    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise UserError(
            "--max-restarts supervises a single-process run; under torchrun use torchrun's own "
            "--max-restarts (the train stage resumes from the latest checkpoint on each restart)."
        )
    cfg = load_config(config, list(overrides))  # bad config: fail here, before any launch
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    flags = {"force": force, "restart": restart, "resume_from": resume_from}
    outcome = supervise(
        child_command(config, overrides, first=True, **flags),
        layout.checkpoints_dir(cfg.run_dir),
        cfg.run_dir / RESTARTS_LOG,
        max_restarts,
        backoff_base_s=backoff_base_s,
        restart_command=child_command(config, overrides, first=False, **flags),
    )
    return outcome.exit_code


def _wait_after_interrupt(child: subprocess.Popen) -> int:
    # The child got the Ctrl-C too: it finishes its step and saves (within its stop grace), then ends.
    try:
        return child.wait(timeout=stop_grace_s() + 10)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        child.kill()
        return child.wait()


def _install(signum: int, handler: Any) -> Any:
    # signal handlers can only be set from the main thread; elsewhere, run without forwarding.
    try:
        return signal.signal(signum, handler)
    except ValueError:
        return None


def _record(path: Path, event: dict[str, Any]) -> None:
    event = {"time": datetime.now(timezone.utc).isoformat(timespec="seconds"), **event}
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(event) + "\n")


def _say(message: str) -> None:
    # Always shown, even under SMELT_QUIET: a restart is something the operator must see.
    print(f"smelt: {message}", file=sys.stderr, flush=True)
