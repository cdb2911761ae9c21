"""The training model built without a whole copy on any rank: on the meta device, sharded, then
materialised and initialised shard by shard (torchtitan's order: meta init, parallelise, to_empty,
init_weights), with the values of the one-process build.

Under FSDP2, tensor or pipeline parallelism every rank builds the model on the meta device (shapes, no
storage), applies its layout (train/parallel/distributed.py's wrap_model: TP, PP, FSDP2), allocates only its
own shards (`to_empty`), and then replays, from the run seed, the draws a CPU build makes: torch's
default init of each layer as it is constructed (model/init.py's constructor_steps, discarded), then
the model's own initialisation (`Transformer.init_steps`), draw by draw: each draw fills one full-size scratch tensor from the global CPU generator,
exactly as the one-process init fills the parameter itself, and the rank keeps its shard of it. So an
N-rank run starts from the bitwise-same weights as a 1-rank run, and no rank ever holds more than its
shards plus one tensor in flight (the largest is the embedding).

A single process, DDP (every rank holds the whole model anyway) and expert parallelism (its experts are
sliced from a built model, model/moe_parallel.py) build the whole model first, as before.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from itertools import chain
from typing import Any

import torch
from torch import nn

from smelt.model.init import InitStep, constructor_steps
from smelt.model.moe import MoE
from smelt.model.moe_parallel import setup_expert_parallel
from smelt.model.rope import model_rope_table
from smelt.model.transformer import Transformer, rotary_dim
from smelt.train.parallel.distributed import DistContext, wrap_model
from smelt.train.parallel.mesh import TrainMesh


def builds_sharded(cfg: Any, ctx: DistContext, mesh: TrainMesh) -> bool:
    """True where each rank keeps a shard of the weights: FSDP2, TP or PP over several processes."""
    if not ctx.distributed or cfg.train.expert_parallel > 1:
        return False
    return cfg.train.parallel == "fsdp" or mesh.tensor_parallel or mesh.layout.pp > 1


def build_training_model(
    cfg: Any, vocab_size: int, ctx: DistContext, device: torch.device, mesh: TrainMesh
) -> tuple[Transformer, nn.Module, str]:
    """(the model, what the trainer calls: the model under its layout, and how it was built: "sharded"
    or "whole"). Both ways give the weights of `Transformer(cfg.model, vocab_size)` built right after
    torch.manual_seed(cfg.run.seed)."""
    if not builds_sharded(cfg, ctx, mesh):
        torch.manual_seed(cfg.run.seed)
        model = Transformer(cfg.model, vocab_size).to(device)
        setup_expert_parallel(model, cfg, ctx.world_size, device)  # MoE experts over processes (or no-op)
        return model, wrap_model(model, cfg.train.parallel, ctx, device, mesh), "whole"
    with torch.device("meta"):
        model = Transformer(cfg.model, vocab_size)
    replayed = [(s, tuple(s.target(model).shape)) for s in constructor_steps(model)]  # type: ignore[union-attr]
    steps = [(s, tuple(s.target(model).shape)) for s in model.init_steps()]  # type: ignore[union-attr]
    wrapped = wrap_model(model, cfg.train.parallel, ctx, device, mesh)
    materialize(model, wrapped, replayed, steps, cfg.run.seed, device)
    return model, wrapped, "sharded"


def materialize(
    model: Transformer,
    wrapped: nn.Module,
    replayed: list[tuple[InitStep, tuple[int, ...]]],
    steps: list[tuple[InitStep, tuple[int, ...]]],
    seed: int,
    device: torch.device,
) -> None:
    """Allocate this rank's shards on `device` and fill them with the one-process init of `seed`:
    `replayed` are the draws building the modules made (discarded: they only move the generator),
    `steps` the model's own initialisation (kept, shard by shard)."""
    wrapped.to_empty(device=device)
    for module in model.modules():  # what the layout does not hold (a pipeline rank's own root)
        own = chain(module.parameters(recurse=False), module.buffers(recurse=False))
        if any(t.is_meta for t in own):
            module.to_empty(device=device, recurse=False)
    rope = model_rope_table(model.cfg, max(rotary_dim(model.cfg), 2)).to(device)
    for module in chain(model.modules(), wrapped.modules()):
        if "rope" in module._buffers:  # derived from the config, never drawn
            module._buffers["rope"] = rope
        if isinstance(module, MoE):
            module.reset_counters()
    torch.manual_seed(seed)
    with torch.no_grad():
        for step, shape in replayed:
            for _ in row_blocks(step, shape):
                pass
        for step, shape in steps:
            target = step.target(model)
            region = local_region(target, shape) if target is not None else None
            for first, block in row_blocks(step, shape):
                if region is not None:
                    write_rows(target, region, first, block)  # type: ignore[arg-type]
    head, embedding = getattr(model.lm_head, "weight", None), getattr(model.tok_emb, "weight", None)
    if model.cfg.tie_embeddings and head is not None and embedding is not None and head is not embedding:
        raise RuntimeError("the tied embedding and LM head came apart while the model was materialised")


# Rows drawn at a time: a draw goes through a scratch block of at most this many values, so no rank holds
# more than its shards plus 16 MB in flight, whatever the size of the embedding.
BLOCK_VALUES = 1 << 22
NORMAL_GROUP = 16  # CPU normal_ draws in groups of 16 values (with a redrawn tail): blocks keep to them


def row_blocks(step: InitStep, shape: tuple[int, ...]) -> Iterator[tuple[int, torch.Tensor]]:
    """(first row, block) covering `shape` along dim 0, drawn in order from the global generator. The
    CPU generator fills a tensor value after value (uniform_, and normal_ in groups of 16 whose tail
    group is redrawn), so blocks of whole groups, the last at least one group long, draw exactly the
    values one draw of the whole tensor would."""
    rows = shape[0] if shape else 1
    row_values = max(1, math.prod(shape[1:]))
    unit = NORMAL_GROUP // math.gcd(row_values, NORMAL_GROUP)  # rows per whole number of groups
    per_block = max(unit, BLOCK_VALUES // row_values // unit * unit)
    first = 0
    while first < rows:
        last = min(rows, first + per_block)
        if 0 < (rows - last) * row_values < NORMAL_GROUP:  # a short tail joins this block
            last = rows
        block = torch.empty((last - first, *shape[1:]) if shape else (), dtype=torch.float32)
        step.draw(block)
        yield first, block
        first = last


def local_region(target: torch.Tensor, shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(offset, size) per dimension of the part of the whole tensor this rank holds in `target`."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if isinstance(target, DTensor):
        size, offset = compute_local_shape_and_global_offset(shape, target.device_mesh, target.placements)
        return tuple(offset), tuple(size)
    return (0,) * len(shape), tuple(shape)


def write_rows(
    target: torch.Tensor, region: tuple[tuple[int, ...], tuple[int, ...]], first: int, block: torch.Tensor
) -> None:
    """Copy the part of `block` (whole rows first.. of the full tensor) that falls in this rank's region."""
    from torch.distributed.tensor import DTensor

    local = target.to_local() if isinstance(target, DTensor) else target
    if block.dim() == 0:
        local.copy_(block)
        return
    offset, size = region
    start, stop = max(first, offset[0]), min(first + block.shape[0], offset[0] + size[0])
    if start >= stop or 0 in size:
        return
    inner = tuple(slice(o, o + n) for o, n in zip(offset[1:], size[1:], strict=True))  # in the full tensor
    local[start - offset[0] : stop - offset[0]].copy_(block[(slice(start - first, stop - first), *inner)])
