"""The trainer's own triage of its spikes (train.spike_triage), without holding training up.

Rank 0 queues each step whose alerts include a loss or gradient spike (at most `MAX_PER_RUN` a run: a
diverging run spikes at every step, and `smelt train triage RUN --step N` triages any other). Where it
runs them:

- "side": one at a time in a side process (`python -m smelt.train.spikes`) started as soon as a
  committed checkpoint precedes the spike; the loop polls it after every step and writes the
  `spike_triage` event to metrics.jsonl when its file `train/spikes/step_NNNNNNN.json` is there;
- "end": one after another when the training loop is done, before the final record (on a GPU a second
  copy of the model and its optimizer would compete with training for the device's memory);
- "auto" (the default): "side" when the run trains on the CPU, "end" otherwise; "off": never.

Spikes still queued or running when the loop ends are finished before the end record, the watchdog
(train.watchdog_s) fed while it waits; a run that fails leaves a running triage to finish its file on
its own. A spike with no committed checkpoint before it cannot be replayed; its event says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from smelt.checkpoint.drill import _LAUNCH_VARS
from smelt.layout import CHECKPOINTS, list_checkpoints, step_of
from smelt.train.evaluation import say
from smelt.train.spikes import SPIKE_ALERTS, spike_path

MAX_PER_RUN = 4


class SpikeTriage:
    """Queue, run and report the triage of a run's spikes (rank 0; a no-op elsewhere or when "off")."""

    def __init__(self, mode: str, train_dir: Path, device_type: str, is_main: bool) -> None:
        if mode == "auto":
            mode = "side" if device_type == "cpu" else "end"
        self.mode = mode if is_main else "off"
        self.train_dir = Path(train_dir)
        self.queue: list[tuple[int, Path]] = []  # (spike step, alerts file)
        self.running: tuple[int, Path, subprocess.Popen] | None = None
        self.count = 0
        self.beat: Any = None  # the watchdog's beat, called while the end waits for a triage

    @classmethod
    def of(cls, trainer: Any) -> SpikeTriage:
        triage = cls(trainer.tc.spike_triage, trainer.out_dir, trainer.device.type, trainer.ctx.is_main)
        triage.beat = lambda step: getattr(trainer, "watchdog", None) and trainer.watchdog.beat(step)
        return triage

    def step(self, step: int, tokens: int, decision: Any) -> list[dict[str, Any]]:
        """Queue this step when it spiked; in "side" mode start the next triage and report finished ones."""
        if self.mode == "off":
            return []
        spikes = [a for a in decision.alerts if a.kind in SPIKE_ALERTS]
        records = []
        if spikes and self.count < MAX_PER_RUN:
            self.count += 1
            alerts = [{"event": "alert", "step": step, "alert": a.kind, "value": a.value, "threshold": a.threshold,
                       "message": a.message} for a in spikes]  # fmt: skip
            path = spike_path(self.train_dir, step).with_suffix(".alerts.json")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(alerts), encoding="utf-8")
            self.queue.append((step, path))
        if self.mode == "side":
            records += self._poll(step, tokens)
            self._start_next(step, tokens, records)
        return records

    def finish(self, step: int, tokens: int) -> list[dict[str, Any]]:
        """Run what is queued and wait for it: the events of every triage not reported yet."""
        records: list[dict[str, Any]] = []
        if self.mode == "off":
            return records
        while self.running is not None or self.queue:
            if self.running is not None:
                while self.running[2].poll() is None:  # a long wait is no hang: keep the watchdog fed
                    time.sleep(0.5)
                    if self.beat is not None:
                        self.beat(step)
            records += self._poll(step, tokens)
            self._start_next(step, tokens, records)
        return records

    def _start_next(self, step: int, tokens: int, records: list[dict[str, Any]]) -> None:
        if self.running is not None or not self.queue:
            return
        spike, alerts = self.queue.pop(0)
        if not any(step_of(p) < spike for p in list_checkpoints(self.train_dir / CHECKPOINTS)):
            records.append(self._event(step, tokens, {"step": spike, "label": None, "error": (
                f"no committed checkpoint before step {spike}: the spike cannot be replayed "
                f"(checkpoint.every_steps)")}))  # fmt: skip
            return
        env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}
        log = spike_path(self.train_dir, spike).with_suffix(".log")
        with open(log, "w", encoding="utf-8") as handle:
            process = subprocess.Popen(
                [sys.executable, "-m", "smelt.train.spikes", str(self.train_dir), str(spike), str(alerts)],
                env={**env, "SMELT_QUIET": "1"}, stdout=handle, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.running = (spike, alerts, process)

    def _poll(self, step: int, tokens: int) -> list[dict[str, Any]]:
        if self.running is None or self.running[2].poll() is None:
            return []
        spike, alerts, process = self.running
        self.running = None
        alerts.unlink(missing_ok=True)
        path = spike_path(self.train_dir, spike)
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            log = path.with_suffix(".log")
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:] if log.is_file() else ""
            result = {
                "step": spike,
                "label": None,
                "error": f"the side process failed (exit {process.returncode}): {tail}",
            }
        return [self._event(step, tokens, result)]

    def _event(self, step: int, tokens: int, result: dict[str, Any]) -> dict[str, Any]:
        """The `spike_triage` record: the label, the suspects and the batch's three highest-loss documents
        (so that the report draws it from metrics.jsonl alone), with a one-line message (also printed)."""
        spike = int(result["step"])
        if result.get("label") is None:
            message = f"the spike at step {spike} was not triaged: {result.get('error', '')}".rstrip()
            say(f"note: {message}")
        else:
            suspects = ", ".join(result.get("suspects", [])) or "none stand out"
            message = f"spike at step {spike} triaged by replay: {result['label']}; suspects: {suspects}"
            say(f"{message} (`smelt train triage RUN --step {spike}`)")
        top = [{k: d.get(k) for k in ("id", "source", "loss", "excess", "tokens")}
               for d in result.get("documents", [])[:3]]  # fmt: skip
        return {
            "kind": "event", "step": step, "tokens": tokens, "event": "spike_triage", "spike_step": spike,
            "label": result.get("label"), "bitwise": result.get("bitwise"), "suspects": result.get("suspects", []),
            "alerts": [f["alert"] for f in result.get("figures", [])], "top": top, "message": message,
            **({"error": result["error"]} if result.get("error") else {}),
            "file": str(spike_path(self.train_dir, spike).relative_to(self.train_dir)), "time": time.time(),
        }  # fmt: skip
