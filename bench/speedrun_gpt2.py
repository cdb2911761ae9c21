"""The speedrun's comparison: a GPT-2-style model and training loop, written here and not in smelt.

LayerNorm, a GELU MLP of 4 d, learned positions, a head tied to the token embedding, AdamW (0.9, 0.95,
weight decay 0.1 on matrices), linear warmup then cosine to 10% of the LR, gradient clipping at 1, and no
document masking (documents joined by EOS attend across the join). It reads smelt's own token shards:
the train stream cut into windows of seq_len + 1 tokens (consecutive windows share a token), shuffled
by the seed, `batch_tokens / seq_len` windows per step; it is scored by smelt's own validation code on
the same windows as smelt's model, so the two losses compare like with like.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class GPT2Shape:
    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int


class Block(nn.Module):
    def __init__(self, s: GPT2Shape) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(s.d_model), nn.LayerNorm(s.d_model)
        self.qkv = nn.Linear(s.d_model, 3 * s.d_model)
        self.proj = nn.Linear(s.d_model, s.d_model)
        self.fc = nn.Linear(s.d_model, 4 * s.d_model)
        self.out = nn.Linear(4 * s.d_model, s.d_model)
        self.n_heads = s.n_heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, D // self.n_heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """Called as smelt's model is by its validation code: model(x, y, reduction=...) -> (logits, loss)."""

    def __init__(self, s: GPT2Shape) -> None:
        super().__init__()
        self.wte = nn.Embedding(s.vocab, s.d_model)
        self.wpe = nn.Embedding(s.seq_len, s.d_model)
        self.blocks = nn.ModuleList(Block(s) for _ in range(s.n_layers))
        self.ln_f = nn.LayerNorm(s.d_model)
        for name, p in self.named_parameters():  # GPT-2's init: N(0, 0.02), residual outputs / sqrt(2L)
            if p.dim() == 2:
                std = (
                    0.02 / math.sqrt(2 * s.n_layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                )
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, reduction: str = "mean"):
        T = x.shape[1]
        h = self.wte(x) + self.wpe(torch.arange(T, device=x.device))
        for block in self.blocks:
            h = block(h)
        logits = F.linear(self.ln_f(h), self.wte.weight)  # tied head
        if y is None:
            return logits, None
        loss = F.cross_entropy(
            logits.float().flatten(0, 1), y.flatten(), ignore_index=-100, reduction=reduction
        )
        return logits, loss

    def flops_per_token(self) -> float:
        """6 N (non-position parameters, the tied head counted once as the head) + attention's 6 L T d."""
        n = sum(p.numel() for name, p in self.named_parameters() if name != "wpe.weight")
        d, L, T = self.ln_f.weight.numel(), len(self.blocks), self.wpe.weight.shape[0]
        return 6 * n + 6 * L * T * d


def lr_at(step: int, lr: float, warmup: int, total: int) -> float:
    if step <= warmup:
        return lr * step / max(warmup, 1)
    progress = (step - warmup) / max(total - warmup, 1)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train_windows(tokens_dir: Path, seq_len: int, seed: int):
    """Endless shuffled windows of seq_len + 1 tokens over the train split (a new order each epoch)."""
    from smelt.tokens.shards import ShardSet

    sources = [
        ShardSet(tokens_dir, "train", d.name) for d in sorted((tokens_dir / "train").iterdir()) if d.is_dir()
    ]
    stream = np.concatenate([shards.read(0, shards.total_tokens) for shards in sources])
    starts = np.arange(0, len(stream) - seq_len - 1, seq_len)
    rng = np.random.default_rng(seed)
    while True:
        for start in rng.permutation(starts):
            yield stream[start : start + seq_len + 1].astype(np.int64)


def run_baseline(
    tokens_dir: Path,
    shape: GPT2Shape,
    *,
    lr: float,
    seed: int,
    tokens: int,
    batch_tokens: int,
    warmup_tokens: int,
    eval_every: int,
    validate: Callable[[nn.Module], float],
    stop_below: float | None = None,
    precision: str = "bf16",
) -> dict:
    """Train the baseline for `tokens` tokens; `validate(model)` -> held-out bits per byte every
    `eval_every` steps and at the end. Stops at the first evaluation below `stop_below` (None: never).
    Returns the curve [(step, tokens, train seconds so far, bits per byte)] and the timings."""
    torch.manual_seed(seed)
    model = GPT2(shape)
    decay = [p for p in model.parameters() if p.dim() == 2 and p is not model.wpe.weight]
    rest = [p for p in model.parameters() if not (p.dim() == 2 and p is not model.wpe.weight)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)  # fmt: skip
    rows = batch_tokens // shape.seq_len
    steps = max(1, tokens // (rows * shape.seq_len))
    warmup = max(1, warmup_tokens // (rows * shape.seq_len))
    windows = train_windows(tokens_dir, shape.seq_len, seed)
    dtype = torch.bfloat16 if precision == "bf16" else None
    curve, train_s, eval_s = [], 0.0, 0.0
    for step in range(1, steps + 1):
        started = time.perf_counter()
        batch = torch.from_numpy(np.stack([next(windows) for _ in range(rows)]))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr, warmup, steps)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            _, loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - started
        if step % eval_every == 0 or step == steps:
            started = time.perf_counter()
            bpb = validate(model)
            eval_s += time.perf_counter() - started
            curve.append((step, step * rows * shape.seq_len, round(train_s, 3), bpb))
            # A long run's curve as it goes: what an interrupted run had reached is still on record.
            print(f"baseline lr {lr:g} step {step} tokens {curve[-1][1]} train_s {train_s:.1f} bpb {bpb:.4f}",
                  file=sys.stderr, flush=True)  # fmt: skip
            if stop_below is not None and bpb < stop_below:
                break
    return {"curve": curve, "train_s": train_s, "eval_s": eval_s, "steps_run": curve[-1][0],
            "tokens_run": curve[-1][1], "flops_per_token": model.flops_per_token(),
            "params": sum(p.numel() for p in model.parameters())}  # fmt: skip
