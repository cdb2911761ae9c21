"""Pipeline parallelism with `torch.distributed.pipelining`: the layers split into stages over the "pp" mesh.

The split (`split_model`):
- the blocks are cut into contiguous stages balanced by forward FLOPs per token, the embedding counted
  on the first stage and the final norm + LM head (2 x d_model x vocab per token, often the heaviest
  piece of a small model) on the last; every stage keeps at least one block;
- stage s lives on pp rank s mod P: one stage per rank for the "1f1b" and "gpipe" schedules, two for
  "interleaved_1f1b" (rank r holds stages r and r + P, as torchtitan's looped placement);
- each rank keeps the one `Transformer` the trainer built, with what it does not own replaced by
  parameterless `NotOnThisStage` placeholders: the parameter names (FQNs) stay those of the unsplit
  model, so a DCP checkpoint written under any split loads under any other or in one process, and the
  optimizer and checkpointer see exactly this rank's parameters;
- a tied LM head would live on the first and the last stage at once; it is refused (mesh.py says so,
  naming model.tie_embeddings) rather than kept as a copy whose gradient is all-reduced.

A step (`PipelineModel.forward_backward`) puts its micro batches through the schedule (ScheduleGPipe,
Schedule1F1B or ScheduleInterleaved1F1B). The loss of micro batch i on the last stage is step.py's:
its token-mean cross-entropy times its share of the step's global target tokens (summed over the data-
parallel ranks) times the data-parallel degree (FSDP2 averages gradients over those ranks), so the
gradients equal one process's; the schedule's own 1/n_microbatches scaling is off. The logged loss is
summed on the last stage, over the data-parallel group, then over the pp group (the other stages add
zeros), so every rank logs the same number. The gradient norm for the clip is summed over every stage
(`PipelineSplit.grad_norm`). With train.parallel = "fsdp" (or "ddp" with several data-parallel ranks,
HSDP with shards of one) each stage's blocks and its root are FSDP2 units over the data-parallel sub-mesh.

With train.tensor_parallel the whole model is first sharded by tensor_parallel.py's plan (it names the
unsplit modules), then split: between stages each tensor-parallel rank passes its sequence shard of the
residual stream to the rank with the same "tp" coordinate in the next stage, and the schedule runs
under `loss_parallel()` for the vocabulary-parallel cross-entropy of the last stage. What does not
compose (context parallelism, MoE, fp16's loss scale, compile, per-layer ratios, in-loop task scores)
is refused in mesh.check_pipeline_parallel, each with its key.

Validation (a forward without gradients, as monitors.evaluate calls the model) passes the activations
from stage to stage point to point and broadcasts the last stage's losses over the pp group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.checkpoint import checkpoint

from smelt.config import ModelConfig
from smelt.model.attention import document_mask
from smelt.model.flops import head_dim_of, resolved_d_ff
from smelt.model.transformer import lm_loss
from smelt.train.parallel.collectives import all_reduce_sum
from smelt.train.step_tokens import add_source_rows, source_sums, step_token_counts

if TYPE_CHECKING:
    from smelt.train.parallel.mesh import TrainMesh
    from smelt.train.precision import Precision

STAGES_PER_RANK = {"gpipe": 1, "1f1b": 1, "interleaved_1f1b": 2}


def _full(parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Loss parts as plain tensors: under tensor parallelism they are DTensors (autograd flows through)."""
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in parts.items()}


class NotOnThisStage(nn.Module):
    """The place of a module another pipeline stage owns: no parameters, and no forward."""

    mlp = None  # what the MoE helpers look for in a block (moe.moe_layers_of): nothing here

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("this module lives on another pipeline stage (train.pipeline_parallel)")


