"""Held-out loss and bits-per-byte per source, against gzip and xz on exactly the same bytes, plus samples.

Bits-per-byte = (sum of the model's token losses in nats) / ln 2 / (UTF-8 bytes of the scored text).
Each source's validation stream (documents joined by EOS, as tokenized) is prefixed with one EOS, so
every text token is predicted exactly once, from a context that starts at a document boundary; the EOS
tokens after each document are scored too, which the model pays for with no bytes in return. The byte
count comes from the documents themselves, and gzip and xz compress exactly those bytes.

The headline over all sources weighs each source's loss by its share of training (`training_mixture`:
tokens.mixture, or each source's share of the training tokens), so it is the loss on the data the
run was trained to model, whatever the sizes of the validation splits; bits per byte over all sources
is total bits over total bytes. The trainer's validation loss uses the same weights.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from smelt.config import Config
from smelt.documents import read_texts
from smelt.errors import UserError
from smelt.eval.compress import gzip_bits_per_byte, xz_bits_per_byte
from smelt.model.transformer import doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.progress import progress

# Edges of the context-position buckets of `loss by position`: how much a longer context helps.
POSITION_EDGES = (0, 8, 32, 128, 512, 2048, 8192)


def training_mixture(cfg: Config, tokens_dir: Path) -> dict[str, float]:
    """Each training source's share of the run's training tokens, as the data plan sets it.

    tokens.mixture (or tokens.epochs, or each stage's mixture weighted by the stage's share of
    train.tokens); with none of these, each source's natural share of the training tokens. The plan is
    laid out one sequence per step, so the weights do not depend on the world size or the batch: the
    trainer and `smelt eval` get the same ones. Empty when there is no train split.
    """
    from smelt.tokens.mixture import build_plan
    from smelt.tokens.shards import ShardSet, list_sources

    tokens_dir = Path(tokens_dir)
    if not (tokens_dir / "train").is_dir():
        return {}
    sizes = {
        source: ShardSet(tokens_dir, "train", source, verify="none").total_tokens
        for source in list_sources(tokens_dir, "train")
    }
    tc = cfg.train
    steps = max(1, math.ceil(tc.tokens / tc.seq_len))
    # allow_repeat: whether a source runs out is the trainer's check; here only the weights matter.
    tokens_cfg = dataclasses.replace(cfg.tokens, allow_repeat=True)
    plan = build_plan(tokens_cfg, sizes, tc.seq_len, 1, steps, cfg.run.seed, tc.tokens)
    total = sum(stage.sequences for stage in plan.stages)
    return {s: sum(st.weights[s] * st.sequences for st in plan.stages) / total for s in plan.sources}


def weighted_loss(
    losses: dict[str, float], tokens: dict[str, int], weights: dict[str, float]
) -> tuple[float, str, dict[str, float]]:
    """The headline loss over sources, how it was weighted, and the weights used (summing to 1).

    "mixture": the training weights renormalized over the scored sources (those with tokens scored),
    so a source without a validation split does not dilute the others. "tokens": by tokens scored, the
    fallback when no scored source has a training weight (a validation-only source). A NaN loss of a
    source with weight makes the headline NaN.
    """
    scored = sorted(s for s in losses if tokens.get(s, 0) > 0)
    if not scored:
        return float("nan"), "mixture", {}
    mass = sum(weights.get(s, 0.0) for s in scored)
    if mass > 0:
        used, kind = {s: weights.get(s, 0.0) / mass for s in scored}, "mixture"
    else:
        total = sum(tokens[s] for s in scored)
        used, kind = {s: tokens[s] / total for s in scored}, "tokens"
    return sum(used[s] * losses[s] for s in scored if used[s] > 0), kind, used


def token_shares(tokens_dir: Path) -> dict[str, float]:
    """Each source's share of the train split's tokens: the weights when no config is at hand."""
    from smelt.tokens.shards import ShardSet, list_sources

    if not (Path(tokens_dir) / "train").is_dir():
        return {}
    sizes = {
        s: ShardSet(tokens_dir, "train", s, verify="none").total_tokens
        for s in list_sources(tokens_dir, "train")
    }
    total = sum(sizes.values())
    return {s: n / total for s, n in sizes.items()} if total else {}


def position_edges(seq_len: int, marks: tuple[int, ...] = ()) -> tuple[int, ...]:
    """POSITION_EDGES, continued (x4) until the last bucket starts within a quarter of seq_len, plus an
    edge at each of `marks` below seq_len: the lengths a model was trained at (before and after a
    context extension), so that the loss at positions beyond each is a bucket sum of its own."""
    edges = set(POSITION_EDGES)
    top = POSITION_EDGES[-1]
    while top * 4 < seq_len:
        top *= 4
        edges.add(top)
    edges.update(m for m in marks if 0 < m < seq_len)
    return tuple(sorted(edges))


def trained_lengths(model_cfg: Any, meta: dict[str, Any]) -> tuple[int, ...]:
    """The context lengths a checkpoint was trained at: its run's train.seq_len and, under RoPE
    scaling, the length before the extension (yarn's original length, else seq_len / rope_factor)."""
    seq_len = int((meta.get("config") or {}).get("train", {}).get("seq_len") or 0)
    marks = {seq_len} if seq_len else set()
    if getattr(model_cfg, "rope_scaling", "none") != "none":
        extended = seq_len or model_cfg.max_seq_len
        marks.add(int(model_cfg.rope_original_max_seq_len or round(extended / model_cfg.rope_factor)))
    return tuple(sorted(marks))


def position_bucket_names(edges: tuple[int, ...] = POSITION_EDGES) -> list[str]:
    return [f"{lo}-{hi - 1}" for lo, hi in zip(edges, edges[1:], strict=False)] + [f"{edges[-1]}+"]


@torch.no_grad()
def stream_nll(
    model: torch.nn.Module,
    stream: np.ndarray,
    seq_len: int,
    batch_size: int,
    device: torch.device,
    eos_id: int | None = None,
    by_position: np.ndarray | None = None,
    edges: tuple[int, ...] = POSITION_EDGES,
) -> tuple[float, int]:
    """Sum of token losses (nats, float64) over every token of `stream` but the first, and their count.

    Windows of seq_len + 1 tokens overlap by one token, so each token is a target exactly once; a
    window's losses do not depend on which other windows share its batch (padding is never attended
    to by earlier positions and is excluded from the loss). With `eos_id`, attention stays within each
    document (EOS-delimited) and positions restart per document, as in training with doc masking.
    `by_position` (float64 [buckets, 2]) accumulates (loss sum, tokens) per bucket of the context
    position a token is predicted from (`edges`; within its document under `eos_id`).
    """
    model.eval()
    starts = list(range(0, max(len(stream) - 1, 0), seq_len))
    total, count = 0.0, 0
    for first in progress(range(0, len(starts), batch_size), desc="heldout", unit="batch"):
        chunk = starts[first : first + batch_size]
        inputs = torch.zeros((len(chunk), seq_len), dtype=torch.long)
        targets = torch.full((len(chunk), seq_len), -100, dtype=torch.long)
        for row, start in enumerate(chunk):
            window = torch.from_numpy(stream[start : start + seq_len + 1].astype(np.int64))
            inputs[row, : len(window) - 1] = window[:-1]
            targets[row, : len(window) - 1] = window[1:]
        inputs, targets = inputs.to(device), targets.to(device)
        docs = {}
        positions = torch.arange(seq_len).expand(len(chunk), seq_len)
        if eos_id is not None:
            doc_ids = doc_ids_from_tokens(inputs, eos_id)
            docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}
            positions = docs["position_ids"].cpu()
        logits, _ = model(inputs, **docs)
        losses = F.cross_entropy(
            logits.float().flatten(0, 1), targets.flatten(), ignore_index=-100, reduction="none"
        )
        mask = targets.flatten() != -100
        if by_position is not None:
            bucket = np.searchsorted(edges, positions.flatten()[mask.cpu()].numpy(), side="right") - 1
            np.add.at(by_position[:, 0], bucket, losses[mask].double().cpu().numpy())
            np.add.at(by_position[:, 1], bucket, 1)
        total += losses[mask].double().sum().item()
        count += int(mask.sum().item())
    return total, count


