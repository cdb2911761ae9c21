"""Live metric sinks: the trainer hands each metrics.jsonl record to TensorBoard or Weights & Biases too.

metrics.jsonl stays the record of a run (the reports are made from it); a sink is a view for people
who already watch their runs in those tools. Each sink has `log(record)` and `close()`. The x axis is
tokens seen, the axis smelt compares runs on: TensorBoard's step is the token count, and W&B plots
every metric against a `tokens` metric. Both are optional extras: `pip install 'smelt[tensorboard]'`,
`pip install 'smelt[wandb]'`. `smelt report RUN --tensorboard` (report/sinks.py) turns a finished run's metrics.jsonl, and the results
`smelt eval` wrote (eval/step_*.json), into event files.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.metric_records import describe_event, finite, task_scores

# Fields of a train record that are bookkeeping, not curves.
_NOT_SCALARS = {"kind", "step", "tokens", "stage", "event"}


class _EventCounts:
    """Cumulative counts of notable events, so alerts, skips and rollbacks show as curves too."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, record: dict[str, Any]) -> list[tuple[str, float]]:
        event = str(record.get("event"))
        if event in ("checkpoint", "mixture", "data_plan", "start", "end", "note", "warning"):
            return []
        name = f"{event}_{record['alert']}" if event == "alert" and record.get("alert") else event
        self.counts[name] = self.counts.get(name, 0) + 1
        return [(f"events/{name}", float(self.counts[name]))]


def scalars(record: dict[str, Any]) -> list[tuple[str, float]]:
    """The (tag, value) curves one metrics record contributes; events are counted by the sinks."""
    kind = record.get("kind")
    out: list[tuple[str, float]] = []
    if kind == "train":
        for key, value in record.items():
            if key in _NOT_SCALARS:
                continue
            if isinstance(value, bool) or finite(value):
                out.append((f"train/{key}", float(value)))
        for source, value in (record.get("loss_by_source") or {}).items():
            if finite(value):
                out.append((f"train/loss/{source}", float(value)))
        out.append(("train/step", float(record.get("step") or 0)))
    elif kind == "eval":
        for key, value in record.items():
            if key not in _NOT_SCALARS and finite(value):
                out.append((f"eval/{key}", float(value)))
        for source, value in (record.get("val_loss_by_source") or {}).items():
            if finite(value):
                out.append((f"eval/val_loss/{source}", float(value)))
        out += [(f"eval/task/{name}", value) for name, value in task_scores(record).items()]
    elif kind == "layers":
        ratios = [
            v["update_ratio"] for v in (record.get("layers") or {}).values() if finite(v.get("update_ratio"))
        ]
        if ratios:
            out += [
                ("layers/update_ratio_max", max(ratios)),
                ("layers/update_ratio_median", statistics.median(ratios)),
            ]
        for key, values in (record.get("by_layer") or {}).items():  # telemetry.py's per-layer pooling
            out += [(f"layers/{key}/layer_{i}", float(v)) for i, v in enumerate(values) if finite(v)]
    elif kind == "telemetry":  # per layer: activation RMS, kurtosis, max attention logit
        for key in ("act_rms", "act_kurtosis", "attn_logit_max"):
            out += [
                (f"telemetry/{key}/layer_{i}", float(v))
                for i, v in enumerate(record.get(key) or [])
                if finite(v)
            ]
        if finite(record.get("logit_max")):
            out.append(("telemetry/logit_max", float(record["logit_max"])))
    elif kind == "moe":  # per sparse layer: expert balance and router entropy
        for key in ("moe_max_mean", "moe_entropy", "moe_dropped"):
            for layer, value in zip(record.get("moe_layers") or [], record.get(key) or [], strict=False):
                if finite(value):
                    out.append((f"moe/{key.removeprefix('moe_')}/layer_{layer}", float(value)))
    elif kind == "event" and record.get("event") == "mixture":
        for source, value in (record.get("realized") or {}).items():
            if finite(value):
                out.append((f"mixture/realized/{source}", float(value)))
    return out