def block_flops(cfg: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of one block: its matmuls and causal attention over seq_len."""
    d, hd = cfg.d_model, head_dim_of(cfg)
    heads, kv = cfg.n_heads, cfg.n_kv_heads or cfg.n_heads
    matmuls = d * heads * hd * 2 + 2 * d * kv * hd + 3 * d * resolved_d_ff(cfg)
    return 2.0 * matmuls + 2.0 * heads * hd * seq_len  # q.k and p.v over the causal half


def stage_layers(cfg: ModelConfig, vocab_size: int, seq_len: int, stages: int) -> list[range]:
    """The blocks of each stage: contiguous, at least one each, the costliest stage as cheap as it can be.

    Costs are forward FLOPs per token; the last stage also pays for the LM head (the embedding is a
    lookup). An exact search over the cut points (n_layers and stages are small).
    """
    n = cfg.n_layers
    if stages > n:
        raise ValueError(f"{stages} stages need at least {stages} layers, not {n}")
    layer = block_flops(cfg, seq_len)
    head = 2.0 * cfg.d_model * vocab_size

    def cost(first: int, last: int, is_last: bool) -> float:
        return (last - first) * layer + (head if is_last else 0.0)

    # best[s][i]: the lowest maximum stage cost of blocks [0, i) in s stages, and the cut before stage s-1.
    best: list[list[tuple[float, int]]] = [[(math.inf, 0)] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0)
    for s in range(1, stages + 1):
        for i in range(s, n + 1):
            for j in range(s - 1, i):
                worst = max(best[s - 1][j][0], cost(j, i, s == stages and i == n))
                if worst < best[s][i][0]:
                    best[s][i] = (worst, j)
    cuts, i = [], n
    for s in range(stages, 0, -1):
        j = best[s][i][1]
        cuts.append(range(j, i))
        i = j
    return cuts[::-1]


class StageModule(nn.Module):
    """One pipeline stage: blocks `layers` of the model, with the embedding first and the head last.

    Its forward takes token ids (first stage) or the previous stage's hidden states, and the document
    ids and positions of the micro batch (every stage builds the same mask and RoPE angles from them),
    and returns hidden states, or the logits on the last stage.
    """

    def __init__(self, model: nn.Module, layers: range, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg: ModelConfig = model.cfg  # type: ignore[assignment]
        self.layers = list(layers)
        self.tok_emb = model.tok_emb if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})  # type: ignore[index]
        self.norm = model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rope_layers = [model.rope_layers[i] for i in layers]  # type: ignore[index]
        self.register_buffer("rope", model.rope, persistent=False)
        self.autocast: Any = nullcontext  # the step's precision.autocast (PipelineModel sets it)

    def forward(
        self, x: torch.Tensor, doc_ids: torch.Tensor | None = None, position_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        T = x.shape[1]
        rope = self.rope[:T] if position_ids is None else self.rope[position_ids].unsqueeze(1)
        mask = document_mask(doc_ids, self.cfg.attention) if doc_ids is not None else None
        ckpt = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        with self.autocast():
            if self.tok_emb is not None:
                x = self.tok_emb(x)
            for layer, uses_rope in zip(self.layers, self.rope_layers, strict=True):
                block, layer_rope = self.blocks[str(layer)], rope if uses_rope else None
                if ckpt:
                    x = checkpoint(block, x, layer_rope, None, layer, mask, use_reentrant=False)
                else:
                    x = block(x, layer_rope, None, layer, mask)
            if self.lm_head is not None:
                x = self.lm_head(self.norm(x))  # type: ignore[misc]
        return x


@dataclass
class PipelineSplit:
    """What the step arithmetic needs to know of a split model (kept on it as `model.pipeline_split`)."""

    stages: int  # in all, over the pp ranks
    pp: int
    pp_group: Any
    owned: list[int]  # this rank's stages, in order (stage s lives on pp rank s mod pp)

    def grad_norm(self, params: Sequence[nn.Parameter]) -> torch.Tensor:
        """The L2 norm of every stage's gradients together, in fp32, the same on every rank.

        Each rank sums the squares of its own gradients: whole tensors (one data-parallel rank per stage)
        or DTensor shards (FSDP2, tensor parallelism), each element divided by the number of ranks of
        its stage holding it (replicated norms over "tp", HSDP's replicas; partial sums are summed
        first, as distributed.reduce_partial_grads_ does). The sum over all ranks is the whole model's.
        """
        squares = torch.zeros((), dtype=torch.float32)
        for p in params:
            grad = p.grad
            if grad is None:
                continue
            copies = 1
            if hasattr(grad, "placements"):
                if any(pl.is_partial() for pl in grad.placements):  # sequence-parallel norms: sum over "tp"
                    from torch.distributed.tensor import Replicate

                    keep = [Replicate() if pl.is_partial() else pl for pl in grad.placements]
                    p.grad = grad = grad.redistribute(grad.device_mesh, keep)
                mesh = grad.device_mesh
                copies = math.prod(mesh.size(i) for i, pl in enumerate(grad.placements) if pl.is_replicate())
                grad = grad.to_local()
            squares += torch.linalg.vector_norm(grad.detach().float()).pow(2).cpu() / copies
        return all_reduce_sum(squares).sqrt()


def split_model(model: nn.Module, mesh: TrainMesh, schedule: str) -> list[StageModule]:
    """This rank's stages of `model`, which keeps only their modules (see the module docstring)."""
    pp, rank = mesh.layout.pp, mesh.layout.coordinates(mesh.rank)["pp"]
    stages = pp * STAGES_PER_RANK[schedule]
    cfg: ModelConfig = model.cfg  # type: ignore[assignment]
    cuts = stage_layers(cfg, model.vocab_size, cfg.max_seq_len, stages)  # type: ignore[arg-type]
    owned = [s for s in range(stages) if s % pp == rank]
    chunks = [StageModule(model, cuts[s], s == 0, s == stages - 1) for s in owned]
    keep = {i for s in owned for i in cuts[s]}
    for i in range(len(model.blocks)):  # type: ignore[arg-type]
        if i not in keep:
            model.blocks[i] = NotOnThisStage()  # type: ignore[index]
    if 0 not in owned:
        model.tok_emb = NotOnThisStage()
    if stages - 1 not in owned:
        model.norm, model.lm_head = NotOnThisStage(), NotOnThisStage()
    split = PipelineSplit(stages, pp, mesh.pp_mesh().get_group(), owned)
    object.__setattr__(model, "pipeline_split", split)  # a plain attribute: not a submodule, no FQNs
    return chunks


class PipelineModel(nn.Module):
    """The split model as the trainer calls it: `forward_backward` for a step, a call for validation."""

    def __init__(self, model: nn.Module, mesh: TrainMesh, schedule: str, device: torch.device) -> None:
        super().__init__()
        from torch.distributed.pipelining import PipelineStage

        if mesh.tensor_parallel:  # the whole model first (its plan names the unsplit modules), then split
            from smelt.train.parallel.tensor import apply_tensor_parallel

            apply_tensor_parallel(model, mesh.tp_mesh())
        chunks = split_model(model, mesh, schedule)
        if mesh.layout.dp > 1:  # FSDP2 over the data-parallel ranks of each stage, units as wrap_model's
            from torch.distributed.fsdp import fully_shard

            for chunk in chunks:
                for block in chunk.blocks.values():
                    fully_shard(block, mesh=mesh.dp_mesh())
                fully_shard(chunk, mesh=mesh.dp_mesh())
        self.chunks = nn.ModuleList(chunks)
        self.split: PipelineSplit = model.pipeline_split  # type: ignore[assignment]
        self.schedule_name, self.device = schedule, device
        self.loss_context, self.tp = mesh.loss_context, mesh.layout.tp  # TP: loss_parallel, sequence shards
        self.z_loss = float(model.cfg.z_loss)  # type: ignore[union-attr]
        owned = self.owned = self.split.owned
        self.stages = [
            PipelineStage(chunk, s, self.split.stages, device, group=self.split.pp_group)
            for chunk, s in zip(chunks, owned, strict=True)
        ]
        self.has_last = self.split.stages - 1 in owned
        self._schedules: dict[int, Any] = {}
        self._loss_state: dict[str, Any] = {}

    # --- training ---------------------------------------------------------------------------------

    def _schedule(self, n_micro: int) -> Any:
        """The schedule for steps of `n_micro` micro batches (a batch ramp changes the count)."""
        if n_micro not in self._schedules:
            from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

            if self.schedule_name == "interleaved_1f1b":
                self._schedules[n_micro] = ScheduleInterleaved1F1B(
                    self.stages, n_micro, loss_fn=self._loss, scale_grads=False
                )
            else:
                kind = Schedule1F1B if self.schedule_name == "1f1b" else ScheduleGPipe
                self._schedules[n_micro] = kind(
                    self.stages[0], n_micro, loss_fn=self._loss, scale_grads=False
                )
        return self._schedules[n_micro]

    def _loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Micro batch i's loss on the last stage, weighted as step.py weighs it.

        The schedule also calls this once on micro batch 0 to infer gradient shapes before the first
        step; so it records its figures by micro batch (found from where `targets` sits in the step's
        targets), never adds them up, and the second call for micro batch 0 only writes them again.
        """
        state = self._loss_state
        base, rows_per_micro = state["targets"], state["targets"].shape[0] // len(state["counts"])
        row_bytes = base.shape[1] * base.element_size()
        i = (targets.data_ptr() - base.data_ptr()) // row_bytes // rows_per_micro
        weight = state["counts"][i] / state["global_tokens"]
        per_source = state["by_source"] is not None
        parts = _full(lm_loss(logits, targets, self.z_loss, "none" if per_source else "mean"))
        if per_source:
            state["rows"][i] = parts["ce"].detach().double().sum(dim=1)
            parts = {k: v.sum() / max(state["counts"][i], 1) for k, v in parts.items()}
        state["ce"][i] = parts["ce"].detach().float() * weight
        return parts["loss"] * (weight * state["world_size"])

    def forward_backward(
        self,
        micro: Sequence[Any],
        *,
        precision: Precision,
        world_size: int,
        doc_masking: bool,
        device: torch.device,
        sources: Sequence[str] = (),
        group: Any = None,
    ) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """step.forward_backward under pipeline parallelism: the same three results, on every rank."""
        if len({tuple(m.inputs.shape) for m in micro}) > 1:
            raise ValueError("pipeline parallelism needs the micro batches of a step to have one shape")
        row_tokens, counts, global_tokens = step_token_counts(micro, group)
        by_source = source_sums(sources, device)
        targets = torch.cat([m.targets for m in micro]).to(device)
        self._loss_state = {
            "targets": targets, "counts": counts, "global_tokens": global_tokens, "world_size": world_size,
            "by_source": by_source, "ce": [None] * len(micro), "rows": [None] * len(micro),
        }  # fmt: skip
        for chunk in self.chunks:
            chunk.autocast = precision.autocast
        inputs = torch.cat([m.inputs for m in micro]).to(device)
        docs = (
            {"doc_ids": torch.cat([m.doc_ids for m in micro]).to(device),
             "position_ids": torch.cat([m.position_ids for m in micro]).to(device)}
            if doc_masking else {}
        )  # fmt: skip
        with self.loss_context():  # TP's vocabulary-parallel cross-entropy, forward and backward
            self._schedule(len(micro)).step(inputs, target=targets, return_outputs=False, **docs)
        state, pp_group = self._loss_state, self.split.pp_group
        ce_sum = torch.zeros((), device=device, dtype=torch.float32)
        if self.has_last:
            for ce in state["ce"]:  # in the order of the micro batches, as step.py adds them
                ce_sum += ce
        ce_sum = all_reduce_sum(all_reduce_sum(ce_sum, group), pp_group)  # zeros off the last stage
        if by_source is not None:
            if self.has_last:
                index = {name: i for i, name in enumerate(sources)}
                for m, rows, tokens in zip(micro, state["rows"], row_tokens, strict=True):
                    add_source_rows(by_source, index, m.sources, rows, tokens)
            by_source = all_reduce_sum(all_reduce_sum(by_source, group), pp_group)
        self._loss_state = {}
        return ce_sum, global_tokens, by_source

    def set_requires_gradient_sync(self, sync: bool) -> None:
        """The stages switch FSDP2's gradient sync per micro batch themselves; nothing to do here."""

    # --- validation -------------------------------------------------------------------------------

    @torch.no_grad()
    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
        doc_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        loss_parts: bool = False,
    ) -> tuple[None, Any]:
        """(None, the loss) of a batch every rank of the pp group passes: stage by stage, point to point.

        Logits stay on the last stage; this is the scoring path of validation (monitors.evaluate).
        """
        if targets is None:
            raise ValueError("under pipeline parallelism the model returns losses, not logits")
        split, group = self.split, self.split.pp_group
        docs = {"doc_ids": doc_ids, "position_ids": position_ids} if doc_ids is not None else {}
        me = dist.get_rank(group)
        B, T = idx.shape
        x: torch.Tensor = idx
        for s in range(split.stages):
            owner, before = s % split.pp, (s - 1) % split.pp
            if owner != me:
                continue
            if s > 0 and before != me:
                x = torch.empty(
                    B, T // self.tp, self.chunks[0].cfg.d_model, dtype=self._hidden_dtype(), device=idx.device
                )
                dist.recv(x, group=group, group_src=before)
            x = self.chunks[self.owned.index(s)](x, **docs)
            after = (s + 1) % split.pp
            if s < split.stages - 1 and after != me:
                dist.send(x, group=group, group_dst=after)
        last = (split.stages - 1) % split.pp
        if self.has_last:
            with self.loss_context():
                parts = _full(lm_loss(x, targets, self.z_loss, reduction))
            loss = torch.stack([parts["ce"], parts["z_loss"], parts["loss"]]).float()
        else:
            shape = (3, B, T) if reduction == "none" else (3,)
            loss = torch.empty(shape, dtype=torch.float32, device=idx.device)
        dist.broadcast(loss, group=group, group_src=last)
        if loss_parts:
            return None, {"ce": loss[0], "z_loss": loss[1], "loss": loss[2]}
        return None, loss[2]

    def _hidden_dtype(self) -> torch.dtype:
        # The residual stream keeps the parameters' dtype (autocast's matmul outputs add into it).
        return next(self.chunks[0].parameters()).dtype


def wrap_pipeline_parallel(model: nn.Module, mesh: TrainMesh, device: torch.device) -> PipelineModel:
    """`model` split into this rank's stages of mesh.pipeline_schedule (FSDP2 over data-parallel ranks > 1)."""
    return PipelineModel(model, mesh, mesh.pipeline_schedule, device)