def heldout_bits_per_byte(
    model: torch.nn.Module,
    tokens_dir: Path,
    documents_dir: Path,
    eos_id: int,
    seq_len: int,
    batch_size: int,
    max_bytes: int = 0,
    split: str = "val",
    device: torch.device | None = None,
    doc_masking: bool = False,
    weights: dict[str, float] | None = None,
    trained_at: tuple[int, ...] = (),
    token_bytes: np.ndarray | None = None,
) -> dict[str, Any]:
    """Loss and bits-per-byte of the model, gzip and xz, per source and over all sources of `split`.
    `max_bytes` (0: all) caps the UTF-8 bytes scored, split evenly over the sources: whole documents
    in order, then the one that crosses a source's cap cut at the last token that ends within it
    (`token_bytes`: each id's byte length, `Tokenizer.token_byte_lengths`; None: cut in proportion).
    `doc_masking`: score with attention kept within documents (as a model trained that way sees text).
    `weights`: each source's training weight (`training_mixture`; None: its share of the train split's
    tokens). The overall loss is the weighted mean of the per-source losses (`loss_weighting` and
    `loss_weights` say how); the overall bits per byte is total bits over total bytes.
    `trained_at`: lengths the model was trained at (`trained_lengths`), each an edge of the loss by
    position when seq_len goes past it."""
    from smelt.tokens.shards import ShardSet

    device = device or torch.device("cpu")
    split_dir = tokens_dir / split
    sources = sorted(p.name for p in split_dir.iterdir() if p.is_dir()) if split_dir.is_dir() else []
    if not sources:
        raise UserError(f"no {split!r} token shards under {split_dir}. Set data.val_fraction > 0 and rerun.")
    per_source: dict[str, dict[str, Any]] = {}
    all_bytes: list[bytes] = []
    nll_total, tokens_total = 0.0, 0
    edges = position_edges(seq_len, trained_at)
    by_position = np.zeros((len(edges), 2))
    byte_cap = max_bytes // len(sources) if max_bytes else 0
    for source in sources:
        shards = ShardSet(tokens_dir, split, source)
        texts = read_texts(documents_dir, split, source)
        starts = shards.document_starts()
        if len(starts) != len(texts):
            raise UserError(
                f"{split_dir / source} holds {len(starts)} documents but {documents_dir / split / source} "
                f"holds {len(texts)}: the tokens are stale. Rerun `smelt tokenize --force`."
            )
        encoded = [t.encode("utf-8") for t in texts]
        n_docs, end, data = len(encoded), shards.total_tokens, b"".join(encoded)
        if byte_cap and len(data) > byte_cap:
            n_docs, end, data = _capped(shards, starts, encoded, byte_cap, token_bytes)
        stream = np.concatenate([np.array([eos_id], dtype=np.int64), shards.read(0, end).astype(np.int64)])
        nll, count = stream_nll(
            model, stream, seq_len, batch_size, device, eos_id if doc_masking else None, by_position, edges
        )
        per_source[source] = _figures(nll, count, data, n_docs)
        all_bytes.append(data)
        nll_total += nll
        tokens_total += count
    overall = _figures(
        nll_total, tokens_total, b"".join(all_bytes), sum(s["documents"] for s in per_source.values())
    )
    overall["loss"], overall["loss_weighting"], overall["loss_weights"] = weighted_loss(
        {s: f["loss"] for s, f in per_source.items()},
        {s: f["tokens"] for s, f in per_source.items()},
        token_shares(tokens_dir) if weights is None else weights,
    )
    overall["loss_by_position"] = {
        name: {"loss": loss / count, "tokens": int(count)}
        for name, (loss, count) in zip(position_bucket_names(edges), by_position.tolist(), strict=True)
        if count > 0
    }
    return {"overall": overall, "per_source": per_source}


