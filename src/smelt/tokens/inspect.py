"""Look inside token shards: decode a window with document boundaries marked, and count tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

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
