"""The LM head and the cross-entropy in chunks of rows, never holding the whole batch's fp32 logits.

The usual loss path makes [B T, V] logits, an fp32 copy of them for the log-softmax, and as much
again for their gradient. Here the rows go through the head and the loss `chunk_rows` at a time, and
each chunk's gradient with respect to the hidden states and the head weight is taken right away in
the forward (the gradient of a mean cross-entropy is softmax - one-hot over the scored rows): a
chunk's logits are freed before the next one is made, and the backward only scales what the forward
kept (one [B T, d] tensor and one [V, d] tensor) by the incoming gradient.

The arithmetic is lm_loss's: the logits come from the head's matmul in the autocast dtype, the
log-softmax, the log-sum-exp of the z-loss and the sums are fp32, and the gradient goes back into
the matmuls in the logits' dtype as autograd would send it through logits.float().
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # a target the losses skip (transformer.py re-exports it)


def chunked_lm_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    z_loss: float = 0.0,
    chunk_rows: int = 4096,
) -> dict[str, torch.Tensor]:
    """lm_loss(F.linear(hidden, weight), targets, z_loss) with reduction "mean", in chunks of rows.

    {"loss", "ce", "z_loss"}: "loss" (ce + z-loss term) carries the gradient to hidden and weight;
    "ce" and "z_loss" are the parts to log, without gradient.
    """
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be at least 1, got {chunk_rows}")
    loss, ce, z = _ChunkedLMLoss.apply(hidden, weight, targets, float(z_loss), int(chunk_rows))
    return {"loss": loss, "ce": ce, "z_loss": z}


def _chunk_forward(
    h: torch.Tensor,
    weight: torch.Tensor,
    t: torch.Tensor,
    z_loss: float,
    scale: torch.Tensor,
    need_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(ce sum, z-loss sum, d(mean loss)/d logits in fp32 or None) of one chunk of rows."""
    logits = F.linear(h, weight)
    flat = logits.float()
    keep = t != IGNORE_INDEX
    log_z = torch.logsumexp(flat, dim=-1)
    safe_t = torch.where(keep, t, torch.zeros_like(t))
    target_logit = flat.gather(1, safe_t.unsqueeze(1)).squeeze(1)
    keep_f = keep.float()
    ce_sum = ((log_z - target_logit) * keep_f).sum()
    z_sum = (log_z.pow(2) * keep_f).sum() if z_loss else flat.new_zeros(())
    if not need_grad:
        return ce_sum, z_sum, None
    # d/dlogits of (ce + z_loss lse^2) per row: softmax - onehot + 2 z_loss lse softmax, over scored rows.
    grad = (flat - log_z.unsqueeze(1)).exp_()  # the softmax, from the log-sum-exp already taken
    if z_loss:
        grad.mul_((1.0 + 2.0 * z_loss * log_z).unsqueeze(1))
    grad.scatter_add_(1, safe_t.unsqueeze(1), -torch.ones_like(target_logit).unsqueeze(1))
    grad.mul_((keep_f * scale).unsqueeze(1))
    return ce_sum, z_sum, grad.to(logits.dtype)


class _ChunkedLMLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        z_loss: float,
        chunk_rows: int,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        d = hidden.shape[-1]
        h = hidden.reshape(-1, d)
        t = targets.reshape(-1)
        scored = (t != IGNORE_INDEX).sum().clamp(min=1).float()  # a tensor: no host sync, no graph break
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        compute_dtype = (
            torch.get_autocast_dtype(h.device.type) if torch.is_autocast_enabled(h.device.type) else None
        )
        w = weight.to(compute_dtype) if compute_dtype is not None else weight
        grad_h = torch.empty_like(h, dtype=w.dtype) if need_grad else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        ce_total = h.new_zeros((), dtype=torch.float32)
        z_total = h.new_zeros((), dtype=torch.float32)
        for start in range(0, h.shape[0], chunk_rows):
            rows = slice(start, start + chunk_rows)
            hc = h[rows].to(w.dtype)
            ce_sum, z_sum, grad = _chunk_forward(hc, w, t[rows], z_loss, 1.0 / scored, need_grad)
            ce_total += ce_sum
            z_total += z_sum
            if grad is not None:
                grad_h[rows] = grad @ w
                grad_w += (grad.t() @ hc).float()
        ce = ce_total / scored
        z = z_loss * z_total / scored
        if need_grad:
            ctx.save_for_backward(grad_h.to(hidden.dtype).view_as(hidden), grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(ce, z)
        return ce + z, ce, z

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_loss.to(grad_h.dtype), grad_w * grad_loss.to(grad_w.dtype), None, None, None