def _capped(
    shards: Any, starts: np.ndarray, encoded: list[bytes], cap: int, token_bytes: np.ndarray | None
) -> tuple[int, int, bytes]:
    """(documents touched, token end, bytes) of a source's first `cap` bytes: the whole documents
    that fit, then the next one cut after its last token that ends within the cap."""
    whole, used = 0, 0
    while whole < len(encoded) and used + len(encoded[whole]) <= cap:
        used += len(encoded[whole])
        whole += 1
    first = int(starts[whole])
    if whole == len(encoded) or used == cap:
        return whole, first, b"".join(encoded[:whole])
    last = int(starts[whole + 1]) if whole + 1 < len(starts) else shards.total_tokens
    ids = shards.read(first, last - first).astype(np.int64)
    blob, room = encoded[whole], cap - used
    if token_bytes is not None:
        ends = np.cumsum(token_bytes[ids])
        if ends[-1] and ends[-1] != len(blob):  # a normalizer changed the text: scale to its bytes
            ends = np.floor(ends * len(blob) / ends[-1]).astype(np.int64)
    else:
        ends = np.floor(np.arange(1, len(ids) + 1) * len(blob) / len(ids)).astype(np.int64)
    kept = int(np.searchsorted(ends, room, side="right"))  # tokens whose text ends within the cap
    cut = int(ends[kept - 1]) if kept else 0
    return whole + (kept > 0), first + kept, b"".join(encoded[:whole]) + blob[:cut]


def _figures(nll: float, tokens: int, data: bytes, documents: int) -> dict[str, Any]:
    n_bytes = max(len(data), 1)
    return {
        "documents": documents,
        "tokens": tokens,
        "bytes": len(data),
        "loss": nll / max(tokens, 1),
        "bits_per_byte": nll / math.log(2) / n_bytes,
        "bytes_per_token": len(data) / max(tokens, 1),
        "gzip_bits_per_byte": gzip_bits_per_byte(data),
        "xz_bits_per_byte": xz_bits_per_byte(data),
    }


def samples(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    seed: int,
) -> list[dict[str, str]]:
    """Continuations of fixed prompts; each prompt starts after an EOS, as documents do in training."""
    from smelt.model.generate import generate

    gallery = []
    for i, prompt in enumerate(prompts):
        prompt_ids = [tokenizer.eos_id] + tokenizer.encode(prompt)
        out = generate(
            model,
            prompt_ids,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            seed=seed + i,
            eos_id=tokenizer.eos_id,
        )
        gallery.append({"prompt": prompt, "completion": tokenizer.decode(out[len(prompt_ids) :])})
    return gallery
