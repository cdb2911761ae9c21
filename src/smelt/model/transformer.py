"""A Llama-style decoder-only transformer.

Pre-norm RMSNorm blocks, grouped-query attention with rotary position embeddings (and optional
QK-norm), a SwiGLU MLP, no biases anywhere, and an LM head tied to the token embedding or not.
Everything numerically delicate (norm statistics, RoPE angles, the loss) is computed in fp32 so
that bf16 autocast only touches the matmuls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from smelt.config import ModelConfig
from smelt.model.flops import resolved_d_ff

if TYPE_CHECKING:
    from smelt.model.generate import KVCache

IGNORE_INDEX = -100


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32: bf16 sums of squares lose too much precision at large d.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).type_as(x)


def rope_table(head_dim: int, max_seq_len: int, theta: float) -> torch.Tensor:
    """(cos, sin) of the rotary angles t * w_j, [max_seq_len, head_dim / 2, 2], fp32.

    Angles are formed in fp64 so large positions keep their precision. The table is stored real, not
    complex, so that casting the module (model.to(torch.bfloat16)) cannot silently drop the sines.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).float()


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x [B, H, T, hd] by the angles of table [T, hd/2, 2], in fp32."""
    table = table.float()
    xf = x.float().unflatten(-1, (-1, 2))
    if torch.compiler.is_compiling():
        # Inductor fuses this real form into one kernel; it cannot generate code for complex ops.
        cos, sin = table[..., 0], table[..., 1]
        x0, x1 = xf[..., 0], xf[..., 1]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    else:
        # Eager: one complex multiply is ~3x faster on CPU than the real form's separate ops and copies.
        out = torch.view_as_real(torch.view_as_complex(xf) * torch.view_as_complex(table))
    return out.flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.wq = nn.Linear(cfg.d_model, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor,
        cache: KVCache | None = None,
        layer: int = 0,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        causal = True
        if cache is not None:
            # Prefill (empty cache) is ordinary causal attention; a decode step of one token
            # attends to every cached position, which is_causal would wrongly mask (top-left aligned).
            causal = cache.pos == 0
            if not causal and T != 1:
                raise ValueError("a KV-cached forward after the prefill takes one token at a time")
            k, v = cache.update(layer, k, v)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=causal, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d_ff = resolved_d_ff(cfg)
        self.gate = nn.Linear(cfg.d_model, d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, rope, cache=None, layer=0) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, cache, layer)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        table = rope_table(cfg.d_model // cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        # Not persistent: derived from the config, so it stays out of checkpoints.
        self.register_buffer("rope", table, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        std = self.cfg.init_std
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        # Each block adds two residual branches; scaling their output projections keeps the
        # residual stream's variance from growing with depth (GPT-2 / Llama practice).
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for block in self.blocks:
            for weight in (block.attn.wo.weight, block.mlp.down.weight):
                nn.init.trunc_normal_(weight, mean=0.0, std=out_std, a=-3 * out_std, b=3 * out_std)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
        cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits [B, T, V] and, with targets, the cross-entropy (mean, or [B, T] with reduction="none").

        Targets equal to -100 are ignored; with reduction="none" they contribute a loss of 0.
        """
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
        rope = self.rope[start : start + T]
        x = self.tok_emb(idx)
        for layer, block in enumerate(self.blocks):
            x = block(x, rope, cache, layer)
        if cache is not None:
            cache.advance(T)
        logits = self.lm_head(self.norm(x))
        loss = None
        if targets is not None:
            # Upcast: a bf16 log-softmax over a large vocabulary is visibly inaccurate.
            loss = F.cross_entropy(
                logits.float().flatten(0, 1),
                targets.flatten(),
                ignore_index=IGNORE_INDEX,
                reduction=reduction,
            )
            if reduction == "none":
                loss = loss.view(B, T)
        return logits, loss
