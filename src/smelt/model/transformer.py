"""A Llama-style decoder-only transformer.

Pre-norm RMSNorm blocks, grouped-query attention with rotary position embeddings (optionally on a
fraction of each head's dims, optionally skipped on every k-th layer, with optional QK-norm and
value embeddings), a SwiGLU or ReLU² MLP (or, on the layers the moe_* keys choose, a mixture of
SwiGLU experts: moe.py), no biases anywhere, and an LM head tied to the token embedding or not. Everything
numerically delicate (norm statistics, RoPE angles, the loss) is computed in fp32 so that bf16
autocast only touches the matmuls.

Packed sequences: pass `doc_ids` [B, T] (positions with different ids never attend to each other)
and `position_ids` [B, T] (RoPE positions that restart at each document); `doc_ids_from_tokens`
and `position_ids_from_doc_ids` derive both from EOS-joined token streams. The document mask is
built once per forward, as flex attention's BlockMask or a dense SDPA mask (see attention.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from smelt.config import ModelConfig
from smelt.config.moe import is_moe_layer
from smelt.model.attention import AttentionMask, attend, dense_mask, document_mask
from smelt.model.chunked_loss import IGNORE_INDEX, chunked_lm_loss
from smelt.model.flops import head_dim_of, resolved_d_ff, value_embedding_layers, ve_gate_channels
from smelt.model.init import InitStep, apply_init
from smelt.model.moe import MoE
from smelt.model.rope import apply_rope, model_rope_table, rope_table  # noqa: F401 (re-exported)

if TYPE_CHECKING:
    from smelt.model.generate import KVCache


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


def rotary_dim(cfg: ModelConfig) -> int:
    """Dims of each head that RoPE rotates: rope_fraction of the head dim, rounded down to even."""
    head_dim = head_dim_of(cfg)
    return int(head_dim * cfg.rope_fraction) // 2 * 2


def uses_rope(cfg: ModelConfig, layer: int) -> bool:
    """Layer k, 2k, 3k, ... (1-based) is a NoPE layer when nope_every = k."""
    if rotary_dim(cfg) == 0:
        return False
    return not (cfg.nope_every and (layer + 1) % cfg.nope_every == 0)


def doc_ids_from_tokens(idx: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Document ids [B, T] of an EOS-joined stream: each EOS opens the next document.

    The EOS is the separator the next document is predicted from (smelt prompts start with it too),
    so it belongs to that document: the last token of a document still predicts the EOS while seeing
    its own document, and the EOS, at position 0, predicts the first token of the next one.
    """
    return torch.cumsum((idx == eos_id).long(), dim=-1)


