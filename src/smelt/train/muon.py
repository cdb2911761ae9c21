"""Muon: momentum SGD whose update for a 2-D weight is orthogonalised by a Newton-Schulz iteration.

For hidden matmul weights the orthogonalised update moves every singular direction by the same
amount, which (Jordan et al. 2024, Liu et al. 2025 "Muon is scalable") trains faster per token than
AdamW. It is only defined for matrices: embeddings, the LM head, norms and biases keep AdamW, in the
same optimizer object so that one step, one state dict and one LR schedule cover both.

Groups with `muon=True` get Muon (lr is the group's own, e.g. 0.02, scaled like AdamW's by the
schedule); the rest get AdamW with the usual betas/eps/decoupled weight decay. The update is scaled
by sqrt(max(1, rows/cols)) so its RMS is independent of the matrix's aspect ratio. A 3-D weight (the
MoE's experts, stacked [experts, in, out]) is orthogonalised expert by expert.
Not supported under FSDP2 (the orthogonalisation needs the whole matrix, which FSDP shards).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch


def newton_schulz(g: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """An approximately orthogonal matrix with g's singular vectors (the quintic iteration of Muon); for
    a 3-D g, each matrix g[i] on its own."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.float()
    transposed = x.shape[-2] > x.shape[-1]
    if transposed:
        x = x.mT
    x = x / ((x.norm() if x.ndim == 2 else torch.linalg.matrix_norm(x, keepdim=True)) + eps)
    for _ in range(steps):
        s = x @ x.mT
        x = a * x + (b * s + c * s @ s) @ x
    return x.mT if transposed else x


def shape_scale(p: torch.Tensor) -> float:
    """sqrt(max(1, out/in)): a 2-D weight is nn.Linear's [out, in]; a 3-D one a stack of matrices in the
    x @ W layout [n, in, out] (the MoE's experts)."""
    rows, cols = (p.shape[0], p.shape[1]) if p.ndim == 2 else (p.shape[2], p.shape[1])
    return math.sqrt(max(1.0, rows / cols))


class Muon(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 0.02,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        ns_steps: int = 5,
    ) -> None:
        defaults = {"lr": lr, "momentum": momentum, "betas": betas, "eps": eps,
                    "weight_decay": weight_decay, "ns_steps": ns_steps, "muon": False}  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        assert closure is None, "Muon does not take a closure"
        for group in self.param_groups:
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if wd:
                    p.mul_(1 - lr * wd)  # decoupled weight decay, as in AdamW
                if group["muon"]:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p)
                    buf = state["momentum_buffer"]
                    buf.mul_(group["momentum"]).add_(p.grad)
                    update = p.grad.add(buf, alpha=group["momentum"])  # Nesterov
                    ortho = newton_schulz(update, group["ns_steps"]).to(p.dtype)
                    p.add_(ortho, alpha=-lr * shape_scale(p))
                    continue
                beta1, beta2 = group["betas"]
                if "step" not in state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = float(state["step"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(group["eps"])
                p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1**t))
