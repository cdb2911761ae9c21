"""The device mesh: how the processes of a launch divide the work, by named dimension.

Dimensions, outermost first: "dp_replicate" (data-parallel replicas, gradients all-reduced),
"dp_shard" (data-parallel ranks that shard weights, gradients and optimizer state: FSDP2) and "tp"
(tensor parallelism: each weight matrix split over the ranks of one group, activations exchanged
inside every layer). "tp" is innermost so that a tensor-parallel group is a run of consecutive ranks,
the ranks of one node under torchrun. Pipeline ("pp") and context ("cp") dimensions are not built yet;
they take their place between "dp_shard" and "tp" when they are.

The `[train]` keys:
- `train.tensor_parallel = T`: the size of "tp" (1: off);
- `train.data_parallel = D`: the data-parallel degree (0: every process left, world / T);
- `train.parallel = "ddp" | "fsdp"`: whether the D data-parallel ranks replicate ("dp_replicate" = D)
  or shard ("dp_shard" = D).
The product D x T must equal the world size. Without tensor parallelism (T = 1) the trainer keeps
its DDP / FSDP2 paths on the whole world; with it, the data-parallel ranks are FSDP2 over the
("dp_replicate", "dp_shard") sub-mesh, which replicates when "dp_shard" is 1 (HSDP with shards of one).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from smelt.config import Config
from smelt.errors import ConfigError

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class MeshLayout:
    """The size of every mesh dimension; their product is the number of processes."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.dp_replicate, self.dp_shard, self.tp)

    def describe(self) -> str:
        return f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x tp {self.tp}"


def layout_for(cfg: Config, world_size: int) -> MeshLayout:
    """The mesh of `world_size` processes the `[train]` keys ask for; ConfigError when it cannot be."""
    tc = cfg.train
    tp, dp = tc.tensor_parallel, tc.data_parallel
    if world_size < tp:
        raise ConfigError(
            f"train.tensor_parallel = {tp} splits the model over {tp} processes, but this launch has "
            f"{world_size}. Launch with `torchrun --nproc-per-node {tp} -m smelt.cli train CONFIG` (or a "
            f"multiple of {tp}), or set train.tensor_parallel = 1."
        )
    if world_size % tp:
        raise ConfigError(
            f"train.tensor_parallel = {tp} does not divide the {world_size} processes of this launch: the "
            f"processes form data-parallel groups of {tp}. Launch a multiple of {tp} processes or set "
            f"train.tensor_parallel to a divisor of {world_size}."
        )
    if dp and dp * tp != world_size:
        raise ConfigError(
            f"train.data_parallel ({dp}) x train.tensor_parallel ({tp}) = {dp * tp} processes, but this launch "
            f"has {world_size}. Set train.data_parallel = {world_size // tp} (or 0: every process left), or "
            f"launch {dp * tp} processes (torchrun --nproc_per_node / --nnodes)."
        )
    dp = world_size // tp
    check_tensor_parallel(cfg)
    if tc.parallel == "fsdp":
        return MeshLayout(dp_shard=dp, tp=tp)
    return MeshLayout(dp_replicate=dp, tp=tp)


def check_tensor_parallel(cfg: Config) -> None:
    """ConfigError unless the model splits evenly over train.tensor_parallel ranks (and is one TP handles)."""
    tp, m, tc = cfg.train.tensor_parallel, cfg.model, cfg.train
    if tp == 1:
        return
    kv_heads = m.n_kv_heads or m.n_heads
    problems = []
    if m.n_heads % tp or kv_heads % tp:
        problems.append(
            f"model.n_heads ({m.n_heads}) and model.n_kv_heads ({kv_heads}) must both be multiples of it: "
            f"each rank computes whole query and key/value heads"
        )
    if tc.seq_len % tp:
        problems.append(
            f"train.seq_len ({tc.seq_len}) must be a multiple of it: sequence parallelism splits it"
        )
    if m.moe_experts:
        problems.append(
            "MoE layers (model.moe_experts) have no tensor-parallel plan yet; use train.expert_parallel"
        )
    if tc.expert_parallel > 1:
        problems.append("train.expert_parallel does not compose with it yet; set one of the two to 1")
    if m.qk_norm:
        problems.append("model.qk_norm is not built for it (its weights would see only the local heads)")
    if m.z_loss:
        problems.append("model.z_loss needs the log-partition of vocabulary-sharded logits, not built; set 0")
    if cfg.eval.every_steps:
        problems.append(
            "in-loop task scores (eval.every_steps) are not built for it (the KV cache of generation holds "
            "every head); set eval.every_steps = 0 and score the checkpoints with `smelt eval RUN`"
        )
    if tc.optimizer != "adamw":
        problems.append(f"train.optimizer = {tc.optimizer!r} is not built for sharded matrices; use 'adamw'")
    if problems:
        raise ConfigError(f"train.tensor_parallel = {tp} cannot be used: {'; '.join(problems)}.")


