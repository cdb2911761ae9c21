"""The token arithmetic of one optimizer step, shared by the plain step (step.py) and the pipeline
schedule (pipeline_parallel.py): target tokens per micro batch and over the data-parallel ranks (the
weights of the global token-mean loss), and the per-source [cross-entropy sum, tokens] rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from smelt.model.transformer import IGNORE_INDEX
from smelt.train.parallel.collectives import all_reduce_sum


def step_token_counts(micro: Sequence[Any], group: Any = None) -> tuple[list[torch.Tensor], list[int], int]:
    """(target tokens per row of each micro batch, per micro batch, and over the ranks of `group`)."""
    row_tokens = [(m.targets != IGNORE_INDEX).sum(dim=1) for m in micro]  # on the host: no device sync
    counts = [int(rows.sum()) for rows in row_tokens]
    total = torch.tensor(float(sum(counts)), dtype=torch.float64)
    return row_tokens, counts, max(1, int(all_reduce_sum(total, group).item()))


def source_sums(sources: Sequence[str], device: torch.device) -> torch.Tensor | None:
    """Zeroed [cross-entropy sum, tokens] rows in the order of `sources`; None unless two or more."""
    return torch.zeros((len(sources), 2), device=device, dtype=torch.float64) if len(sources) > 1 else None


def add_source_rows(
    by_source: torch.Tensor,
    index: dict[str, int],
    row_sources: Sequence[str],
    ce_rows: torch.Tensor,
    token_rows: torch.Tensor,
) -> None:
    """Add each row's cross-entropy sum and target tokens to its source's row of `by_source`."""
    at = torch.tensor([index[s] for s in row_sources], device=by_source.device)
    by_source[:, 0].index_add_(0, at, ce_rows)
    by_source[:, 1].index_add_(0, at, token_rows.to(by_source.device, torch.float64))
