"""Watchdog: a training step that makes no progress for T seconds becomes a crash with every stack dumped.

A hung collective, a dead data worker or a deadlocked lock otherwise burns the allocation silently.
The trainer calls `beat(step)` after every optimizer step; when no beat arrives for `timeout_s`
seconds, the watchdog writes a message and the stack of every thread (with thread names) to stderr
and to `log_path`, then ends the process with exit code WATCHDOG_EXIT_CODE, which a supervisor
(`smelt train --max-restarts N`) treats like any other crash: it resumes from the latest checkpoint.

Two layers, because a Python thread cannot run while another thread holds the GIL (a hang inside a
C extension that never releases it): the watchdog thread keeps faulthandler's C-level timer armed
a little past its own deadline, and that timer dumps the stacks and exits (code 1) even then.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TextIO

# Like GNU `timeout`: the process was ended for taking too long.
WATCHDOG_EXIT_CODE = 124
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
