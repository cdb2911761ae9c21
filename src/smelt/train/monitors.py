"""What the trainer writes about itself: metrics.jsonl, validation loss, per-layer update ratios.

metrics.jsonl is the contract (design.md section 1): the report and every plot come from it alone, so
everything worth seeing goes there, one JSON object per line, flushed as written so a crash loses
nothing already logged. Only rank 0 writes under torchrun.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from smelt.model.transformer import IGNORE_INDEX, doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.train.distributed import all_reduce_sum
from smelt.train.precision import Precision


class MetricsLog:
    """Append-only metrics.jsonl; each line is flushed so a crash loses nothing already logged.

    `sinks` (TensorBoard, W&B: objects with log(record) and close()) see every record too.
    """

    def __init__(
        self, path: Path, enabled: bool = True, append: bool = False, sinks: list | None = None
    ) -> None:
        self.enabled = enabled
        self.file = None
        self.sinks = list(sinks or []) if enabled else []
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = open(path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        for sink in self.sinks:
            sink.close()


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
        if self.sharded:
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