def position_ids_from_doc_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions [B, T] that restart at 0 wherever the document id changes."""
    B, T = doc_ids.shape
    pos = torch.arange(T, device=doc_ids.device).expand(B, T)
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    # The index of the latest document start at or before each position.
    start_of = torch.cummax(torch.where(starts, pos, torch.zeros_like(pos)), dim=-1).values
    return pos - start_of


@dataclass
class GatheredKV:
    """Attention of a context-parallel rank (train/parallel/context.py): its queries are a part of the
    sequence, and every layer gathers the keys and values of the whole sequence from the other ranks.

    `gather`: [B, H, T_local, hd] -> [B, H, T, hd] along the sequence, with autograd; `mask`: boolean
    [B or 1, 1, T_local, T], causal and within one document by the global positions of both sides.
    """

    gather: Callable[[torch.Tensor], torch.Tensor]
    mask: torch.Tensor


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, value_embedding: bool = False) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads or cfg.n_heads
        self.head_dim = head_dim_of(cfg)
        self.wq = nn.Linear(cfg.d_model, self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_heads * self.head_dim, cfg.d_model, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, cfg.norm_eps) if cfg.qk_norm else None
        # nanochat's gate for a value embedding: 2 sigmoid of a few model dims, one scalar per key/value
        # head; zero weights (init_steps) start it at 1. Absent on the layers without one.
        self.ve_gate = (
            nn.Linear(ve_gate_channels(cfg), self.n_kv_heads, bias=False) if value_embedding else None
        )
        # Telemetry (train/telemetry.py) sets a callable here for one sampled forward, which sees the
        # queries and keys as the attention scores them; None otherwise, and the forward is as before.
        self.probe: Callable[[torch.Tensor, torch.Tensor], None] | None = None

    def forward(
        self,
        x: torch.Tensor,
        rope: torch.Tensor | None,
        cache: KVCache | None = None,
        layer: int = 0,
        mask: AttentionMask | GatheredKV = None,
        ve: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """rope None: a NoPE layer. mask None: plain causal attention (or a single decode step);
        else the forward's document mask, a dense boolean tensor or a flex BlockMask. ve: this layer's
        value embedding of the tokens [B, T, n_kv_heads x head_dim], added to the values."""
        B, T, _ = x.shape
        # Heads counted from the projections (-1), not the config: under tensor parallelism each
        # rank's wq/wk/wv produce only its own n_heads / T and n_kv_heads / T heads.
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        if ve is not None:
            gate = 2 * torch.sigmoid(self.ve_gate(x[..., : self.ve_gate.in_features]))  # [B, T, kv heads]
            ve = ve.view(B, T, -1, self.head_dim).transpose(1, 2)
            # In v's dtype: under autocast the table is fp32 and v bf16, and attention takes one dtype.
            v = v + (gate.transpose(1, 2).unsqueeze(-1) * ve).to(v.dtype)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if self.probe is not None:
            self.probe(q, k)
        if isinstance(mask, GatheredKV):  # after RoPE: each rank rotates its own rows by their positions
            k, v, mask = mask.gather(k), mask.gather(v), mask.mask
        causal = mask is None
        if cache is not None:
            if mask is None and cache.pos > 0:
                # One decode token attends to every cached position; is_causal would wrongly mask
                # (it is top-left aligned), and the forward only omits the mask when T == 1.
                causal = False
            k, v = cache.update(layer, k, v)
        y = attend(q, k, v, mask, causal, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); or ReLU² (model.mlp = "relu2"): down(relu(up(x))^2),
    without the gate matrix."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d_ff = resolved_d_ff(cfg)
        self.relu2 = cfg.mlp == "relu2"
        if not self.relu2:
            self.gate = nn.Linear(cfg.d_model, d_ff, bias=False)
        self.up = nn.Linear(cfg.d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.relu2:
            return self.down(F.relu(self.up(x)).square())
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg, layer in value_embedding_layers(cfg))
        self.mlp_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MoE(cfg) if is_moe_layer(cfg, layer) else MLP(cfg)

    def forward(self, x, rope, cache=None, layer=0, mask=None, ve=None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, cache, layer, mask, ve)
        return x + self.mlp(self.mlp_norm(x))


def resolved_head_init_std(cfg: ModelConfig) -> float:
    """Init std of the LM head (and of the embedding when tied): head_init_std, else a width rule.

    Why not init_std everywhere: the final RMSNorm gives h = norm(x) unit RMS, so a head with entries of
    std s makes logits of std s * sqrt(d), and the step-0 loss exceeds ln V by about s^2 d / 2 (0.15 at
    d = 768, 0.8 at d = 4096 for s = 0.02).
    - Untied head: min(init_std, 1/d). It only reads out, so a small start costs nothing (the field's
      untied heads start near 0.001).
    - Tied: min(init_std, 0.32 / sqrt(d)), which keeps s^2 d / 2 <= 0.05 and so the step-0 loss within
      0.1 of ln V at every width, while small models (d <= 256) keep the usual 0.02. The tied matrix is
      also the input embedding: shrinking it to 1/d makes a small model's inputs nearly vanish against
      the residual branches and measurably slows early training (the quickstart's held-out loss after
      2M tokens was 5.05 instead of 4.16 nats).
    Unlike an output multiplier this leaves the exported model free of extra constants.
    """
    if cfg.head_init_std:
        return cfg.head_init_std
    if cfg.tie_embeddings:
        return min(cfg.init_std, 0.32 / math.sqrt(cfg.d_model))
    return min(cfg.init_std, 1.0 / cfg.d_model)


def lm_loss(
    logits: torch.Tensor, targets: torch.Tensor, z_loss: float = 0.0, reduction: str = "mean"
) -> dict[str, torch.Tensor]:
    """{"ce", "z_loss", "loss"}: cross-entropy and z_loss * log^2 Z in fp32, ignoring targets of -100.

    reduction "mean" averages over the scored positions; "none" gives [B, T] with 0 where ignored.
    "loss" = ce + z_loss term is what to backpropagate; "ce" is what to log.
    """
    B, T = targets.shape
    # Upcast: a bf16 log-softmax over a large vocabulary is visibly inaccurate.
    flat = logits.float().flatten(0, 1)
    ce = F.cross_entropy(flat, targets.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction)
    if reduction == "none":
        ce = ce.view(B, T)
    if not z_loss:
        return {"ce": ce, "z_loss": torch.zeros_like(ce), "loss": ce}
    keep = (targets.flatten() != IGNORE_INDEX).float()
    z = z_loss * torch.logsumexp(flat, dim=-1).pow(2) * keep
    z = z.view(B, T) if reduction == "none" else z.sum() / keep.sum().clamp(min=1.0)
    return {"ce": ce, "z_loss": z, "loss": ce + z}


def with_moe_aux_loss(
    parts: dict[str, torch.Tensor], moe_aux: torch.Tensor, targets: torch.Tensor
) -> dict[str, torch.Tensor]:
    """lm_loss's parts with the MoE balancing loss added to "loss" (and given as "moe_aux").

    With reduction "none" the (scalar) term is added at every scored position, so that any mean of
    the per-token losses over scored positions, as a trainer takes them, still includes it once.
    """
    if parts["loss"].ndim:
        keep = (targets != IGNORE_INDEX).to(parts["loss"].dtype)
        return {**parts, "moe_aux": moe_aux * keep, "loss": parts["loss"] + moe_aux * keep}
    return {**parts, "moe_aux": moe_aux, "loss": parts["loss"] + moe_aux}


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok_emb = nn.Embedding(vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.rope_layers = [uses_rope(cfg, i) for i in range(cfg.n_layers)]
        # Value embeddings (model.value_embeddings): a V x (n_kv_heads x head_dim) table per layer that
        # has one, outside the blocks so that Muon (which takes the blocks' matrices) leaves them to
        # AdamW, as it does the token embedding. None without them: the default model is unchanged.
        ve_layers = value_embedding_layers(cfg)
        kv_dim = (cfg.n_kv_heads or cfg.n_heads) * head_dim_of(cfg)
        self.value_embeds = (
            nn.ModuleDict({str(i): nn.Embedding(vocab_size, kv_dim) for i in ve_layers})
            if ve_layers
            else None
        )
        # Rows per chunk of the training loss (chunked_loss.py); 0 makes the whole batch's logits.
        # A training setting, not part of the model's shape: the trainer sets it from the config.
        self.loss_chunk_rows = 0
        table = model_rope_table(cfg, max(rotary_dim(cfg), 2))
        # Not persistent: derived from the config, so it stays out of checkpoints.
        self.register_buffer("rope", table, persistent=False)
        self.reset_parameters()

    @classmethod
    def for_loading(
        cls, cfg: ModelConfig, vocab_size: int, device: str | torch.device = "cpu"
    ) -> Transformer:
        """A model whose weights a checkpoint is about to overwrite: the random init (most of the time
        to build a large model on CPU) is skipped by building on the meta device."""
        with torch.device("meta"):
            model = cls(cfg, vocab_size)
        model.to_empty(device=device)
        model.rope = model_rope_table(cfg, max(rotary_dim(cfg), 2)).to(device)
        if cfg.tie_embeddings:  # to_empty gives each parameter its own storage
            model.lm_head.weight = model.tok_emb.weight
        for block in model.blocks:  # buffers a checkpoint does not hold start from zero
            if isinstance(block.mlp, MoE):
                block.mlp.reset_counters()
        return model

    def reset_parameters(self) -> None:
        apply_init(self, self.init_steps())

    def init_steps(self) -> list[InitStep]:
        """The random initialisation, draw by draw, in the order they consume the generator (model/init.py)."""
        std = self.cfg.init_std
        steps: list[InitStep] = []
        for path, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                steps.append(InitStep(path, "weight", "trunc_normal", std))
            elif isinstance(module, RMSNorm):
                steps.append(InitStep(path, "weight", "ones"))
            elif isinstance(module, MoE):
                steps += [InitStep(path, "w_gate", "trunc_normal", std), InitStep(path, "w_up", "trunc_normal", std),
                          InitStep(path, "expert_bias", "zeros")]  # fmt: skip
        # Each block adds two residual branches; scaling their output projections keeps the
        # residual stream's variance from growing with depth (GPT-2 / Llama practice).
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        for i, block in enumerate(self.blocks):
            mlp, prefix = block.mlp, f"blocks.{i}"
            outputs = (
                [(f"{prefix}.mlp", "w_down"), *([(f"{prefix}.mlp.shared.down", "weight")] if mlp.shared is not None else [])]
                if isinstance(mlp, MoE)
                else [(f"{prefix}.mlp.down", "weight")]
            )  # fmt: skip
            for module, name in [(f"{prefix}.attn.wo", "weight"), *outputs]:
                steps.append(InitStep(module, name, "trunc_normal", out_std))
            if block.attn.ve_gate is not None:
                steps.append(InitStep(f"{prefix}.attn.ve_gate", "weight", "zeros"))
        # The head (the embedding too, when tied) gets its own std: see resolved_head_init_std.
        steps.append(InitStep("lm_head", "weight", "trunc_normal", resolved_head_init_std(self.cfg)))
        return steps

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
        cache: KVCache | None = None,
        doc_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        loss_parts: bool = False,
        gathered_kv: GatheredKV | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | dict[str, torch.Tensor] | None]:
        """Logits [B, T, V] and, with targets, the loss (mean, or [B, T] with reduction="none").

        Targets equal to -100 are ignored; with reduction="none" they contribute a loss of 0. The loss
        is the cross-entropy plus the z-loss term when cfg.z_loss > 0 (the term to backpropagate);
        with loss_parts=True the second value is lm_loss's dict {"loss", "ce", "z_loss"} instead, so a
        trainer can log the pure cross-entropy.

        doc_ids [B, T]: positions with different ids never attend to each other (intra-document
        masking for packed sequences). position_ids [B, T]: RoPE positions (default: start + 0..T-1);
        pass position_ids_from_doc_ids(doc_ids) to restart them at each document. gathered_kv: idx is
        this rank's part of the sequence under context parallelism (see GatheredKV); it replaces the
        document mask, and position_ids must give the global positions.
        """
        B, T = idx.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds max_seq_len {self.cfg.max_seq_len}")
        if position_ids is None:
            rope = self.rope[start : start + T]
        else:
            rope = self.rope[position_ids].unsqueeze(1)  # [B, 1, T, r/2, 2]
        # One mask for every layer. A KV cache (generation) keeps the dense form: its queries start
        # at cache.pos, and prefill runs once per prompt batch, so flex's compile would not pay off.
        mask: AttentionMask | GatheredKV = None
        if gathered_kv is not None:
            mask = gathered_kv
        elif cache is not None and doc_ids is not None:
            mask = dense_mask(doc_ids, cache.store_doc_ids(doc_ids), start, T, idx.device)
        elif doc_ids is not None:
            mask = document_mask(doc_ids, self.cfg.attention)
        elif cache is not None and start > 0 and T > 1:
            mask = dense_mask(None, None, start, T, idx.device)
        x = self.tok_emb(idx)
        ckpt = self.cfg.activation_checkpointing and self.training and torch.is_grad_enabled()
        for layer, block in enumerate(self.blocks):
            layer_rope = rope if self.rope_layers[layer] else None
            ve = self._value_embedding(idx, layer)
            if ckpt and cache is None:
                x = checkpoint(block, x, layer_rope, None, layer, mask, ve, use_reentrant=False)
            else:
                x = block(x, layer_rope, cache, layer, mask, ve)
        if cache is not None:
            cache.advance(T)
        if targets is not None and self._chunks_loss(reduction):
            # Training only: the logits are never made whole, so none are returned.
            logits = None
            parts = chunked_lm_loss(
                self.norm(x), self.lm_head.weight, targets, self.cfg.z_loss, self.loss_chunk_rows
            )
        else:
            logits = self.lm_head(self.norm(x))
        moe_aux = self._take_moe_aux_loss()
        if targets is None:
            return logits, None
        if logits is not None:
            parts = lm_loss(logits, targets, self.cfg.z_loss, reduction)
        if moe_aux is not None:
            parts = with_moe_aux_loss(parts, moe_aux, targets)
        return logits, (parts if loss_parts else parts["loss"])

    def _value_embedding(self, idx: torch.Tensor, layer: int) -> torch.Tensor | None:
        if self.value_embeds is None or str(layer) not in self.value_embeds:
            return None
        return self.value_embeds[str(layer)](idx)

    def _chunks_loss(self, reduction: str) -> bool:
        """The chunked loss serves a mean loss in training, under autograd, with a whole (not
        tensor-parallel) head; everything else gets the logits."""
        return (
            self.loss_chunk_rows > 0
            and reduction == "mean"
            and self.training
            and torch.is_grad_enabled()
            and not hasattr(self.lm_head.weight, "to_local")
        )

    def _take_moe_aux_loss(self) -> torch.Tensor | None:
        """The MoE layers' balancing losses of this forward, summed; the layers let go of theirs."""
        total = None
        for block in self.blocks:
            if isinstance(block.mlp, MoE) and block.mlp.aux_loss is not None:
                total = block.mlp.aux_loss if total is None else total + block.mlp.aux_loss
                block.mlp.aux_loss = None
        return total
