"""The per-document losses of one step's batch, measured in the replay of a spike (train/spikes.py).

Before the replayed step of the spike runs, the model (in the state the run had just before it) scores
every row of the batch without gradients, at the training precision, through the trainer's own
forward; each row's per-position cross-entropies are summed per document segment (the packed row's
segments, as the loader made them). Nothing here changes the weights, the optimizer or any RNG, so
the step that follows replays as it would have without it.
"""

from __future__ import annotations

from typing import Any

import torch

from smelt.tokens.decoded import segment_starts


def segment_losses(trainer: Any, parts: list[Any]) -> list[list[list[float]]]:
    """For each row of the step's batch (this process's rows, in order): `[start, length, loss sum]`
    per document segment of its input positions."""
    rows: list[list[list[float]]] = []
    micro = [m for part in parts for m in part.micro]
    with torch.no_grad():
        for batch in micro:
            batch = batch.to(trainer.device)
            docs = (
                {"doc_ids": batch.doc_ids, "position_ids": batch.position_ids}
                if trainer.tc.doc_masking
                else {}
            )
            with trainer.precision.autocast():
                _, losses = trainer.forward(
                    batch.inputs, batch.targets, loss_parts=True, reduction="none", **docs
                )
            ce = losses["ce"].detach().double().cpu()
            for r in range(ce.shape[0]):
                starts = segment_starts(batch.doc_ids[r].cpu().numpy())
                edges = [*starts, ce.shape[1]]
                rows.append(
                    [
                        [lo, hi - lo, float(ce[r, lo:hi].sum())]
                        for lo, hi in zip(edges, edges[1:], strict=False)
                    ]
                )
    return rows