def check_layout_keys(cfg: Config) -> str:
    """Check the mesh keys without a launch (`smelt train --check`); returns what to launch.

    The world size is the one the keys name: data_parallel x tensor_parallel, or tensor_parallel
    alone when data_parallel is 0 (the smallest launch the keys allow).
    """
    tc = cfg.train
    world = (tc.data_parallel or 1) * tc.tensor_parallel
    layout = layout_for(cfg, world)
    if tc.batch_tokens:
        from smelt.train.batching import batch_plan

        batch_plan(tc, layout.dp)  # ConfigError when the batch does not split over the data-parallel ranks
    more = "" if tc.data_parallel else " (train.data_parallel = 0: any multiple of train.tensor_parallel)"
    return f"{layout.describe()} = {layout.world_size} processes{more}"


@dataclass
class TrainMesh:
    """The built mesh of one launch and what the trainer needs from it."""

    layout: MeshLayout
    mesh: Any  # DeviceMesh over MESH_DIMS; None for a single process
    rank: int
    data_group: Any = field(init=False, default=None)  # see __post_init__

    @property
    def data_rank(self) -> int:
        """This process's index among the data-parallel ranks (which batch rows it reads)."""
        return self.rank // self.layout.tp

    @property
    def tensor_parallel(self) -> bool:
        return self.layout.tp > 1

    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    def dp_mesh(self) -> Any:
        """The data-parallel sub-mesh FSDP2 shards over: 1-D "dp_shard", or 2-D with "dp_replicate" (HSDP)."""
        if self.layout.dp_replicate > 1:
            return self.mesh["dp_replicate", "dp_shard"]
        return self.mesh["dp_shard"]

    def _dp_group(self) -> Any:
        if self.mesh is None:
            return None  # one process: nothing to sum over
        if self.layout.dp_replicate > 1 and self.layout.dp_shard > 1:
            return self.mesh["dp_replicate", "dp_shard"]._flatten("dp").get_group()
        return self.mesh["dp_replicate" if self.layout.dp_replicate > 1 else "dp_shard"].get_group()

    def __post_init__(self) -> None:
        # The process group of the data-parallel ranks: what token counts and losses are summed over
        # (tensor-parallel ranks hold the same batch and the same loss, so they must not add up). With
        # one data-parallel rank it is a group of one, not None, which collectives read as every rank.
        self.data_group = self._dp_group()

    def loss_context(self) -> contextlib.AbstractContextManager:
        """`loss_parallel()` under tensor parallelism: the vocabulary-sharded cross-entropy needs it
        around its forward and its backward (tensor_parallel.py)."""
        if not self.tensor_parallel:
            return contextlib.nullcontext()
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()


def build_mesh(layout: MeshLayout, rank: int, device: torch.device) -> TrainMesh:
    """The DeviceMesh of `layout` over the process group (which must already exist when it has > 1 rank)."""
    if layout.world_size == 1:
        return TrainMesh(layout, None, 0)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(device.type, layout.shape, mesh_dim_names=MESH_DIMS)
    return TrainMesh(layout, mesh, rank)


def mesh_for(cfg: Config, rank: int, world_size: int, device: torch.device) -> TrainMesh:
    """The mesh the `[train]` keys ask for, built over this launch's processes."""
    return build_mesh(layout_for(cfg, world_size), rank, device)
