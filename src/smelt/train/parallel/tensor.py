"""Tensor and sequence parallelism for smelt's Transformer, with DTensor (Megatron-style, as torchtitan).

The plan, per block, over the "tp" mesh of T ranks:
- attention: q, k and v projections column-parallel (each rank computes n_heads / T query heads and
  n_kv_heads / T key/value heads, so GQA groups stay whole on one rank), the output projection
  row-parallel; RoPE and the document mask apply per head, so they work on the local heads as they
  are (the attention reshapes by head_dim, never by the global head count);
- MLP: gate and up column-parallel, down row-parallel;
- sequence parallelism: between those regions the residual stream is sharded on the sequence
  dimension (Shard(1)), and the RMSNorms run on the local rows (SequenceParallel); entering attention
  or the MLP all-gathers the sequence, and the row-parallel projections reduce-scatter back to it;
- the token embedding is vocabulary-parallel (row-parallel over its rows, its output reduce-scattered
  onto sequence shards), the LM head column-parallel with its logits left sharded on the vocabulary,
  and the cross-entropy runs on those shards under `loss_parallel` (no rank holds [B, T, V] logits).
A tied head shares the embedding's DTensor (both are Shard(0) over the vocabulary rows).

`LossParallel` wraps the model for the trainer: the losses leave it as ordinary (replicated) tensors,
so the accumulation arithmetic in step.py is the same as without TP; logits stay vocabulary-sharded
when a loss was computed, and are gathered when the caller asked for logits only (generation, scoring).
The backward of the vocabulary-parallel cross-entropy must run under `loss_parallel()` as well: the
trainer enters `TrainMesh.loss_context()` around forward and backward; a forward without gradients
(validation) enters it here.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from smelt.train.parallel.mesh import TrainMesh


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any) -> None:
    """Shard `model` (a smelt Transformer) over the 1-D `tp_mesh` in place, as the module docstring says."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tied = model.lm_head.weight is model.tok_emb.weight  # type: ignore[union-attr]
    parallelize_module(
        model,
        tp_mesh,
        {
            "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "lm_head": ColwiseParallel(
                input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False
            ),
        },
    )
    if tied:  # parallelize_module made the head its own DTensor of the same values; share the embedding's
        model.lm_head.weight = model.tok_emb.weight  # type: ignore[union-attr]
    for block in model.blocks:  # type: ignore[union-attr]
        parallelize_module(
            block,
            tp_mesh,
            {
                "attn_norm": SequenceParallel(),
                # Attention takes (x, rope, cache, layer, mask, ve): only x is a sequence-sharded activation
                # (tensor parallelism refuses value embeddings, so ve is None).
                "attn": PrepareModuleInput(
                    input_layouts=(Shard(1), None, None, None, None, None),
                    desired_input_layouts=(Replicate(), None, None, None, None, None),
                ),
                "attn.wq": ColwiseParallel(),
                "attn.wk": ColwiseParallel(),
                "attn.wv": ColwiseParallel(),
                "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
                "mlp_norm": SequenceParallel(),
                "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                "mlp.gate": ColwiseParallel(),
                "mlp.up": ColwiseParallel(),
                "mlp.down": RowwiseParallel(output_layouts=Shard(1)),
            },
        )


def _local(value: Any) -> Any:
    """A DTensor as the whole plain tensor, on every rank (gathered when sharded; autograd flows through)."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        return value.full_tensor()
    if isinstance(value, dict):
        return {k: _local(v) for k, v in value.items()}
    return value


class LossParallel(nn.Module):
    """The tensor-parallel model as the trainer calls it: losses come back as plain tensors."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.module = model

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():  # the caller holds loss_parallel() open for the backward too
            logits, loss = self.module(idx, targets, **kwargs)
        else:
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                logits, loss = self.module(idx, targets, **kwargs)
        if targets is None:
            return _local(logits), None
        return logits, _local(loss)

    def set_requires_gradient_sync(self, sync: bool) -> None:
        """FSDP2's switch for gradient accumulation, passed on when the data-parallel ranks use it."""
        if hasattr(self.module, "set_requires_gradient_sync"):
            self.module.set_requires_gradient_sync(sync)


def wrap_tensor_parallel(model: nn.Module, mesh: TrainMesh) -> nn.Module:
    """Tensor parallelism over mesh "tp", then FSDP2 over the data-parallel sub-mesh when it has > 1 rank.

    FSDP2 on top of the TP DTensors gives 2-D (or, with "dp_replicate", HSDP) parameters; units as in
    distributed.wrap_model: each block, then the root (embedding, final norm, head).
    """
    apply_tensor_parallel(model, mesh.tp_mesh())
    if mesh.layout.dp > 1:
        from torch.distributed.fsdp import fully_shard

        dp_mesh = mesh.dp_mesh()
        for block in model.blocks:  # type: ignore[union-attr]
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    return LossParallel(model)
