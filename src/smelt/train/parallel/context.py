"""Context parallelism: each sequence split over the C ranks of the "cp" mesh dimension (Llama 3's scheme).

The ranks of one cp group read the same batch rows (mesh.data_rank). Each keeps its own part of every
row's positions, runs the whole model on those tokens, and in every attention layer all-gathers the
keys and values of the whole sequence from the group (with autograd: the gradients of the gathered
keys and values are reduce-scattered back to the ranks that computed them), then attends its queries
to them under a mask built from the global positions of both sides: causal, and within one document
(doc_ids), with RoPE positions restarting per document (position_ids). So the logits are those of the
unsplit model, document masks included; only the sums inside the kernels run in another order.

Load balance: under a causal mask, late queries see more keys than early ones. Each row is cut into
2 x C equal chunks and rank r keeps chunks r and 2C-1-r (one early, one late: the "zigzag" or
head-tail split), so every rank computes the same share of the score matrix.

The loss: each rank computes the per-token losses of its positions; `ContextParallel` all-gathers those
([B, T_local] floats, not the logits) and every rank of the group forms the same loss over the whole
rows, so the trainer's arithmetic (step.py: token counts and losses summed over the data-parallel
ranks, which the cp ranks are not) is unchanged. The gather's backward hands each rank the gradient of
its own positions; FSDP2 (over the flattened dp_shard x cp ranks, torchtitan's "dp_shard_cp") or DDP
(over dp_replicate x cp) then averages the parameter gradients over data-parallel x cp ranks, while the
cp ranks' gradients are parts of one sum: the backward scales them by C, so the average over the cp
ranks is their sum, exactly.

Attention runs as SDPA with a dense boolean mask [B, 1, T/C, T] on every device (flex attention's
BlockMask is not built for gathered keys). What does not compose (tensor and pipeline parallelism,
MoE layers, compile) is refused by `check_context_parallel` in mesh.py with the key to change.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from smelt.model.transformer import IGNORE_INDEX, GatheredKV
from smelt.train.parallel.mesh import TrainMesh


def chunk_positions(seq_len: int, cp: int, cp_rank: int, device: torch.device | None = None) -> torch.Tensor:
    """The global positions rank `cp_rank` of `cp` keeps: chunks cp_rank and 2 cp - 1 - cp_rank of 2 cp."""
    size = seq_len // (2 * cp)
    early = torch.arange(cp_rank * size, (cp_rank + 1) * size, device=device)
    late = torch.arange((2 * cp - 1 - cp_rank) * size, (2 * cp - cp_rank) * size, device=device)
    return torch.cat([early, late])


def gathered_positions(seq_len: int, cp: int, device: torch.device | None = None) -> torch.Tensor:
    """The global position of each entry of a sequence gathered from ranks 0..cp-1 in rank order."""
    return torch.cat([chunk_positions(seq_len, cp, r, device) for r in range(cp)])


def context_mask(doc_ids: torch.Tensor | None, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Boolean SDPA mask [B or 1, 1, len(q_pos), len(k_pos)]: key at or before the query, same document."""
    mask = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if doc_ids is not None:
        mask = mask & (doc_ids[:, q_pos][:, None, :, None] == doc_ids[:, k_pos][:, None, None, :])
    return mask


