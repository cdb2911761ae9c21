"""Gradient accumulation keeps the data-parallel exchange to the last micro step, whatever the wrapper."""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from smelt.train.parallel.distributed import grad_sync


class FSDPLike(nn.Module):
    """The switch FSDP2 (and TP's LossParallel over it) offers, recording each call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[bool] = []

    def set_requires_gradient_sync(self, sync: bool) -> None:
        self.calls.append(sync)


def test_ddp_under_tensor_parallelism_defers_the_gradient_exchange(tmp_path):
    # train.parallel = "ddp" with tensor parallelism is FSDP2 replicating over the data-parallel ranks:
    # its micro steps before the last must not exchange gradients (they did, once per micro batch).
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        for mode in ("ddp", "fsdp"):
            model = FSDPLike()
            with grad_sync(model, mode, sync=False):
                assert model.calls == [False]
            assert model.calls == [False, True]
            with grad_sync(model, mode, sync=True):
                pass
            assert model.calls == [False, True]
    finally:
        dist.destroy_process_group()