def eval_result_scalars(result: dict[str, Any]) -> list[tuple[str, float]]:
    """The (tag, value) curves of one `smelt eval` result (eval/step_*.json), under checkpoint_eval/:
    held-out loss and bits per byte, overall and per source, and every task metric. They are kept apart
    from the in-loop eval/ curves, which score other subsets."""
    out: list[tuple[str, float]] = []
    heldout = result.get("heldout") or {}
    parts = [("", heldout.get("overall") or {})]
    parts += [(f"/{source}", figures or {}) for source, figures in (heldout.get("per_source") or {}).items()]
    for suffix, figures in parts:
        for key in ("loss", "bits_per_byte"):
            if finite(figures.get(key)):
                out.append((f"checkpoint_eval/{key}{suffix}", float(figures[key])))
    out += [(f"checkpoint_eval/task/{name}", value) for name, value in task_scores(result).items()]
    return out


def _missing(extra: str, package: str) -> UserError:
    return UserError(
        f"the {package} package is not installed, and this needs it. Install the optional extra: "
        f"pip install 'smelt[{extra}]'"
    )


class TensorBoardSink:
    """Writes each record's scalars (and events as text) to TensorBoard event files under `logdir`."""

    def __init__(self, logdir: str | Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise _missing("tensorboard", "tensorboard") from exc
        self.logdir = Path(logdir)
        self.writer = SummaryWriter(log_dir=str(self.logdir))
        self.events = _EventCounts()

    def log(self, record: dict[str, Any]) -> None:
        step = int(record.get("tokens") or 0)
        if record.get("event") == "resume":
            self._hide_after(step)
        for tag, value in scalars(record):
            self.writer.add_scalar(tag, value, step)
        if record.get("kind") == "event":
            for tag, value in self.events.add(record):
                self.writer.add_scalar(tag, value, step)
            if record.get("event") not in ("mixture", "checkpoint"):
                self.writer.add_text("events", f"step {record.get('step')}: {describe_event(record)}", step)

    def _hide_after(self, tokens: int) -> None:
        # A resumed run replays the steps after its checkpoint (metrics.jsonl moves the dead run's
        # records of them aside); a restart marker makes TensorBoard drop the dead run's points too.
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.writer.file_writer.add_event(
            Event(step=tokens + 1, session_log=SessionLog(status=SessionLog.START))
        )

    def log_eval_result(self, result: dict[str, Any], tokens: float) -> None:
        """One `smelt eval` step file: its scalars, and its greedy gallery as text, at `tokens`."""
        step = int(tokens)
        for tag, value in eval_result_scalars(result):
            self.writer.add_scalar(tag, value, step)
        gallery = [g for g in result.get("gallery") or [] if isinstance(g, dict) and "prompt" in g]
        if gallery:
            text = "\n\n".join(f"    {g['prompt']!r} -> {g.get('completion', '')!r}" for g in gallery)
            self.writer.add_text("checkpoint_eval/gallery", f"step {result.get('step')}\n\n{text}", step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Logs each record's scalars to a Weights & Biases run (offline by default: nothing leaves the machine
    until `wandb sync`), plotted against tokens."""

    def __init__(
        self,
        project: str,
        run_name: str,
        dir: str | Path,
        mode: str = "offline",
        config: dict[str, Any] | None = None,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise _missing("wandb", "wandb") from exc
        Path(dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=run_name, dir=str(dir), mode=mode, config=config or {})
        self.run.define_metric("tokens")
        self.run.define_metric("*", step_metric="tokens")
        self.events = _EventCounts()

    def log(self, record: dict[str, Any]) -> None:
        data = dict(scalars(record))
        if record.get("kind") == "event":
            data.update(self.events.add(record))
        if data:
            data["tokens"] = float(record.get("tokens") or 0)
            self.run.log(data)

    def close(self) -> None:
        self.run.finish()
