"""Decontamination: remove (or flag) training documents that contain evaluation items.

Benchmark text in training data makes an evaluation measure memorization. Every item of every
configured evaluation set (read from its original file, see `benchmarks.py`) is cut into normalized
word n-grams (default 13, lowercased, punctuation dropped: GPT-3's and Llama's rule); a document
matches an item when it contains at least `threshold` of the item's n-grams. Items shorter than n words
are skipped (and counted): short strings such as "Paris" occur everywhere. The n-gram index is one
sorted uint64 array with the item of each n-gram; documents are checked in batches of about a million
characters (one join, one CRC-32 pass, one lookup for all their n-grams: checking one document at a time
spent ~1 ms per document in numpy call overhead, 20x the batched cost).
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
from smelt.data.dedup.minhash import _MIX, _SENTINEL_CRC, BATCH_CHARS, SENTINEL, _normalized_bytes, words
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep

_FILTER_BITS = 1 << 24


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


def batch_ngram_hashes(texts: list[str], n: int) -> tuple[np.ndarray, np.ndarray]:
    """The n-gram hashes of all texts (those of `ngram_hashes`, with repeats) and the text of each."""
    joined = _normalized_bytes(SENTINEL.join(texts)).split()
    h = np.fromiter(map(zlib.crc32, joined), np.uint64, len(joined))
    sentinel = h == _SENTINEL_CRC
    if int(sentinel.sum()) != len(texts) - 1:  # a text holds the sentinel word itself: one at a time
        parts = [ngram_hashes(t, n) for t in texts]
        owner = np.repeat(np.arange(len(texts), dtype=np.int64), [len(p) for p in parts])
        return (np.concatenate(parts) if parts else np.zeros(0, np.uint64)), owner
    if len(h) < n:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    doc = np.cumsum(sentinel)  # the sentinel word takes the number of the text after it
    out = np.zeros(len(h) - n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            out = out * _MIX + h[i : len(h) - n + 1 + i]
    valid = (doc[: len(out)] == doc[n - 1 :]) & ~sentinel[: len(out)]
    return out[valid], doc[: len(out)][valid]


def _filter_slot(hashes: np.ndarray) -> np.ndarray:
    return ((hashes ^ (hashes >> np.uint64(32))) & np.uint64(_FILTER_BITS - 1)).astype(np.int64)


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
        # A 2^24-bit filter of the index (2 MB, cache-resident) answers most lookups: only n-grams whose
        # bit is set (the index's own and ~4% of the others at 700k indexed n-grams) go to the binary
        # search, whose random access over the index was half the step's time.
        self.bits = np.zeros(_FILTER_BITS >> 3, np.uint8)
        slot = _filter_slot(self.hashes)
        np.bitwise_or.at(self.bits, slot >> 3, (np.uint8(1) << (slot & 7).astype(np.uint8)))

    def matches(self, text: str, threshold: float) -> list[int]:
        """The items of which `text` contains at least `threshold` of the n-grams."""
        return self.batch_matches([text], threshold)[0]

    def batch_matches(self, texts: list[str], threshold: float) -> list[list[int]]:
        """For each text, the items of which it contains at least `threshold` of the n-grams."""
        out: list[list[int]] = [[] for _ in texts]
        if len(self.hashes) == 0 or not texts:
            return out
        grams, doc = batch_ngram_hashes(texts, self.n)
        slot = _filter_slot(grams)
        maybe = (self.bits[slot >> 3] >> (slot & 7).astype(np.uint8)) & np.uint8(1) == 1
        grams, doc = grams[maybe], doc[maybe]
        pos = np.searchsorted(self.hashes, grams)
        pos[pos == len(self.hashes)] = 0
        hit = self.hashes[pos] == grams
        if not hit.any():
            return out
        # A document counts each n-gram once: distinct (document, n-gram) hits, then (document, item).
        hit_doc, hit_pos = np.unique(np.stack([doc[hit], pos[hit]]), axis=1)
        pairs, counts = np.unique(np.stack([hit_doc, self.owners[hit_pos]]), axis=1, return_counts=True)
        share = counts / self.item_grams[pairs[1]]
        for d, item in pairs[:, share >= max(threshold, 1e-12)].T.tolist():
            out[d].append(item)
        return out


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
        batch: list[Doc] = []
        size = 0
        for doc in docs:
            batch.append(doc)
            size += len(doc.text)
            if size >= BATCH_CHARS:
                yield from self._run_batch(batch, ledger)
                batch, size = [], 0
        yield from self._run_batch(batch, ledger)

    def _run_batch(self, docs: list[Doc], ledger: Ledger) -> Iterator[Doc]:
        names = self.index.names
        found_items = self.index.batch_matches([doc.text for doc in docs], self.threshold)
        for doc, items in zip(docs, found_items, strict=True):
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


def overlapping_items(
    items: list[str], texts: Iterable[str], n: int = 13, threshold: float = 0.5
) -> set[int]:
    """The positions of `items` (evaluation texts) that `texts` (training data) contain, by the rule above:
    an item of at least n words matches a text holding `threshold` of its n-grams. A shorter item, which no
    n-gram can check, matches a text whose normalized words are exactly its own (`3+4` and `3 + 4`).

    An `EvalIndex` gives a shared n-gram to its first item only, which is right for whole benchmarks but
    would hide an item that shares n-grams with an earlier one (two questions from one template); so the
    items are laid out over as few indexes as keep every item's n-grams its own."""
    layers: list[tuple[set[int], dict[str, list[int]]]] = []  # (n-grams taken, text -> positions)
    short: dict[bytes, list[int]] = {}
    for i, text in enumerate(items):
        ws = words(text)
        if len(ws) < n:
            if ws:
                short.setdefault(b" ".join(ws), []).append(i)
            continue
        grams = set(ngram_hashes(text, n).tolist())
        for taken, owners in layers:
            if text in owners or not grams & taken:
                owners.setdefault(text, []).append(i)
                taken |= grams
                break
        else:
            layers.append((grams, {text: [i]}))
    indexes = [(EvalIndex({"items": list(owners)}, n), list(owners.values())) for _, owners in layers]
    found: set[int] = set()

    def check(batch: list[str]) -> None:
        for index, owners in indexes:
            for matched in index.batch_matches(batch, threshold):
                for item in matched:
                    found.update(owners[item])
        for text in batch:
            found.update(short.get(b" ".join(words(text)), ()))

    batch: list[str] = []
    size = 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= BATCH_CHARS:
            check(batch)
            batch, size = [], 0
    check(batch)
    return found
