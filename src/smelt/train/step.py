"""One optimizer step's arithmetic: token-weighted accumulation, gradient sync, global-norm clipping.

Kept apart from the loop so the numbers that decide "the same config on 1 or 2 processes makes the
same updates" live in one short function:
- every micro batch's mean loss is weighted by its share of the step's *global* target tokens (summed
  over micro steps and ranks), so the gradient is the token mean over the whole global batch however
  it is split; DDP and FSDP average gradients over ranks, hence the factor world_size;
- gradients are synchronised on the last micro step only (no_sync / set_requires_gradient_sync);
- with several sources, each row's cross-entropy is also summed per source (train loss per source);
- the norm is taken after accumulation, after the all-reduce or reduce-scatter, after fp16
  unscaling, in fp32, over the whole model (across FSDP shards); the clip uses that one norm.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn

from smelt.train.parallel.collectives import all_reduce_sum
from smelt.train.parallel.distributed import clip_grads_, global_grad_norm, grad_sync
from smelt.train.parallel.pipeline import PipelineModel
from smelt.train.precision import Precision
from smelt.train.step_tokens import add_source_rows, source_sums, step_token_counts


def forward_backward(
    model: nn.Module,
    forward: Callable[..., Any],
    micro: Sequence[Any],
    *,
    precision: Precision,
    scaler: torch.amp.GradScaler | None,
    mode: str,
    world_size: int,
    doc_masking: bool,
    device: torch.device,
    sources: Sequence[str] = (),
    group: Any = None,
    loss_context: Callable[[], AbstractContextManager] = nullcontext,
) -> tuple[torch.Tensor, int, torch.Tensor | None]:
    """Accumulate the step's gradients.

    Returns (the global token-mean cross-entropy, global tokens, per-source [cross-entropy sum, tokens]
    rows in the order of `sources`, summed over ranks; None unless `sources` names two or more).
    `group`: the data-parallel ranks the sums run over (default all; tensor-parallel ranks share a batch).
    `loss_context`: entered around each micro step's forward and backward (TP's loss_parallel).
    """
    if isinstance(model, PipelineModel):  # the schedule runs the micro batches: pipeline_parallel.py
        return model.forward_backward(
            micro, precision=precision, world_size=world_size, doc_masking=doc_masking, device=device,
            sources=sources, group=group,
        )  # fmt: skip
    row_tokens, counts, global_tokens = step_token_counts(micro, group)
    ce_sum = torch.zeros((), device=device, dtype=torch.float32)
    by_source = source_sums(sources, device)
    index = {name: i for i, name in enumerate(sources)}
    for i, m in enumerate(micro):
        batch = m.to(device, non_blocking=True)
        docs = {"doc_ids": batch.doc_ids, "position_ids": batch.position_ids} if doc_masking else {}
        weight = counts[i] / global_tokens
        with grad_sync(model, mode, sync=i == len(micro) - 1), loss_context():
            with precision.autocast():
                reduction = "none" if by_source is not None else "mean"
                _, parts = forward(batch.inputs, batch.targets, loss_parts=True, reduction=reduction, **docs)
            if by_source is not None:
                # Per-token losses (0 where ignored): the row sums feed the per-source figures.
                rows = parts["ce"].detach().double().sum(dim=1)
                add_source_rows(by_source, index, batch.sources, rows, row_tokens[i])
                parts = {k: v.sum() / max(counts[i], 1) for k, v in parts.items()}
            # The logged loss is the cross-entropy; the optimized one adds the z-loss when enabled.
            loss = parts["loss"] * (weight * world_size)
            ce_sum += parts["ce"].detach().float() * weight
            (scaler.scale(loss) if scaler is not None else loss).backward()
    return (
        all_reduce_sum(ce_sum, group),
        global_tokens,
        (all_reduce_sum(by_source, group) if by_source is not None else None),
    )


def finish_grads(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler | None,
    grad_clip: float,
    sharded: bool,
) -> torch.Tensor:
    """Unscale (fp16), take the global gradient norm and clip to grad_clip; returns the pre-clip norm."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    params = [p for p in model.parameters() if p.grad is not None]
    split = getattr(model, "pipeline_split", None)  # a model split into pipeline stages sums over all
    norm = split.grad_norm(params) if split is not None else global_grad_norm(params, sharded)
    if grad_clip > 0 and bool(torch.isfinite(norm)):
        clip_grads_(params, norm, grad_clip)
    return norm