class _GatherKV(torch.autograd.Function):
    """All-gather along `dim` in rank order; the backward sums every rank's gradient of each part and
    hands it to the rank that computed it (a reduce-scatter: an all-reduce and a slice, which gloo has)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int) -> torch.Tensor:
        ctx.group, ctx.dim, ctx.size = group, dim, x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        grad = grad.contiguous()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        start = dist.get_rank(ctx.group) * ctx.size
        return grad.narrow(ctx.dim, start, ctx.size), None, None


class _GatherSame(torch.autograd.Function):
    """All-gather along `dim` of a value every rank then uses in the same way (the per-token losses):
    each rank's gradient of its own part is already the whole gradient, so the backward slices it, and
    scales it by `scale` (see the module docstring: the cp ranks' gradients are averaged, not summed)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, dim: int, scale: float) -> torch.Tensor:
        ctx.group, ctx.dim, ctx.size, ctx.scale = group, dim, x.shape[dim], scale
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        start = dist.get_rank(ctx.group) * ctx.size
        return grad.narrow(ctx.dim, start, ctx.size) * ctx.scale, None, None, None


class ContextParallel(nn.Module):
    """The model as the trainer calls it under context parallelism: whole rows in, whole-row losses out.

    `module` is the Transformer (or its FSDP2 / DDP wrapper); `group` the cp process group. With targets
    the logits stay on their ranks and None is returned in their place (the trainer and validation read
    the losses only); without targets the logits [B, T, V] are gathered.
    """

    def __init__(self, module: nn.Module, group: Any, grad_scale: float = 1.0) -> None:
        super().__init__()
        self.module = module
        self.group = group
        self.cp = dist.get_world_size(group)
        self.cp_rank = dist.get_rank(group)
        self.grad_scale = grad_scale

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
        doc_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        loss_parts: bool = False,
    ) -> tuple[torch.Tensor | None, Any]:
        B, T = idx.shape
        if T % (2 * self.cp):
            raise ValueError(
                f"context parallelism over {self.cp} ranks needs a multiple of {2 * self.cp} tokens, got {T}"
            )
        mine = chunk_positions(T, self.cp, self.cp_rank, idx.device)
        everyone = gathered_positions(T, self.cp, idx.device)
        if position_ids is None:
            position_ids = torch.arange(T, device=idx.device).expand(B, T)
        group = self.group

        def gather(x: torch.Tensor) -> torch.Tensor:
            return _GatherKV.apply(x, group, 2)  # [B, H, T_local, hd]: the sequence is dim 2

        kv = GatheredKV(gather, context_mask(doc_ids, mine, everyone))
        local_targets = targets[:, mine] if targets is not None else None
        logits, parts = self.module(
            idx[:, mine], local_targets, reduction="none", loss_parts=True,
            position_ids=position_ids[:, mine], gathered_kv=kv,
        )  # fmt: skip
        order = torch.argsort(everyone)  # gathered order -> positions 0..T-1
        if targets is None:
            return _GatherSame.apply(logits, group, 1, self.grad_scale)[:, order], None
        whole = {name: _GatherSame.apply(v, group, 1, self.grad_scale)[:, order] for name, v in parts.items()}
        if reduction == "mean":
            count = (targets != IGNORE_INDEX).sum().clamp(min=1)
            whole = {name: v.sum() / count for name, v in whole.items()}
        return None, (whole if loss_parts else whole["loss"])

    def set_requires_gradient_sync(self, sync: bool) -> None:
        """FSDP2's switch for gradient accumulation (step.grad_sync), passed on."""
        self.module.set_requires_gradient_sync(sync)

    def no_sync(self) -> Any:
        """DDP's switch for gradient accumulation (step.grad_sync), passed on."""
        return self.module.no_sync()


def wrap_context_parallel(model: nn.Module, mode: str, mesh: TrainMesh, device: torch.device) -> nn.Module:
    """FSDP2 over the flattened dp_shard x cp ranks ("fsdp"), or DDP over dp_replicate x cp ("ddp"),
    then `ContextParallel` over "cp". Units as in distributed.wrap_model: each block, then the root."""
    cp = mesh.layout.cp
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        shard_mesh = mesh.mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        for block in model.blocks:  # type: ignore[union-attr]
            fully_shard(block, mesh=shard_mesh)
        fully_shard(model, mesh=shard_mesh)
        inner = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        group = mesh.mesh["dp_replicate", "cp"]._flatten("dp_replicate_cp").get_group()
        ids = [device.index] if device.type == "cuda" else None
        inner = DistributedDataParallel(model, device_ids=ids, process_group=group)
    return ContextParallel(inner, mesh.mesh["cp"].get_group(), grad_scale=float(cp))
