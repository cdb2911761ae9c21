"""Watchdog: a training step that makes no progress for T seconds becomes a crash with every stack dumped.

A hung collective, a dead data worker or a deadlocked lock otherwise burns the allocation silently.
The trainer calls `beat(step)` after every optimizer step; when no beat arrives for `timeout_s`
seconds, the watchdog writes a message and the stack of every thread (with thread names) to stderr
and to `log_path`, then ends the process with exit code WATCHDOG_EXIT_CODE, which a supervisor
(`smelt train --max-restarts N`) treats like any other crash: it resumes from the latest checkpoint.

Two layers, because a Python thread cannot run while another thread holds the GIL (a hang inside a
C extension that never releases it): the watchdog thread keeps faulthandler's C-level timer armed
a little past its own deadline, and that timer dumps the stacks and exits (code 1) even then.

The rest of a training process's life and death is here too:

- `StopSignals` and `stop_on_signal`: SIGTERM or SIGINT while training asks the run to stop. The
  step in progress finishes, every rank saves its checkpoint and waits for the commit, and the run
  ends with StopRequested (exit SIGNAL_EXIT_CODE, a message saying where it stopped), all within
  SMELT_STOP_GRACE_S seconds of the signal; past that bound it exits 128 + the signal number without
  them. Under torchrun the ranks agree on the step with one all-reduce of a flag per step.
- `die_with_parent`: a rank started by torchrun (or by `smelt train --max-restarts`) ends when its
  launcher does, even under SIGKILL, instead of training on alone and holding the run's lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from smelt import layout

# Like GNU `timeout`: the process was ended for taking too long.
WATCHDOG_EXIT_CODE = 124
# The run stopped itself in a way a restart would repeat (alerts.TrainingStopped): not retried.
STOPPED_EXIT_CODE = 3
# Stopped on SIGTERM or SIGINT after committing a checkpoint: run the same command again to go on
# (sysexits' EX_TEMPFAIL, "try again later"). Not retried by the supervisor.
SIGNAL_EXIT_CODE = 75
# How long a stop on a signal may take (the step in progress, then its checkpoint); SMELT_STOP_GRACE_S.
STOP_GRACE_S = 60.0
# A second signal this soon after the first is the same request again (a launcher forwarding it).
REPEAT_S = 2.0
# prctl(2): ask the kernel to send a signal when the parent process dies.
_PR_SET_PDEATHSIG = 1
# How long after the watchdog's own deadline the C-level backstop fires.
BACKSTOP_GRACE_S = 5.0


class Watchdog:
    """`Watchdog(timeout_s, log_path).start()`; `beat(step)` every step; `stop()` at the end.

    `timeout_s` <= 0 disables it (start/beat/stop do nothing), so callers need no branch for
    `train.watchdog_s = 0`. Also a context manager. Only one watchdog may run per process (the
    faulthandler timer is process-wide).
    """

    def __init__(
        self,
        timeout_s: float,
        log_path: Path | None = None,
        poll_s: float | None = None,
        backstop_grace_s: float = BACKSTOP_GRACE_S,
    ) -> None:
        self.timeout_s = float(timeout_s)
        self.backstop_grace_s = backstop_grace_s
        self.log_path = Path(log_path) if log_path is not None else None
        self.poll_s = poll_s if poll_s is not None else min(1.0, max(self.timeout_s / 4, 0.01))
        self._last_beat = time.monotonic()
        self._last_step: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.timeout_s > 0

    def start(self) -> Watchdog:
        if not self.enabled or self._thread is not None:
            return self
        self._last_beat = time.monotonic()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="smelt-watchdog", daemon=True)
        self._thread.start()
        return self

    def beat(self, step: int) -> None:
        # Two attribute stores: cheap enough for every step, and atomic under the GIL.
        self._last_step = step
        self._last_beat = time.monotonic()

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        faulthandler.cancel_dump_traceback_later()

    def __enter__(self) -> Watchdog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            silent = time.monotonic() - self._last_beat
            if silent >= self.timeout_s:
                self._fire(silent)
                return
            self._arm_backstop(self.timeout_s - silent + self.backstop_grace_s)

    def _arm_backstop(self, seconds: float) -> None:
        # Re-arming replaces the previous timer; it only fires if this thread stops getting the GIL.
        with contextlib.suppress(ValueError, AttributeError, OSError):  # no usable stderr descriptor
            faulthandler.dump_traceback_later(seconds, repeat=False, file=sys.__stderr__, exit=True)

    def message(self, silent_s: float) -> str:
        last = "no step finished yet" if self._last_step is None else f"last finished step {self._last_step}"
        return (
            f"\nsmelt: watchdog: no training progress for {silent_s:.1f} s (train.watchdog_s = "
            f"{self.timeout_s:g}; {last}). Dumping the stack of every thread and exiting with code "
            f"{WATCHDOG_EXIT_CODE}; `smelt train --max-restarts N` resumes from the latest checkpoint. "
            f"The stacks show where it hung (a collective, the data loader, I/O)."
        )

    def _fire(self, silent_s: float) -> None:
        faulthandler.cancel_dump_traceback_later()
        report = self.message(silent_s) + "\n\n" + format_all_stacks()
        streams: list[TextIO] = []
        if sys.__stderr__ is not None:
            streams.append(sys.__stderr__)
        log = None
        if self.log_path is not None:
            try:
                self.log_path.parent.mkdir(parents=True, exist_ok=True)
                log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed below, before _exit
                streams.append(log)
            except OSError as exc:
                print(f"smelt: watchdog: cannot write {self.log_path}: {exc}", file=sys.__stderr__)
        for stream in streams:
            try:
                stream.write(report)
                stream.write("\nfaulthandler (C-level view of the same threads):\n")
                stream.flush()
                # The C-level dump also shows frames of threads stuck in native code.
                faulthandler.dump_traceback(file=stream, all_threads=True)
                stream.flush()
            except (OSError, ValueError):
                pass
        if log is not None:
            log.close()
        os._exit(WATCHDOG_EXIT_CODE)


def format_all_stacks() -> str:
    """The Python stack of every live thread, with its name (faulthandler shows only thread ids)."""
    frames = sys._current_frames()
    blocks = []
    for thread in threading.enumerate():
        frame = frames.get(thread.ident) if thread.ident is not None else None
        header = f'Thread "{thread.name}" (id {thread.ident}{", daemon" if thread.daemon else ""}):'
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "  (no Python frame)\n"
        blocks.append(f"{header}\n{stack}")
    return "\n".join(blocks)


# --- stopping on SIGTERM / SIGINT -------------------------------------------------------------------


class StopRequested(Exception):
    """Training stopped on SIGTERM or SIGINT after committing the checkpoint of its last step; the
    CLI prints the message and exits with `exit_code`."""

    exit_code = SIGNAL_EXIT_CODE

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


def stop_grace_s() -> float:
    """SMELT_STOP_GRACE_S, or STOP_GRACE_S: how long a stop on a signal may take."""
    try:
        return float(os.environ.get("SMELT_STOP_GRACE_S") or STOP_GRACE_S)
    except ValueError:
        return STOP_GRACE_S


_active: StopSignals | None = None


class StopSignals:
    """While training: SIGTERM and SIGINT ask the run to stop after the step in progress (see
    stop_on_signal) instead of ending the process where it stands. A context manager; outside it the
    handlers before it are back. From the first signal, the process ends within `grace_s` seconds
    whatever happens (exit 128 + the signal number). The same signal again within REPEAT_S seconds is
    the same request (a launcher forwarding it); later, a second signal stops at once, as it would
    without this. A signal that arrives after the last step (the final validation and checkpoint)
    is delivered again once training is over. Only the main thread can set handlers: elsewhere
    signals keep theirs."""

    def __init__(self, grace_s: float | None = None) -> None:
        self.grace_s = stop_grace_s() if grace_s is None else grace_s
        self.signum: int | None = None
        self._first = 0.0
        self._previous: dict[int, Any] = {}
        self._over = threading.Event()

    def __enter__(self) -> StopSignals:
        global _active
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[signum] = signal.signal(signum, self._handle)
            except ValueError:  # not the main thread
                break
        _active = self
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        global _active
        _active = None
        self._over.set()
        self._restore()
        if kind is None and self.signum is not None:  # training finished meanwhile: stop now
            _tell(
                f"training finished before it could stop; stopping now ({signal.Signals(self.signum).name})"
            )
            signal.raise_signal(self.signum)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.signum is None:
            self.signum, self._first = signum, time.monotonic()
            _tell(
                f"{name}: finishing the step in progress, saving its checkpoint and stopping (within "
                f"{self.grace_s:g} s, SMELT_STOP_GRACE_S; send {name} again to stop at once)"
            )
            threading.Thread(target=self._bound, args=(signum,), name="smelt-stop", daemon=True).start()
            return
        if time.monotonic() - self._first < REPEAT_S:
            return
        self._restore()  # a second request: what the signal does without this handler
        signal.raise_signal(signum)

    def _bound(self, signum: int) -> None:
        if self._over.wait(self.grace_s):
            return
        name = signal.Signals(signum).name
        _tell(
            f"the step in progress and its checkpoint did not finish within {self.grace_s:g} s of {name} "
            f"(SMELT_STOP_GRACE_S); exiting without them (exit {128 + signum}). The next run resumes from "
            f"the newest committed checkpoint.",
            every_rank=True,
        )
        os._exit(128 + signum)


def stop_on_signal(trainer: Any, step: int) -> None:
    """The trainer's check after each step's records: when a rank got SIGTERM or SIGINT, every rank
    saves the checkpoint of `step`, waits for its commit, writes the run's end record (status
    "stopped") and raises StopRequested. Under torchrun the ranks take the decision together (one
    all-reduce of the signal number per step), so they stop after the same step."""
    t = trainer
    signum = _active.signum if _active is not None and _active.signum is not None else 0
    if t.ctx.distributed:
        import torch
        import torch.distributed as dist

        flag = torch.tensor(
            [signum], dtype=torch.int32, device=t.device if t.device.type == "cuda" else "cpu"
        )
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        signum = int(flag.item())
    if not signum:
        return
    t.checkpoint(step)  # the same save as the loop's own, had one been due at this step
    t.write_all(t.checkpointer.wait())
    name, path = signal.Signals(signum).name, t.checkpoints_dir / layout.step_dir_name(step)
    t.metrics.write({"kind": "event", "step": step, "tokens": t.plan.tokens_at(step), "event": "end",
                     "status": "stopped", "reason": "signal", "signal": name, "checkpoint": str(path),
                     "wall_time_s": time.time() - t.started, "time": time.time()})  # fmt: skip
    raise StopRequested(
        f"training stopped by {name} after step {step} of {t.plan.steps}; its checkpoint {path} is committed. "
        f"Run the same command again to continue from it (an interrupted train stage resumes from its "
        f"newest checkpoint).",
        signum,
    )


def _tell(message: str, every_rank: bool = False) -> None:
    # Always shown (also under SMELT_QUIET): the operator asked for the stop and must see what it does.
    rank, stream = os.environ.get("RANK", "0"), sys.__stderr__
    if stream is None or (rank not in ("", "0") and not every_rank):
        return
    tag = f"[rank {rank}] " if rank not in ("", "0") else ""
    start = "\n" if stream.isatty() else ""  # below the progress bar's line, not at its end
    print(f"{start}smelt: {tag}{message}", file=stream, flush=True)


# --- dying with the launcher ------------------------------------------------------------------------


def launched() -> bool:
    """Whether this process is a rank started by torchrun or a child of `smelt train --max-restarts`."""
    return bool(os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("SMELT_ATTEMPT"))


_parent_watch: int | None = None


def die_with_parent(poll_s: float = 1.0) -> None:
    """End this process (SIGKILL) when its parent, the launcher, dies.

    torchrun starts its ranks in sessions of their own, so a SIGKILL of torchrun (or of its process
    group) never reaches them: they trained on alone, and rank 0 kept the run's lock. On Linux the
    kernel sends the signal (prctl PR_SET_PDEATHSIG); elsewhere a daemon thread checks every `poll_s`
    seconds whether the parent is still the one it had at the call. A parent that dies between that
    look and the prctl call is caught by the same comparison; call this early. Idempotent."""
    global _parent_watch
    if _parent_watch is not None:
        return
    _parent_watch = parent = os.getppid()
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # the parent died before the kernel was told
                    os.kill(os.getpid(), signal.SIGKILL)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="smelt-parent-watch", daemon=True).start()
