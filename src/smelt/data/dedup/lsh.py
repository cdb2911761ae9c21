"""LSH banding on disk and union-find clustering, with memory bounded by a budget, not by the corpus.

Each document's signature is cut into `bands` bands; a band's rows hash to a 64-bit bucket key (mixed
with the band number and the document's dedup group, so groups never meet). (key, document index)
records are appended to `partitions` files by key modulo the partition count, so every bucket lies in
one file; each file is then loaded alone, sorted, and its runs of equal keys give candidate pairs
(every pair of a bucket of up to ALL_PAIRS_MAX documents; first member and each other member in a
larger one, which keeps a degenerate bucket linear). The partition count is chosen so that one file (16 bytes per record,
with sort workspace) fits in the budget. Candidates are optionally verified against the signatures
(memory-mapped), then merged by union-find whose root is always the smallest document index: the
representative of a cluster is its first document in canonical order, whatever the worker count or
the order in which pairs arrive.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from smelt.data.dedup.minhash import LshParams

RECORD = np.dtype([("key", "<u8"), ("doc", "<i8")])
SORT_OVERHEAD = 6  # measured: records, lexsort indices, sorted keys and docs, run arrays
ALL_PAIRS_MAX = 64  # buckets up to this size yield all their pairs (at most 2,016 each)
_MIX = np.uint64(0x9E3779B97F4A7C15)
_BAND_MIX = np.uint64(0xD6E8FEB86659FD93)


def band_keys(sigs: np.ndarray, params: LshParams, groups: np.ndarray | None = None) -> np.ndarray:
    """(n, bands) uint64 bucket keys of the signatures' bands; `groups` (uint64 per row) separates scopes."""
    n = len(sigs)
    keys = np.zeros((n, params.bands), np.uint64)
    base = np.zeros(n, np.uint64) if groups is None else groups.astype(np.uint64)
    with np.errstate(over="ignore"):
        for band in range(params.bands):
            key = base * _MIX + np.uint64(band + 1) * _BAND_MIX
            for col in range(band * params.rows, (band + 1) * params.rows):
                key = key * _MIX + sigs[:, col].astype(np.uint64)
            keys[:, band] = key ^ (key >> np.uint64(29))
    return keys


def partition_count(n_docs: int, bands: int, memory_bytes: int) -> int:
    """Partitions so that one partition's records, sorted, fit in `memory_bytes`."""
    need = n_docs * bands * RECORD.itemsize * SORT_OVERHEAD
    return max(1, math.ceil(need / max(1, memory_bytes)))


class BucketFiles:
    """Append-only partition files of (bucket key, document index) records."""

    def __init__(self, directory: Path, partitions: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.partitions = partitions
        for p in range(partitions):
            self.path(p).write_bytes(b"")

    def path(self, partition: int) -> Path:
        return self.directory / f"bucket-{partition:05d}.bin"

    def add(self, keys: np.ndarray, first_doc: int) -> None:
        """Append the band keys of documents first_doc, first_doc + 1, ... (rows of `keys`)."""
        n, bands = keys.shape
        records = np.empty(n * bands, RECORD)
        records["key"] = keys.reshape(-1)
        records["doc"] = np.repeat(np.arange(first_doc, first_doc + n, dtype=np.int64), bands)
        part = (records["key"] % np.uint64(self.partitions)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        records, part = records[order], part[order]
        bounds = np.searchsorted(part, np.arange(self.partitions + 1))
        for p in range(self.partitions):
            lo, hi = bounds[p], bounds[p + 1]
            if hi > lo:
                with open(self.path(p), "ab") as handle:
                    records[lo:hi].tofile(handle)

    def candidate_pairs(self) -> Iterator[np.ndarray]:
        """Per partition, an (m, 2) int64 array of (smaller, larger document) pairs sharing a bucket:
        every pair of a bucket of up to ALL_PAIRS_MAX members, and (first member, other member) in a
        larger bucket. Pairing each member with the first only would miss two close members whose bucket
        opens with a document far from both (a chance band collision)."""
        for p in range(self.partitions):
            records = np.fromfile(self.path(p), RECORD)
            if len(records) < 2:
                continue
            order = np.lexsort((records["doc"], records["key"]))
            keys, docs = records["key"][order], records["doc"][order]
            del records, order
            starts = np.concatenate([[True], keys[1:] != keys[:-1]])
            run_id = np.cumsum(starts) - 1
            size = np.bincount(run_id)[run_id]
            shared = size > 1  # most buckets hold one document
            docs, run_id, size, starts = docs[shared], run_id[shared], size[shared], starts[shared]
            if not len(docs):
                continue
            found = []
            large = size > ALL_PAIRS_MAX
            if large.any():
                first = np.maximum.accumulate(np.where(starts, np.arange(len(docs)), 0))
                found.append(np.stack([docs[first[large]], docs[large]], axis=1))
            at = np.flatnonzero(~large)  # members of small buckets: pair each with every later one
            step = 1
            while len(at):
                at = at[at + step < len(docs)]
                at = at[run_id[at + step] == run_id[at]]
                found.append(np.stack([docs[at], docs[at + step]], axis=1))
                step += 1
            pairs = np.concatenate(found)
            pairs = pairs[pairs[:, 0] != pairs[:, 1]]
            if len(pairs):
                # A close pair shares several bands: keep each pair once per partition.
                n = np.int64(docs.max() + 1)
                code = np.unique(pairs[:, 0] * n + pairs[:, 1])
                yield np.stack([code // n, code % n], axis=1)


def verify_pairs(pairs: np.ndarray, sigs: np.ndarray, min_estimate: float, chunk: int = 8192) -> np.ndarray:
    """The pairs whose signatures agree on at least `min_estimate` of their entries."""
    keep = np.zeros(len(pairs), bool)
    for lo in range(0, len(pairs), chunk):
        block = pairs[lo : lo + chunk]
        agree = (sigs[block[:, 0]] == sigs[block[:, 1]]).mean(axis=1)
        keep[lo : lo + chunk] = agree >= min_estimate
    return pairs[keep]


class UnionFind:
    """Disjoint sets over 0..n-1 whose root is the smallest member (the canonical representative)."""

    def __init__(self, n: int):
        self.parent = np.arange(n, dtype=np.int64)

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return int(x)

    def union_pairs(self, pairs: np.ndarray) -> None:
        for a, b in pairs.tolist():
            ra, rb = self.find(a), self.find(b)
            if ra != rb:
                if ra < rb:
                    self.parent[rb] = ra
                else:
                    self.parent[ra] = rb

    def roots(self) -> np.ndarray:
        """The representative (smallest member) of every element's set."""
        parent = self.parent
        while True:
            grand = parent[parent]
            if np.array_equal(grand, parent):
                return parent.copy()
            parent[:] = grand
