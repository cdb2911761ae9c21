"""The documents behind a training step: from the data order to ids, sources, snippets and losses.

Row r of a loader step is window `sequence` of its source (`smelt.tokens.batches.step_rows`): tokens
[sequence x seq_len, (sequence + 1) x seq_len + 1) of the source's token stream, whose `.idx` files give
every document's start. A document's place in that stream is its place among the source's tokenized
documents, which is its row in `documents/<split>/<source>/part-*.parquet` once the rows the drop list
left out (`tokens/dropped.jsonl`) are counted back in. So each input position of a row maps to a
document id without any index beyond what the stages already write.

With per-position cross-entropies of the rows (a replay's probe: for each row, its segments as
`[start, length, loss sum]`), each document also gets its mean loss at that step, and the documents
are ranked by it; documents far above the rest of their batch are the suspects (`_rank` says how far).
"""

from __future__ import annotations

import bisect
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from smelt.documents import document_parts, open_part
from smelt.tokens.drop_list import document_row, dropped_rows

SUSPECT_NATS = 2.0  # mean loss above the rest of the batch's, per token
SUSPECT_Z = 5.0
FEW_DOCUMENTS = 20
SUSPECT_MIN_TOKENS = 8  # fewer positions than this are too few to judge a document by
SNIPPET_TOKENS = 48
SNIPPET_CHARS = 160
_MAD_TO_STD = 1.4826


def batch_documents(
    loader: Any,
    loader_steps: list[int],
    tokens_dir: Path,
    documents_dir: Path | None = None,
    tokenizer: Any = None,
    probe: list[list[list[float]]] | None = None,
) -> list[dict[str, Any]]:
    """Every document of the global batches of `loader_steps`, most suspicious first (by mean loss when
    `probe` gives the rows' segment losses, else by tokens in the batch)."""
    from smelt.tokens.batches import step_rows

    streams = {stream.name: stream for stream in loader.streams}
    found: dict[tuple[str, int], dict[str, Any]] = {}
    row_number = 0
    for loader_step in loader_steps:
        for row in step_rows(loader, loader_step):
            stream = streams[row["source"]]
            shards, first = stream.shards, int(row["sequence"]) * loader.seq_len
            segments = probe[row_number] if probe is not None else _segments(stream, first, loader.seq_len)
            for start, length, loss_sum in segments:
                ordinal = _ordinal(shards, first + int(start))
                doc = found.setdefault((row["source"], ordinal), {
                    "source": row["source"], "document": ordinal, "rows": [], "tokens": 0, "loss_sum": 0.0,
                    "_at": first + int(start), "_length": int(length),
                })  # fmt: skip
                doc["rows"].append(row_number)
                doc["tokens"] += int(length)
                doc["loss_sum"] += float(loss_sum)
            row_number += 1
    documents = list(found.values())
    for doc in documents:
        if probe is not None:
            doc["loss"] = doc["loss_sum"] / max(doc["tokens"], 1)
        doc.pop("loss_sum")
        stream = streams[doc["source"]]
        tokens = stream.shards.read(doc.pop("_at"), min(doc.pop("_length"), SNIPPET_TOKENS))
        doc["snippet"] = _decode(tokenizer, tokens)
    _identify(documents, Path(tokens_dir), documents_dir, loader.split)
    _rank(documents, probe is not None)
    return documents


def _ordinal(shards: Any, offset: int) -> int:
    """The place in its source of the document holding stream offset `offset` (per-shard .idx lookups)."""
    bounds = shards.starts.tolist()
    k = bisect.bisect_right(bounds, offset) - 1
    before = sum(len(s.offsets) for s in shards.shards[:k])
    return before + int(np.searchsorted(shards.shards[k].offsets, offset - bounds[k], side="right")) - 1


def _segments(stream: Any, first: int, seq_len: int) -> list[list[float]]:
    """[start, length, 0] of each document's input positions in a window starting at `first` (a
    document starts after the previous one's EOS, as the packed rows' segments do)."""
    ends = stream.ends_in(first, first + seq_len - 1) - first
    edges = [0, *(int(e) + 1 for e in ends), seq_len]
    return [[lo, hi - lo, 0.0] for lo, hi in zip(edges, edges[1:], strict=False) if hi > lo]


def _decode(tokenizer: Any, tokens: np.ndarray) -> str:
    if tokenizer is None:
        text = " ".join(str(int(t)) for t in tokens)
    else:
        text = tokenizer.decode(np.asarray(tokens))
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[: SNIPPET_CHARS - 1] + "…"


def _identify(
    documents: list[dict[str, Any]], tokens_dir: Path, documents_dir: Path | None, split: str
) -> None:
    """Set each document's `row` and `id` from the documents parquet parts (id None without them)."""
    by_source: dict[str, list[dict[str, Any]]] = {}
    for doc in documents:
        by_source.setdefault(doc["source"], []).append(doc)
    for source, docs in by_source.items():
        gone = dropped_rows(tokens_dir, split, source)
        for doc in docs:
            doc["split"], doc["row"], doc["id"] = split, document_row(doc["document"], gone), None
        parts = document_parts(documents_dir, split, source) if documents_dir is not None else []
        base = 0
        for path in parts:
            part = open_part(path)
            rows = part.metadata.num_rows
            mine = [d for d in docs if base <= d["row"] < base + rows]
            if mine:
                ids = part.read(columns=["id"]).column("id").to_pylist()
                for doc in mine:
                    doc["id"] = str(ids[doc["row"] - base])
            base += rows


def _rank(documents: list[dict[str, Any]], with_loss: bool) -> None:
    """Sort most suspicious first and mark the suspects (only with losses): a suspect holds at least
    `SUSPECT_MIN_TOKENS` positions of the batch, its mean loss is `SUSPECT_NATS` or more above the rest of
    the batch's (`excess`), and in a batch of `FEW_DOCUMENTS` or more it also stands out from the other
    documents by a robust z-score above `SUSPECT_Z` (a large batch always holds a few odd documents)."""
    if not with_loss:
        documents.sort(key=lambda d: (-d["tokens"], d["source"], d["document"]))
        return
    documents.sort(key=lambda d: (-d["loss"], d["source"], d["document"]))
    losses = [d["loss"] for d in documents]
    median = statistics.median(losses) if losses else 0.0
    spread = _MAD_TO_STD * statistics.median(abs(x - median) for x in losses) if losses else 0.0
    total = sum(d["loss"] * d["tokens"] for d in documents)
    tokens = sum(d["tokens"] for d in documents)
    for doc in documents:
        above = doc["loss"] - median
        z = above / spread if spread > 0 else (math.inf if above > 0 else 0.0)
        rest = tokens - doc["tokens"]
        excess = doc["loss"] - (total - doc["loss"] * doc["tokens"]) / rest if rest else 0.0
        doc["z"] = round(z, 2) if math.isfinite(z) else None
        doc["excess"] = round(excess, 4)
        doc["suspect"] = bool(
            doc["tokens"] >= SUSPECT_MIN_TOKENS
            and excess >= SUSPECT_NATS
            and (len(documents) < FEW_DOCUMENTS or z > SUSPECT_Z)
        )
