"""The device mesh: how the processes of a launch divide the work, by named dimension.

Dimensions, outermost first (torchtitan's order):
- "pp": pipeline parallelism, the layers split into stages that pass activations point to point
  (outermost: its traffic is the lightest, so its groups may span nodes);
- "dp_replicate": data-parallel replicas, gradients all-reduced;
- "dp_shard": data-parallel ranks that shard weights, gradients and optimizer state (FSDP2);
- "cp": context parallelism, each sequence split into chunks over the ranks of a group;
- "tp": tensor parallelism, each weight matrix split over the ranks of a group, activations exchanged
  inside every layer; innermost so that a tensor-parallel group is a run of consecutive ranks, the
  ranks of one node under torchrun.

The `[train]` keys:
- `train.tensor_parallel = T`, `train.context_parallel = C`, `train.pipeline_parallel = P`: the sizes
  of "tp", "cp" and "pp" (1: off);
- `train.data_parallel = D`: the data-parallel degree (0: every process left, world / (P x C x T));
- `train.parallel = "ddp" | "fsdp"`: whether the D data-parallel ranks replicate ("dp_replicate" = D)
  or shard ("dp_shard" = D).
The product P x D x C x T must equal the world size. Ranks that differ only in "pp", "cp" or "tp"
read the same batch rows (`data_rank`); the data-parallel group sums token counts and losses.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import torch

from smelt.config import Config
from smelt.errors import ConfigError

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@dataclass(frozen=True)
class MeshLayout:
    """The size of every mesh dimension; their product is the number of processes."""

    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def model_parallel(self) -> int:
        """The processes that share one batch row: pipeline x context x tensor."""
        return self.pp * self.cp * self.tp

    @property
    def world_size(self) -> int:
        return self.dp * self.model_parallel

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp)

    def coordinates(self, rank: int) -> dict[str, int]:
        """`rank`'s index along every dimension (row-major over MESH_DIMS, as init_device_mesh lays it out)."""
        out = {}
        for name, size in reversed(list(zip(MESH_DIMS, self.shape, strict=True))):
            rank, out[name] = divmod(rank, size)
        return {name: out[name] for name in MESH_DIMS}

    def data_rank(self, rank: int) -> int:
        """`rank`'s index among the data-parallel ranks: which batch rows it reads."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"]

    def describe(self) -> str:
        parts = [f"pp {self.pp}"] if self.pp > 1 else []
        parts += [f"dp_replicate {self.dp_replicate}", f"dp_shard {self.dp_shard}"]
        parts += [f"cp {self.cp}"] if self.cp > 1 else []
        return " x ".join([*parts, f"tp {self.tp}"])


def layout_for(cfg: Config, world_size: int) -> MeshLayout:
    """The mesh of `world_size` processes the `[train]` keys ask for; ConfigError when it cannot be."""
    tc = cfg.train
    tp, cp, pp, dp = tc.tensor_parallel, tc.context_parallel, tc.pipeline_parallel, tc.data_parallel
    inner = tp * cp * pp
    named = (
        " x ".join(
            f"train.{key} ({size})"
            for key, size in (("pipeline_parallel", pp), ("context_parallel", cp), ("tensor_parallel", tp))
            if size > 1
        )
        or "train.tensor_parallel (1)"
    )
    if world_size < inner or world_size % inner:
        lower = " and ".join(
            f"train.{key} = {_largest_divisor(size, world_size)}"
            for key, size in (("pipeline_parallel", pp), ("context_parallel", cp), ("tensor_parallel", tp))
            if size > 1 and world_size % size
        )
        raise ConfigError(
            f"{named} = {inner} processes per model replica, which does not divide the {world_size} "
            f"processes of this launch. Launch a multiple of {inner} processes "
            f"(`torchrun --nproc-per-node {inner} -m smelt.cli train CONFIG`), or lower those keys "
            f"({lower or f'so that their product divides {world_size}'}); they are the run's layout, not its plan, so an "
            f"interrupted run resumes from its checkpoints under the new layout (docs/distributed.md)."
        )
    if dp and dp * inner != world_size:
        raise ConfigError(
            f"train.data_parallel ({dp}) x {named} = {dp * inner} processes, but this launch has {world_size}. "
            f"Set train.data_parallel = {world_size // inner} (or 0: every process left), or launch "
            f"{dp * inner} processes (torchrun --nproc_per_node / --nnodes)."
        )
    dp = world_size // inner
    check_tensor_parallel(cfg)
    check_pipeline_parallel(cfg, dp)
    check_context_parallel(cfg)
    if tc.parallel == "fsdp":
        return MeshLayout(dp_shard=dp, tp=tp, pp=pp, cp=cp)
    return MeshLayout(dp_replicate=dp, tp=tp, pp=pp, cp=cp)


def _largest_divisor(size: int, world_size: int) -> int:
    """The largest degree up to `size` that divides `world_size` (1 at least)."""
    return max(d for d in range(1, size + 1) if world_size % d == 0)


def check_pipeline_parallel(cfg: Config, dp: int = 1) -> None:
    """ConfigError unless the model's layers split into train.pipeline_parallel stages that smelt can run
    (pipeline_parallel.py) with `dp` data-parallel ranks; every reason is named with its key and the fix."""
    pp, m, tc = cfg.train.pipeline_parallel, cfg.model, cfg.train
    if pp == 1:
        return
    stages = pp * (2 if tc.pipeline_schedule == "interleaved_1f1b" else 1)
    if m.n_layers < stages:
        raise ConfigError(
            f"train.pipeline_parallel = {pp} with train.pipeline_schedule = {tc.pipeline_schedule!r} needs "
            f"{stages} stages of at least one layer each, but model.n_layers is {m.n_layers}. Lower "
            f"train.pipeline_parallel or use the '1f1b' schedule."
        )
    problems = []
    if m.tie_embeddings:
        problems.append(
            "model.tie_embeddings = true puts the embedding matrix on the first stage and the LM head on "
            "the last; set model.tie_embeddings = false"
        )
    if tc.context_parallel > 1:
        problems.append("it does not compose with train.context_parallel yet; set one of the two to 1")
    if m.moe_experts:
        problems.append(
            "MoE layers (model.moe_experts) have no pipeline plan (their balancing loss spans stages)"
        )
    if m.value_embeddings:
        problems.append("model.value_embeddings needs the tokens on every stage, not built; set it to false")
    if tc.precision == "fp16":
        problems.append(
            "train.precision = 'fp16' needs one loss scale over every stage, not built; use 'bf16'"
        )
    if tc.compile is True:  # "auto" turns itself off here (speed.py)
        problems.append("train.compile = true is not built for pipeline stages; set it to false or auto")
    if tc.monitor_every > 0:  # -1 (with the telemetry) turns itself off there: train/telemetry.py
        problems.append("train.monitor_every (per-layer ratios) is not built for it; set it to -1 or 0")
    if cfg.eval.every_steps:
        problems.append(
            "in-loop task scores (eval.every_steps) are not built for it (generation needs every layer on "
            "one process); set eval.every_steps = 0 and score the checkpoints with `smelt eval RUN`"
        )
    from smelt.train.batching import batch_plan

    micro = batch_plan(tc, dp).grad_accum  # per data-parallel rank (in the smallest step of a ramp)
    if tc.pipeline_schedule == "1f1b" and micro < stages:
        problems.append(
            f"the '1f1b' schedule needs at least {stages} micro batches per step, but "
            f"train.batch_tokens / (seq_len x micro_batch x {dp} data-parallel ranks) = {micro}; lower "
            f"train.micro_batch, raise train.batch_tokens, or set train.pipeline_schedule = 'gpipe'"
        )
    if tc.pipeline_schedule == "interleaved_1f1b" and micro % max(1, micro // pp):
        problems.append(
            f"the 'interleaved_1f1b' schedule runs the micro batches in rounds of {pp}, but a step has "
            f"{micro}; make the micro batches per step (train.batch_tokens / (seq_len x micro_batch x "
            f"{dp} data-parallel ranks)) a multiple of {pp}"
        )
    if problems:
        raise ConfigError(f"train.pipeline_parallel = {pp} cannot be used: {'; '.join(problems)}.")


def check_context_parallel(cfg: Config) -> None:
    """ConfigError unless each sequence splits into 2 x train.context_parallel equal chunks (load balance)
    and the rest of the config composes with context parallelism (context_parallel.py)."""
    cp, m, tc = cfg.train.context_parallel, cfg.model, cfg.train
    if cp == 1:
        return
    problems = []
    if tc.seq_len % (2 * cp):
        problems.append(
            f"it splits each sequence into {2 * cp} chunks (two per rank, one early and one late, so causal "
            f"attention costs every rank the same), but train.seq_len ({tc.seq_len}) is not a multiple of {2 * cp}"
        )
    for key, size in (("tensor_parallel", tc.tensor_parallel), ("pipeline_parallel", tc.pipeline_parallel)):
        if size > 1:
            problems.append(f"train.{key} ({size}) does not compose with it yet; set one of the two to 1")
    if m.moe_experts or tc.expert_parallel > 1:
        problems.append(
            "MoE layers (model.moe_experts, train.expert_parallel) are not built for it: their balancing "
            "loss and load counts would see only each rank's part of the sequence"
        )
    if tc.compile is True:  # "auto" turns itself off here (speed.py)
        problems.append(
            "train.compile = true is not built for it (collectives inside the attention); set it to false "
            "or auto"
        )
    if m.attention == "flex":
        problems.append(
            "model.attention = 'flex' is not built for it (its gathered keys and values take the dense "
            "masked path); set model.attention = 'auto'"
        )
    if problems:
        raise ConfigError(f"train.context_parallel = {cp} cannot be used: {'; '.join(problems)}.")


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
    if m.value_embeddings or m.mlp != "swiglu":
        problems.append(
            "model.value_embeddings and model.mlp = 'relu2' have no tensor-parallel plan; set them to false "
            "and 'swiglu'"
        )
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

    The world size is the one the keys name: data_parallel x pipeline x context x tensor parallel, or
    the last three alone when data_parallel is 0 (the smallest launch the keys allow).
    """
    tc = cfg.train
    world = (tc.data_parallel or 1) * tc.tensor_parallel * tc.context_parallel * tc.pipeline_parallel
    layout = layout_for(cfg, world)
    if tc.batch_tokens:
        from smelt.train.batching import batch_plan

        batch_plan(tc, layout.dp)  # ConfigError when the batch does not split over the data-parallel ranks
    more = "" if tc.data_parallel else f" (train.data_parallel = 0: any multiple of {layout.model_parallel})"
    return f"{layout.describe()} = {layout.world_size} processes{more}"


@dataclass
class TrainMesh:
    """The built mesh of one launch and what the trainer needs from it."""

    layout: MeshLayout
    mesh: Any  # DeviceMesh over MESH_DIMS; None for a single process
    rank: int
    data_group: Any = field(init=False, default=None)  # see __post_init__
    pipeline_schedule: str = "1f1b"  # train.pipeline_schedule, read when "pp" > 1

    @property
    def data_rank(self) -> int:
        """This process's index among the data-parallel ranks (which batch rows it reads)."""
        return self.layout.data_rank(self.rank)

    @property
    def tensor_parallel(self) -> bool:
        return self.layout.tp > 1

    @property
    def context_parallel(self) -> bool:
        return self.layout.cp > 1

    def tp_mesh(self) -> Any:
        return self.mesh["tp"]

    def pp_mesh(self) -> Any:
        """The 1-D "pp" sub-mesh: this rank and the ranks holding the other stages of its replica."""
        return self.mesh["pp"]

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
    mesh = build_mesh(layout_for(cfg, world_size), rank, device)
    mesh.pipeline_schedule = cfg.train.pipeline_schedule
    return mesh
