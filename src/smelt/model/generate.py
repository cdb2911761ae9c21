"""Sampling from a Transformer: greedy, temperature, top-k and top-p, batched, with a KV cache.

A batch of prompts of different lengths is left-padded: pad positions get document id 0 and the
prompt id 1, so intra-document masking keeps every prompt from seeing its padding, and RoPE
positions count from each prompt's first real token. The logits of every row therefore equal those
of the same prompt decoded alone.
"""

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
        self.doc = torch.zeros(batch, max_len, dtype=torch.long, device=device)
        self.pos = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v at [pos, pos + T) and return all keys and values so far."""
        end = self.pos + k.shape[2]
        self.k[layer][:, :, self.pos : end] = k
        self.v[layer][:, :, self.pos : end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def store_doc_ids(self, doc_ids: torch.Tensor) -> torch.Tensor:
        """Record the document ids of this step's positions; return those of every key so far."""
        end = self.pos + doc_ids.shape[1]
        self.doc[:, self.pos : end] = doc_ids
        return self.doc[:, :end]

    def advance(self, n: int) -> None:
        self.pos += n


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, gen: torch.Generator
) -> torch.Tensor:
    """One token per row of logits [B, V]: greedy at temperature 0, else from the top-k / top-p nucleus."""
    logits = logits.float()
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already cover top_p (the first always stays).
        drop = (probs.cumsum(dim=-1) - probs) >= top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


def _left_pad(rows: list[list[int]], device) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Token ids [B, T], and doc/position ids when rows differ in length (None when they do not)."""
    width = max(len(r) for r in rows)
    if all(len(r) == width for r in rows):
        return torch.tensor(rows, dtype=torch.long, device=device), None, None
    ids = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    doc = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    pos = torch.zeros(len(rows), width, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        pad = width - len(r)
        ids[i, pad:] = torch.tensor(r, dtype=torch.long)
        doc[i, pad:] = 1
        pos[i, pad:] = torch.arange(len(r))
    return ids, doc, pos


@torch.no_grad()
def generate(
    model: Transformer,
    prompt_ids: list[int] | list[list[int]],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    eos_id: int | None = None,
    use_cache: bool = True,
    top_p: float = 1.0,
) -> list[int] | list[list[int]]:
    """Continue each prompt; return prompt + new tokens (like HF generate), ending at eos_id if sampled.

    prompt_ids is one prompt (returns one list) or a list of prompts (returns one list per prompt,
    decoded together as a batch). Every context is cropped to its last max_seq_len tokens. With
    use_cache, tokens are decoded one at a time against a KV cache; once the context would overflow
    max_seq_len the cache cannot slide (RoPE positions are absolute), so each later step recomputes
    the cropped windows instead.
    """
    single = bool(prompt_ids) and not isinstance(prompt_ids[0], (list, tuple))
    prompts = [list(prompt_ids)] if single else [list(p) for p in prompt_ids]
    if not prompts or any(not p for p in prompts):
        raise ValueError("generate needs at least one prompt token per prompt (e.g. the bos id)")
    was_training = model.training
    model.eval()
    device = model.tok_emb.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    max_len = model.cfg.max_seq_len
    seqs = [list(p) for p in prompts]
    done = [False] * len(seqs)
    B = len(seqs)
    cache = KVCache(model, B, max_len, model.tok_emb.weight.dtype, device) if use_cache else None
    next_pos: torch.Tensor | None = None  # per-row RoPE position of the next token (padded batches)
    try:
        for _ in range(max_new_tokens):
            if cache is not None and cache.pos == 0:  # prefill
                x, doc, pos = _left_pad([s[-max_len:] for s in seqs], device)
                logits, _ = model(x, cache=cache, doc_ids=doc, position_ids=pos)
                if pos is not None:
                    next_pos = pos[:, -1] + 1
            elif cache is not None and cache.pos < max_len:  # one token against the cache
                x = torch.tensor([[s[-1]] for s in seqs], dtype=torch.long, device=device)
                if next_pos is None:
                    logits, _ = model(x, cache=cache)
                else:
                    doc = torch.ones_like(x)
                    logits, _ = model(x, cache=cache, doc_ids=doc, position_ids=next_pos[:, None])
                    next_pos = next_pos + 1
            else:  # no cache, or it is full: recompute the cropped windows
                cache = None
                x, doc, pos = _left_pad([s[-max_len:] for s in seqs], device)
                logits, _ = model(x, doc_ids=doc, position_ids=pos)
            tokens = sample_next(logits[:, -1], temperature, top_k, top_p, gen).tolist()
            for i, token in enumerate(tokens):
                if not done[i]:
                    seqs[i].append(token)
                    done[i] = eos_id is not None and token == eos_id
                else:
                    seqs[i].append(seqs[i][-1])  # keeps the batch rectangular; trimmed below
            if all(done):
                break
    finally:
        model.train(was_training)
    out = []
    for prompt, s in zip(prompts, seqs, strict=True):
        new = s[len(prompt) :]
        if eos_id is not None and eos_id in new:
            new = new[: new.index(eos_id) + 1]
        out.append(prompt + new)
    return out[0] if single else out
