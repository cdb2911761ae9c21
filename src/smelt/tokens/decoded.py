"""Look inside token shards and training batches: decoded text with document boundaries marked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from smelt.config import Config
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer
from smelt.tokens.shards import ShardSet, shard_name

BOUNDARY = "\n──────── document {index} (shard offset {offset}) ────────\n"


def token_frequencies(tokens: np.ndarray, tokenizer: Tokenizer, top: int = 20) -> dict[str, Any]:
    """Counts over `tokens`: distinct ids, the most frequent ones, the share of special tokens."""
    counts = np.bincount(tokens.astype(np.int64), minlength=tokenizer.vocab_size)
    order = np.argsort(-counts, kind="stable")[:top]
    specials = sorted(tokenizer.special_ids())
    return {
        "tokens": int(tokens.size),
        "distinct": int((counts > 0).sum()),
        "special_share": round(float(counts[specials].sum()) / max(1, tokens.size), 4),
        "top": [
            {"id": int(i), "count": int(counts[i]), "text": tokenizer.decode([int(i)])}
            for i in order
            if counts[i]
        ],
    }


def describe_window(
    tokens_dir: str | Path,
    split: str,
    source: str,
    shard: int,
    start: int,
    length: int,
    tokenizer_dir: str | Path,
    top: int = 20,
) -> str:
    """Decode tokens [start, start + length) of one shard, marking where each document begins, then a
    token frequency summary of the window and of the whole shard. For `smelt inspect shards`."""
    shards = ShardSet(tokens_dir, split, source, verify="size")
    names = [s.bin_path.stem for s in shards.shards]
    name = shard_name(shard)
    if name not in names:
        raise UserError(
            f"no shard {name} for {split}/{source} in {tokens_dir}: it has shards {names[0]}..{names[-1]}."
            if names
            else f"no shards for {split}/{source} in {tokens_dir}."
        )
    data = shards.shards[names.index(name)]
    if start < 0 or length <= 0 or start >= len(data):
        raise UserError(
            f"window start {start}, length {length} is outside shard {name} ({len(data)} tokens): pick "
            f"0 <= start < {len(data)} and length > 0."
        )
    tokenizer = Tokenizer.load(tokenizer_dir)
    end = min(len(data), start + length)
    window = np.asarray(data.tokens[start:end])
    offsets = data.offsets
    first = int(np.searchsorted(offsets, start, side="right")) - 1
    pieces = []
    position = start
    for doc in range(first, len(offsets)):
        doc_start = int(offsets[doc])
        if doc_start >= end:
            break
        doc_end = int(offsets[doc + 1]) if doc + 1 < len(offsets) else len(data)
        if doc_start >= start:
            pieces.append(BOUNDARY.format(index=doc, offset=doc_start))
        elif doc == first:
            pieces.append(f"… (document {doc} began at offset {doc_start})\n")
        lo, hi = max(position, doc_start), min(end, doc_end)
        pieces.append(tokenizer.decode(window[lo - start : hi - start]))
        position = hi
    if end < len(data):
        pieces.append(f"\n… (window ends at offset {end} of {len(data)})")

    def summary(title: str, tokens: np.ndarray) -> list[str]:
        freq = token_frequencies(tokens, tokenizer, top)
        rows = [
            f"{title}: {freq['tokens']} tokens, {freq['distinct']} distinct, "
            f"{freq['special_share']:.1%} special",
            f"{'id':>7}  {'count':>9}  token",
        ]
        rows += [f"{r['id']:>7}  {r['count']:>9}  {r['text']!r}" for r in freq["top"]]
        return rows

    header = (
        f"{split}/{source}/{name}.bin: {len(data)} tokens, {len(offsets)} documents; "
        f"window [{start}, {end}), documents {first}..{max(first, int(np.searchsorted(offsets, end, 'left')) - 1)}"
    )
    lines = [header, "", "".join(pieces), ""]
    lines += summary("window", window) + [""] + summary(f"shard {name}", np.asarray(data.tokens))
    return "\n".join(lines) + "\n"


SEGMENT = "\n┄┄┄┄ document boundary (position {position}) ┄┄┄┄\n"


def segment_starts(doc_ids: np.ndarray) -> list[int]:
    """Positions where a packed row's document segments begin (the first is 0)."""
    return [0, *(np.flatnonzero(np.diff(doc_ids)) + 1).tolist()]


def decode_segments(tokenizer: Tokenizer, tokens: np.ndarray, starts: list[int]) -> str:
    """A packed row as text, its document segments separated by a boundary line naming the position."""
    pieces = []
    for k, lo in enumerate(starts):
        hi = starts[k + 1] if k + 1 < len(starts) else len(tokens)
        if k:
            pieces.append(SEGMENT.format(position=lo))
        pieces.append(tokenizer.decode(tokens[lo:hi]))
    return "".join(pieces)


def describe_batch(
    cfg: Config,
    step: int,
    rows: int = 8,
    tokens_dir: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
) -> str:
    """Decode what the model sees at optimizer step `step` (1-based, as in metrics.jsonl): the stage,
    the sources of the global batch, and the first `rows` rows (0: all) with their source, sequence,
    epoch and document boundaries. For `smelt inspect batches CONFIG --step N`.

    The batch is computed from the step alone (no replay), exactly as the trainer's loader makes it.
    """
    from smelt.tokens.loader import TokenLoader

    tokens_dir = Path(tokens_dir) if tokens_dir is not None else cfg.run_dir / "tokens"
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir is not None else cfg.run_dir / "tokenizer"
    loader = TokenLoader.from_config(cfg, tokens_dir, tokenizer_dir, verify="size")
    plan = loader.plan
    if not 1 <= step <= plan.steps:
        raise UserError(
            f"--step {step} is outside this run's steps 1..{plan.steps:,} (train.tokens / train.batch_tokens); "
            f"pick a step in that range."
        )
    tokenizer = Tokenizer.load(tokenizer_dir)
    stage = plan.stage_at(step)
    shown = plan.batch_size if rows <= 0 else min(rows, plan.batch_size)
    batch = loader.rows(step, 0, shown)
    counts = loader.source_counts(step)
    mix = ", ".join(f"{name} {n}" for name, n in counts.items() if n)
    lines = [
        f"step {step:,} of {plan.steps:,}: stage {stage.name!r} ({stage.index + 1} of {len(plan.stages)}, steps "
        f"{stage.first_step:,}-{stage.last_step:,}); global batch {plan.batch_size} sequences x {plan.seq_len} "
        f"tokens; sources: {mix}",
        f"(rank r of W trains on rows [r B/W, (r+1) B/W); showing rows 0..{shown - 1})",
    ]
    for row in range(shown):
        starts = segment_starts(batch.doc_ids[row].numpy())
        sequence = int(batch.sequences[row])
        lines.append(
            f"\n──────── row {row}: {batch.sources[row]} sequence {sequence} (epoch {int(batch.epochs[row])}), "
            f"source tokens [{sequence * plan.seq_len:,}, {(sequence + 1) * plan.seq_len + 1:,}), "
            f"{len(starts)} document segment(s){', FIM' if batch.fim[row] else ''} ────────"
        )
        lines.append(decode_segments(tokenizer, batch.inputs[row].numpy(), starts))
    return "\n".join(lines) + "\n"
