"""Optimizers: AdamW with weight decay on matmul weights only, or Muon for hidden matrices + AdamW."""

from __future__ import annotations

import torch
from torch import nn

from smelt.config import TrainConfig
from smelt.errors import ConfigError
from smelt.train.muon import Muon

FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay 2-D matmul weights; never norms, biases or embeddings (so a tied head is not decayed).

    Decaying the embedding pulls rare tokens' rows toward zero for no benefit (OLMo 2 / Llama practice).
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    decay, no_decay = [], []
    for _, param in model.named_parameters():  # shared (tied) parameters appear once
        if not param.requires_grad:
            continue
        if param.ndim >= 2 and id(param) not in embeddings:
            decay.append(param)
        else:
            no_decay.append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def muon_groups(model: nn.Module, cfg: TrainConfig) -> list[dict]:
    """Muon for the matrices inside the transformer blocks (2-D weights and the MoE's stacked experts);
    AdamW groups for everything else.

    The embedding and the LM head are excluded even though they are matrices: their rows are looked
    up (or read out) one token at a time, which is not the geometry Muon's orthogonalisation assumes.
    """
    blocks = getattr(model, "blocks", None)
    # 3-D: the MoE's stacked expert matrices, each orthogonalised on its own.
    hidden = {id(p) for p in blocks.parameters() if p.ndim in (2, 3)} if blocks is not None else set()
    groups = param_groups(model, cfg.weight_decay)
    muon = [p for g in groups for p in g["params"] if id(p) in hidden]
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in hidden]} for g in groups]
    # A group left empty (with tied embeddings every decayed matrix is Muon's) is dropped: torch's
    # distributed checkpoint cannot load the optimizer state of an empty group, so a fork or resume
    # that takes the optimizer's moments would fail with an IndexError.
    rest = [g for g in rest if g["params"]]
    ratio = cfg.muon_lr / cfg.lr if cfg.lr else 1.0
    return [{"params": muon, "weight_decay": cfg.weight_decay, "muon": True, "lr_scale": ratio}] + rest


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    if cfg.optimizer == "muon":
        if any(hasattr(p, "to_local") for p in model.parameters()):
            raise ConfigError(
                "train.optimizer = 'muon' needs whole matrices, but train.parallel = 'fsdp' shards them; "
                "use train.parallel = 'ddp' with Muon, or AdamW with FSDP."
            )
        return Muon(muon_groups(model, cfg), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps)
    # The fused kernel (one pass over each tensor) is the fastest on CUDA and, in torch 2.13, on CPU
    # too: 8 ms against 42 ms for foreach's per-tensor ops per step of small-5m's 6.5M parameters on
    # two AVX2 cores (docs/benchmarks.md, "Training speed"); elsewhere the multi-tensor path.
    kernel = {"fused": True} if device.type in FUSED_ADAMW_DEVICES else {"foreach": True}
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **kernel,
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Apply the schedule's LR; groups with an lr_scale (Muon's) follow the same shape at their own peak."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
