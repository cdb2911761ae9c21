"""AdamW with weight decay on matmul weights only."""

from __future__ import annotations

import torch
from torch import nn

from smelt.config import TrainConfig


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


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    # fused is the fastest kernel on CUDA; on CPU the multi-tensor (foreach) path is.
    kernel = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        **kernel,
    )
