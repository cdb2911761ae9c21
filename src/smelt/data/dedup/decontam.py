"""Decontamination: remove (or flag) training documents that contain evaluation items.

Benchmark text in training data makes an evaluation measure memorization. Every item of every
configured evaluation set (read from its original file, see `benchmarks.py`) is cut into normalized
word n-grams (default 13, lowercased, punctuation dropped: GPT-3's and Llama's rule); a document
matches an item when it contains at least `threshold` of the item's n-grams. Items shorter than n words
are skipped (and counted): short strings such as "Paris" occur everywhere. The n-gram index is one
sorted uint64 array with the item of each n-gram, so a document is checked with one vectorized lookup.
The step runs last, before the split, and reports per benchmark the items matched and the documents
that matched them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from smelt.config import DecontamConfig
from smelt.data.dedup.benchmarks import read_items
from smelt.data.dedup.minhash import _MIX, words
from smelt.data.document import Doc, Ledger
from smelt.data.steps import CorpusStep


def ngram_hashes(text: str, n: int) -> np.ndarray:
    """64-bit hashes of the text's normalized word n-grams (empty if the text has fewer than n words)."""
    ws = words(text)
    if len(ws) < n:
        return np.zeros(0, np.uint64)
    h = np.fromiter(map(zlib.crc32, ws), np.uint64, len(ws))
    out = np.zeros(len(h) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            out = out * _MIX + h[i : len(h) - n + 1 + i]
    return out


class EvalIndex:
    """The n-grams of all evaluation items: sorted hashes, the item of each, items' n-gram counts."""

    def __init__(self, benchmarks: dict[str, list[str]], n: int):
        self.names = list(benchmarks)
        self.n = n
        hashes, owners, item_bench, item_grams = [], [], [], []
        self.too_short = {name: 0 for name in self.names}
        for b, name in enumerate(self.names):
            for text in benchmarks[name]:
                grams = np.unique(ngram_hashes(text, n))
                if len(grams) == 0:
                    self.too_short[name] += 1
                    continue
                item = len(item_bench)
                item_bench.append(b)
                item_grams.append(len(grams))
                hashes.append(grams)
                owners.append(np.full(len(grams), item, np.int64))
        self.item_bench = np.array(item_bench, np.int64)
        self.item_grams = np.array(item_grams, np.int64)
        self.items = {name: len(benchmarks[name]) for name in self.names}
        if hashes:
            all_hashes, all_owners = np.concatenate(hashes), np.concatenate(owners)
            # A shared n-gram keeps its first item (deterministic: config order, then file order).
            order = np.lexsort((all_owners, all_hashes))
            all_hashes, all_owners = all_hashes[order], all_owners[order]
            first = np.concatenate([[True], all_hashes[1:] != all_hashes[:-1]])
            self.hashes, self.owners = all_hashes[first], all_owners[first]
        else:
            self.hashes, self.owners = np.zeros(0, np.uint64), np.zeros(0, np.int64)

    def matches(self, text: str, threshold: float) -> list[int]:
        """The items of which `text` contains at least `threshold` of the n-grams."""
        grams = np.unique(ngram_hashes(text, self.n))
        if len(grams) == 0 or len(self.hashes) == 0:
            return []
        pos = np.searchsorted(self.hashes, grams)
        pos[pos == len(self.hashes)] = 0
        hit = self.hashes[pos] == grams
        if not hit.any():
            return []
        items, counts = np.unique(self.owners[pos[hit]], return_counts=True)
        share = counts / self.item_grams[items]
        return items[share >= max(threshold, 1e-12)].tolist()


class Decontaminate(CorpusStep):
    """Remove (action `remove`) or flag in meta (`contamination`) the documents matching an item."""

    name = "decontaminate"

    def __init__(self, index: EvalIndex, threshold: float, action: str):
        self.index = index
        self.threshold = threshold
        self.action = action
        self.matched_items: dict[str, set[int]] = {name: set() for name in index.names}
        self.documents: dict[str, int] = {name: 0 for name in index.names}

    @classmethod
    def from_config(cls, cfg: DecontamConfig) -> Decontaminate | None:
        if not cfg.evals:
            return None
        benchmarks: dict[str, list[str]] = {}
        for i, spec in enumerate(cfg.evals):
            name = spec.name or f"eval{i}"
            benchmarks.setdefault(name, []).extend(read_items(spec, f"data.decontam.evals[{i}]"))
        return cls(EvalIndex(benchmarks, cfg.ngram), cfg.threshold, cfg.action)

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        names = self.index.names
        for doc in docs:
            items = self.index.matches(doc.text, self.threshold)
            if not items:
                yield doc
                continue
            found: dict[str, int] = {}
            for item in items:
                name = names[int(self.index.item_bench[item])]
                self.matched_items[name].add(item)
                found[name] = found.get(name, 0) + 1
            for name in found:
                self.documents[name] += 1
            if self.action == "remove":
                ledger.drop(doc, "contaminated", step=self.name, benchmarks=found)
                continue
            doc.meta["contamination"] = found
            yield doc

    def report(self) -> dict[str, Any]:
        """Per benchmark: items, items too short to check, items matched, documents matched."""
        return {
            name: {
                "items": self.index.items[name],
                "items_too_short": self.index.too_short[name],
                "items_matched": len(self.matched_items[name]),
                "documents": self.documents[name],
                "action": self.action,
            }
            for name in self.index.names
        }
