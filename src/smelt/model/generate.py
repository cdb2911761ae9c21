"""Sampling from a Transformer: greedy, temperature and top-k, with an optional KV cache."""

from __future__ import annotations

import torch

from smelt.model.transformer import Transformer


class KVCache:
    """Keys and values of every layer for positions [0, pos), preallocated up to max_len."""

    def __init__(self, model: Transformer, batch: int, max_len: int, dtype: torch.dtype, device) -> None:
        attn = model.blocks[0].attn
        shape = (batch, attn.n_kv_heads, max_len, attn.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.blocks]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in model.blocks]
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v at [pos, pos + T) and return all keys and values so far."""
        end = self.pos + k.shape[2]
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def advance(self, n: int) -> None:
        self.pos += n


def _sample(logits: torch.Tensor, temperature: float, top_k: int, gen: torch.Generator) -> int:
    logits = logits.float()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k and top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    eos_id: int | None = None,
    use_cache: bool = True,
) -> list[int]:
    """Continue prompt_ids; return prompt + new tokens (like HF generate), ending at eos_id if sampled.

    The context is cropped to the last max_seq_len tokens. With use_cache, tokens are decoded one at
    a time against a KV cache; once the context would overflow max_seq_len the cache cannot slide
    (RoPE positions are absolute), so each later step recomputes the cropped window instead.
    """
    if not prompt_ids:
        raise ValueError("generate needs at least one prompt token (e.g. the bos id)")
    was_training = model.training
    model.eval()
    device = model.tok_emb.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    max_len = model.cfg.max_seq_len
    ids = list(prompt_ids)
    cache = None
    if use_cache:
        cache = KVCache(model, 1, max_len, model.tok_emb.weight.dtype, device)
    try:
        for _ in range(max_new_tokens):
            if cache is not None and cache.pos == 0:
                context = ids[-max_len:]  # prefill
            elif cache is not None and cache.pos < max_len:
                context = ids[-1:]  # decode one token
            else:
                cache = None
                context = ids[-max_len:]
            x = torch.tensor([context], dtype=torch.long, device=device)
            logits, _ = model(x, cache=cache)
            token = _sample(logits[0, -1], temperature, top_k, gen)
            ids.append(token)
            if eos_id is not None and token == eos_id:
                break
    finally:
        model.train(was_training)
    return ids
