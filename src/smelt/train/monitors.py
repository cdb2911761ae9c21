"""What the trainer writes about itself: metrics.jsonl, validation loss, per-layer update ratios.

metrics.jsonl is the contract (design.md section 1): the report and every plot come from it alone, so
everything worth seeing goes there, one JSON object per line, flushed as written so a crash loses
nothing already logged. Only rank 0 writes under torchrun.

Each step is in metrics.jsonl once. A resumed run replays the steps between its checkpoint and the
crash, so at resume the records written after that checkpoint move to metrics.superseded.jsonl (kept,
never deleted) and the file goes on from the checkpoint; every reader (the report, the TensorBoard
export, the summary) then sees one history. A fresh start over an existing metrics.jsonl (every
checkpoint damaged) moves the old file aside as metrics.jsonl.N instead of overwriting it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from smelt.jsonl import json_object
from smelt.model.transformer import IGNORE_INDEX, doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.train.parallel.collectives import all_reduce_sum
from smelt.train.parallel.distributed import element_copies
from smelt.train.precision import Precision

SUPERSEDED_METRICS = "metrics.superseded.jsonl"


class MetricsLog:
    """Append-only metrics.jsonl; each line is flushed so a crash loses nothing already logged.

    `sinks` (TensorBoard, W&B: objects with log(record) and close()) see every record too. Without
    `append`, an existing non-empty file is moved aside (`set_aside` says where), never overwritten.
    `watch` (health.HealthAlerts) sees every record and returns the alert events to write after it;
    when appending, the records already in the file go through it first, without alerting.
    """

    def __init__(
        self,
        path: Path,
        enabled: bool = True,
        append: bool = False,
        sinks: list | None = None,
        watch: Any = None,
    ) -> None:
        self.enabled = enabled
        self.watch = watch if enabled else None
        self.file = None
        self.set_aside: Path | None = None
        self.offset: int | None = None  # bytes in the file so far (rank 0); a checkpoint records it
        self.sinks = list(sinks or []) if enabled else []
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not append and path.is_file() and path.stat().st_size > 0:
                self.set_aside = _free_name(path)
                os.replace(path, self.set_aside)
            if append and self.watch is not None and path.is_file():
                for line in path.read_bytes().splitlines():
                    record = json_object(line)
                    if record is not None:
                        self.watch.observe(record, quiet=True)
            self.file = open(path, "ab" if append else "wb")  # noqa: SIM115 - closed in close()
            self.offset = self.file.tell()

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            line = (json.dumps(record) + "\n").encode("utf-8")
            self.file.write(line)
            self.file.flush()
            self.offset = (self.offset or 0) + len(line)
        for sink in self.sinks:
            sink.log(record)
        if self.watch is not None:
            for alert in self.watch.observe(record):
                self.write(alert)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        for sink in self.sinks:
            sink.close()


def _free_name(path: Path) -> Path:
    number = 1
    while path.with_name(f"{path.name}.{number}").exists():
        number += 1
    return path.with_name(f"{path.name}.{number}")


def supersede_after_resume(path: Path, step: int, offset: int | None, rerun_final: bool = False) -> int:
    """Before a run resumed from the checkpoint of `step` appends to metrics.jsonl: move the records
    it will write again to metrics.superseded.jsonl (after a line saying which resume moved them) and
    return how many moved.

    `offset` is the file's size when that checkpoint was taken (its meta.json records it): records
    before it stay. After it, the step decides: records of `step` or earlier stay (the save's own
    events, such as the `checkpoint` event of a save that committed while the run went on), later
    ones move, and so do an `end` event and a `stage` event for a stage that starts after `step`.
    Without a usable offset (a checkpoint of another run or an older smelt) the step decides for the
    whole file. `rerun_final`: the resume is at the final checkpoint, whose validation and save the
    finishing run writes again.
    """
    if not path.is_file():
        return 0
    data = path.read_bytes()
    # The offset must fall on a line boundary of this file, or it belongs to another file.
    cut = (
        offset
        if offset is not None and 0 <= offset <= len(data) and data[:offset][-1:] in (b"", b"\n")
        else None
    )
    kept, moved, position = [], [], 0
    for line in data.splitlines(keepends=True):
        position += len(line)
        before_cut = cut is not None and position <= cut
        record = json_object(line)
        if record is None:  # a line cut by the crash
            keep = before_cut
        else:
            keep = before_cut or (_step(record) <= step and not _replayed_event(record, step))
        if record is not None and rerun_final and _step(record) == step:
            if record.get("kind") == "eval" and not record.get("inloop"):
                keep = False
            if record.get("event") in ("checkpoint", "end"):
                keep = False
        (kept if keep else moved).append(line if line.endswith(b"\n") else line + b"\n")
    if not moved:
        return 0
    header = {"kind": "event", "event": "superseded", "resumed_at_step": step, "records": len(moved),
              "file": path.name}  # fmt: skip
    with open(path.with_name(SUPERSEDED_METRICS), "ab") as side:
        side.write((json.dumps(header) + "\n").encode("utf-8"))
        side.writelines(moved)
        side.flush()
        os.fsync(side.fileno())
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.writelines(kept)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return len(moved)


def _step(record: dict[str, Any]) -> int:
    value = record.get("step")
    return int(value) if isinstance(value, (int, float)) else 0


def _replayed_event(record: dict[str, Any], step: int) -> bool:
    event = record.get("event")
    if event == "end":
        return True
    return event == "stage" and isinstance(record.get("first_step"), int) and record["first_step"] > step


@torch.no_grad()
def evaluate(
    model: torch.nn.Module,
    windows: Iterable[np.ndarray],
    seq_len: int,
    batch_size: int,
    precision: Precision,
    device: torch.device,
    eos_id: int | None = None,
) -> tuple[float, int]:
    """Mean next-token loss over windows of up to seq_len + 1 tokens, and the number of tokens scored.

    Short windows (the tail of the split) are padded; padded targets are ignored. With `eos_id` the
    model attends within documents only, with positions restarting at each (as trained with
    train.doc_masking). Under FSDP every rank must call this with the same windows (the forward
    gathers the shards collectively).
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0

    def score(batch: list[np.ndarray]) -> None:
        nonlocal total, count
        x = torch.zeros(len(batch), seq_len, dtype=torch.long)
        y = torch.full((len(batch), seq_len), IGNORE_INDEX, dtype=torch.long)
        for i, w in enumerate(batch):
            w = torch.from_numpy(np.asarray(w, dtype=np.int64))
            x[i, : len(w) - 1] = w[:-1]
            y[i, : len(w) - 1] = w[1:]
        x, y = x.to(device), y.to(device)
        docs = {}
        if eos_id is not None:
            doc_ids = doc_ids_from_tokens(x, eos_id)
            docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}
        with precision.autocast():
            _, losses = model(x, y, reduction="none", **docs)
        total += losses.double().sum().item()
        count += int((y != IGNORE_INDEX).sum())

    batch: list[np.ndarray] = []
    for window in windows:
        if len(window) < 2:
            continue
        batch.append(window)
        if len(batch) == batch_size:
            score(batch)
            batch = []
    if batch:
        score(batch)
    model.train(was_training)
    return (total / count if count else float("nan")), count


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class UpdateRatioMonitor:
    """Per-parameter ||update|| / ||weight|| and ||weight|| around one optimizer step.

    The field's rule of thumb: a ratio near 1e-3 is healthy, 1e-2 is danger, 1e-5 is a dead layer;
    weight norms should plateau. Costs one copy of the weights, so it runs every N steps only.
    """

    def __init__(self, model: nn.Module, sharded: bool) -> None:
        self.named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.sharded = sharded
        self.before: list[torch.Tensor] | None = None

    def snapshot(self) -> None:
        self.before = [_local(p.detach()).float().clone() for _, p in self.named]

    def measure(self) -> dict[str, dict[str, float]]:
        """Ratios and norms since the last snapshot, keyed by parameter name (identical on every rank)."""
        assert self.before is not None, "snapshot() before measure()"
        sums = torch.zeros(len(self.named), 2)
        for i, ((_, p), old) in enumerate(zip(self.named, self.before, strict=True)):
            new = _local(p.detach()).float()
            sums[i, 0] = (new - old).pow(2).sum()
            sums[i, 1] = new.pow(2).sum()
        if self.sharded:  # each element counted once, however many ranks hold it (TP's replicated norms)
            world = torch.distributed.get_world_size()
            sums /= torch.tensor([[float(element_copies(p, world))] for _, p in self.named])
            all_reduce_sum(sums)
        self.before = None
        norms = sums.sqrt()
        return {
            name.removeprefix("module."): {
                "update_ratio": float(norms[i, 0] / norms[i, 1]) if norms[i, 1] > 0 else float("nan"),
                "weight_norm": float(norms[i, 1]),
            }
            for i, (name, _) in enumerate(self.named)
        }


def nonfinite_parameters(model: nn.Module) -> tuple[int, list[str]]:
    """How many parameter tensors hold a NaN or Inf, summed over the ranks of a torchrun launch (each
    looks at its own shards or pipeline stage; a tensor that several ranks hold counts on each), and
    the names of this rank's. Every rank must call it: one all-reduce, one device sync."""
    named = [(name.removeprefix("module."), _local(p.detach())) for name, p in model.named_parameters()]
    if not named:
        return 0, []
    finite = torch.stack([torch.isfinite(t).all() for _, t in named])
    count = (~finite).sum().float().reshape(1)
    all_reduce_sum(count)
    names = [name for (name, _), ok in zip(named, finite.tolist(), strict=True) if not ok]
    return int(count.item()), names
