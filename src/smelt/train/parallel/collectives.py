"""The one collective every part of the trainer shares. Its own module so that the parallelism modules
that distributed.wrap_model imports (pipeline_parallel.py) can use it without importing distributed."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def all_reduce_sum(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum across the ranks of `group` (default: all) in place (identity for one process); returns it."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor
