"""Expert parallelism: the experts of every MoE layer split over the processes of an "ep" mesh
dimension, token copies sent to their expert's process and back by all-to-all.

Layout. With P processes each holds E / P consecutive experts of every MoE layer, as DTensor shards
(Shard(0) over the "ep" mesh), so distributed checkpoints save and reload them across world sizes
like every other sharded weight; FSDP2 leaves them alone (`expert_parameters` is what
`wrap_model` passes as ignored_params) and shards the rest of the model as usual. gloo and NCCL
both have all_to_all_single in torch 2.13, so dispatch and combine are true all-to-alls: each
process sends each token copy once, to the process owning its expert.

Forward of one layer (moe.py routes and sorts first): the copies, sorted by expert, go out in P
contiguous slices; the per-expert counts go first, so every process knows what it receives; the
received copies (source-major) are reordered expert-major, go through the local experts' grouped
SwiGLU, are put back in arrival order and return by the reverse all-to-all. The all-to-all's
backward is the reverse all-to-all, so gradients flow back to every process's tokens.

Gradient scale. The trainer multiplies each process's loss by the world size because DDP and FSDP
average gradients over processes. An expert's gradient is not averaged: its process already sums
the contributions of every process's tokens. So the local expert weights pass through `_ScaleGrad`,
which divides their gradient by the world size, and the result is the gradient of the global mean
loss, the same as one process computes.

Limits, stated: the expert-parallel degree equals the world size (`train.expert_parallel` = number of
processes); experts replicated over a second data-parallel dimension (ep < world) would also need
their gradients all-reduced and counted once in the global norm, which is not built.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from smelt.model.moe import MoE, grouped_swiglu, moe_layers_of


class _AllToAll(torch.autograd.Function):
    """all_to_all_single with the reverse exchange as its backward."""

    @staticmethod
    def forward(ctx, x, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:  # type: ignore[override]
        ctx.splits, ctx.group = (out_splits, in_splits), group
        out = x.new_empty((sum(out_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        out_splits, in_splits = ctx.splits
        back = grad.new_empty((sum(in_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), in_splits, out_splits, group=ctx.group)
        return back, None, None, None


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient times `scale` (see the module docstring)."""

    @staticmethod
    def forward(ctx, x, scale: float) -> torch.Tensor:  # type: ignore[override]
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad * ctx.scale, None


def _block_index(lens: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """Row indices that read blocks (starting at `starts`, of `lens` rows) one after another."""
    total = int(lens.sum())
    offsets = torch.cumsum(lens, 0) - lens
    within = torch.arange(total, device=lens.device) - torch.repeat_interleave(
        offsets, lens, output_size=total
    )
    return torch.repeat_interleave(starts, lens, output_size=total) + within


def expert_parallel_swiglu(layer: MoE, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """The experts' outputs for `rows` (token copies sorted by global expert id, `counts` per expert),
    computed on the processes that own the experts; same order and shape as `rows`."""
    group, world, local = layer.ep_group, layer.ep_size, layer.local_experts
    counts = counts.to(torch.int64)
    # How many copies each process gets from each other one, per local expert: [P (source), E/P].
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts, group=group)
    send_splits = counts.view(world, local).sum(1).tolist()
    recv_counts = recv_counts.view(world, local)
    recv_splits = recv_counts.sum(1).tolist()
    received = _AllToAll.apply(rows, recv_splits, send_splits, group)
    # Arrival order is source-major; the grouped matmul wants expert-major.
    flat = recv_counts.flatten()
    starts = (torch.cumsum(flat, 0) - flat).view(world, local)
    order = _block_index(recv_counts.t().flatten(), starts.t().flatten())
    w_gate, w_up, w_down = (_ScaleGrad.apply(w, 1.0 / world) for w in layer.expert_weights())
    out_sorted = grouped_swiglu(received[order], recv_counts.sum(0), w_gate, w_up, w_down)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return _AllToAll.apply(out_sorted[inverse], send_splits, recv_splits, group)


def shard_experts(model: nn.Module, mesh) -> None:
    """Keep this process's E / P experts of every MoE layer as DTensor shards over the 1-D "ep" `mesh`.

    Every process built the same full model from the run seed, so each keeps its slice of identical
    initial weights: the expert-parallel model starts where the single-process one does.
    """
    from torch.distributed.tensor import DTensor, Shard

    world, rank = mesh.size(), mesh.get_local_rank()
    for _, layer in moe_layers_of(model):
        if layer.n_experts % world:
            from smelt.errors import UserError

            raise UserError(
                f"model.moe_experts ({layer.n_experts}) must be a multiple of train.expert_parallel ({world}): "
                f"each process holds the same number of experts."
            )
        per = layer.n_experts // world
        for name in ("w_gate", "w_up", "w_down"):
            full = getattr(layer, name).detach()
            local = full[rank * per : (rank + 1) * per].clone()
            shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            setattr(layer, name, nn.Parameter(shard))
        layer.ep_group, layer.ep_rank, layer.ep_size = mesh.get_group(), rank, world


def expert_parameters(model: nn.Module) -> set[nn.Parameter]:
    """The expert weights that expert parallelism already shards (FSDP2 must leave them alone)."""
    return {
        getattr(layer, name)
        for _, layer in moe_layers_of(model)
        if layer.ep_group is not None
        for name in ("w_gate", "w_up", "w_down")
    }


def setup_expert_parallel(model: nn.Module, cfg, world_size: int, device: torch.device) -> None:
    """Shard the experts for `train.expert_parallel` > 1 (before wrap_model); UserError if it cannot be."""
    ep = cfg.train.expert_parallel
    if ep == 1:
        return
    from smelt.errors import UserError

    problems = []
    if not cfg.model.moe_experts:
        problems.append("the model has no experts (model.moe_experts = 0)")
    elif cfg.model.moe_experts % ep:
        problems.append(f"model.moe_experts ({cfg.model.moe_experts}) is not a multiple of it")
    if ep != world_size:
        problems.append(
            f"it must equal the number of processes ({world_size}); launch with torchrun --nproc_per_node {ep}"
        )
    if cfg.train.parallel != "fsdp":
        problems.append(f"it composes with train.parallel = 'fsdp' (not {cfg.train.parallel!r})")
    if problems:
        raise UserError(f"train.expert_parallel = {ep} cannot be used: {'; '.join(problems)}.")
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, (ep,), mesh_dim_names=("ep",))
    shard_experts(model, mesh)
