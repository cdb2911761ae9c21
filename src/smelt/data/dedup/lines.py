"""Boilerplate line removal: lines that occur in more than K documents are removed from all of them.

Cookie banners, navigation bars and license footers repeat verbatim across thousands of pages and teach
a model nothing after the first copies. A counting pass over the map outputs (before the reduce) hashes
every line of at least `min_chars` characters (stripped) to 64 bits and counts the documents holding
it; each document counts once per line, and exact copies of a text count once (their duplicates would
otherwise turn a page's own lines into "boilerplate" and erase the kept copy). Counting is per shard
(sorted unique hashes with counts), then merged: memory is 16 bytes per distinct line of the corpus.
The step then removes the lines whose count exceeds `max_docs`; a document left empty is dropped with
reason `boilerplate_only`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from smelt.data.dedup.exact import text_digest
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep


def line_hash(line: str) -> int:
    return int.from_bytes(hashlib.blake2b(line.encode("utf-8"), digest_size=8).digest(), "little")


def doc_line_hashes(text: str, min_chars: int) -> set[int]:
    return {line_hash(s) for line in text.split("\n") if len(s := line.strip()) >= min_chars}


def count_lines(parquets: list[Path], min_chars: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique line hashes, number of distinct texts holding each) over the map shards."""
    seen: set[bytes] = set()
    hashes_parts, counts_parts = [], []
    for parquet in parquets:
        hashes: list[int] = []
        for text in pq.read_table(parquet, columns=["text"]).column("text").to_pylist():
            digest = text_digest(text)
            if digest in seen:
                continue
            seen.add(digest)
            hashes.extend(doc_line_hashes(text, min_chars))
        if hashes:
            values, counts = np.unique(np.array(hashes, np.uint64), return_counts=True)
            hashes_parts.append(values)
            counts_parts.append(counts)
    if not hashes_parts:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    values, inverse = np.unique(np.concatenate(hashes_parts), return_inverse=True)
    return values, np.bincount(inverse, weights=np.concatenate(counts_parts)).astype(np.int64)


class LineDedup(CorpusStep):
    """Remove the boilerplate lines (set by `curate` from `count_lines`); count them in meta."""

    name = "line_dedup"

    def __init__(self, max_docs: int, min_chars: int):
        self.max_docs = max_docs
        self.min_chars = min_chars
        self.boilerplate: set[int] = set()

    def set_counts(self, hashes: np.ndarray, counts: np.ndarray) -> None:
        self.boilerplate = set(hashes[counts > self.max_docs].tolist())

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        for doc in docs:
            if not self.boilerplate:
                yield doc
                continue
            kept, removed = [], 0
            for line in doc.text.split("\n"):
                stripped = line.strip()
                if len(stripped) >= self.min_chars and line_hash(stripped) in self.boilerplate:
                    removed += 1
                    continue
                kept.append(line)
            if removed:
                text = "\n".join(kept).strip()
                if not text:
                    ledger.drop(doc, "boilerplate_only", step=self.name, lines_removed=removed)
                    continue
                doc.text = text
                doc.meta["boilerplate_lines_removed"] = removed
            yield doc
