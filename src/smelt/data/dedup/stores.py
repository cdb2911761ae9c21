"""Per-shard files of signatures and shingle sets, read by global document number, and the verification
of candidate pairs against them.

Both stores map their files only for the duration of one lookup: the pages a memory map has touched
count in the process's resident memory until it is unmapped, so a store kept mapped across all
candidate pairs would grow towards the size of its files (512 bytes of signature per document) and
the near-dedup step would no longer keep within its memory budget. Lookups come in chunks of pairs
(`VERIFY_CHUNK`), so what one lookup maps is bounded by the chunk, not by the corpus.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

VERIFY_CHUNK = 8192  # pairs per lookup: at most 2 x 8192 documents' pages mapped at once


def _shard_of(starts: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.searchsorted(starts, index, side="right") - 1


class SignatureStore:
    """Rows of the per-shard signature files (`.npy`, (rows, num_perm) uint32) by global number."""

    def __init__(self, paths: list[Path], counts: list[int], num_perm: int):
        self.paths = list(paths)
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.width = num_perm

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, np.int64)
        shard = _shard_of(self.starts, index)
        out = np.empty((len(index), self.width), np.uint32)
        for s in np.unique(shard).tolist():
            mask = shard == s
            mapped = np.load(self.paths[s], mmap_mode="r")
            out[mask] = mapped[index[mask] - self.starts[s]]
            del mapped
        return out


def shingle_files(signature_file: Path) -> tuple[Path, Path]:
    """The shingle values and offsets files that go with a shard's signature file."""
    stem = signature_file.name.removesuffix(".minhash.npy")
    return signature_file.with_name(stem + ".shingles.npy"), signature_file.with_name(stem + ".offsets.npy")


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenation of arange(start, start + length) for each pair, without a Python loop."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) + np.repeat(
        starts - ends + lengths, lengths
    )


class ShingleStore:
    """Each document's sorted distinct shingle values (uint32), from per-shard values + offsets files."""

    def __init__(self, signature_paths: list[Path], counts: list[int]):
        self.files = [shingle_files(p) for p in signature_paths]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def sets(self, docs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted distinct global numbers `docs`: (values, offsets) with docs[i]'s set at
        values[offsets[i]:offsets[i + 1]]."""
        docs = np.asarray(docs, np.int64)
        shard = _shard_of(self.starts, docs)
        values, lengths = [np.zeros(0, np.uint32)], [np.zeros(0, np.int64)]
        for s in np.unique(shard).tolist():
            local = docs[shard == s] - self.starts[s]
            offsets = np.load(self.files[s][1], mmap_mode="r")
            begin, end = np.asarray(offsets[local]), np.asarray(offsets[local + 1])
            mapped = np.load(self.files[s][0], mmap_mode="r")
            values.append(np.asarray(mapped[_ranges(begin, end - begin)]))
            lengths.append(end - begin)
            del mapped, offsets
        out = np.zeros(len(docs) + 1, np.int64)
        np.cumsum(np.concatenate(lengths), out=out[1:])
        return np.concatenate(values), out


def jaccard_of_pairs(pairs: np.ndarray, store: ShingleStore) -> np.ndarray:
    """True Jaccard similarity of the shingle sets of each (a, b) row of `pairs` (two empty sets: 1)."""
    if len(pairs) == 0:
        return np.zeros(0)
    docs = np.unique(pairs)
    values, offsets = store.sets(docs)
    lengths = np.diff(offsets)
    ia, ib = np.searchsorted(docs, pairs[:, 0]), np.searchsorted(docs, pairs[:, 1])
    # Both sets of every pair in one array keyed by (pair, value): each set is distinct, so a value
    # seen twice under one pair is in the intersection.
    pair = np.arange(len(pairs), dtype=np.uint64)
    key = np.concatenate(
        [
            (np.repeat(pair, lengths[ia]) << np.uint64(32)) | values[_ranges(offsets[ia], lengths[ia])],
            (np.repeat(pair, lengths[ib]) << np.uint64(32)) | values[_ranges(offsets[ib], lengths[ib])],
        ]
    )
    key.sort()
    twice = key[1:][key[1:] == key[:-1]]
    inter = np.bincount((twice >> np.uint64(32)).astype(np.int64), minlength=len(pairs))
    union = lengths[ia] + lengths[ib] - inter
    return np.where(union > 0, inter / np.maximum(union, 1), 1.0)


def verify_by_jaccard(pairs: np.ndarray, store: ShingleStore, threshold: float) -> np.ndarray:
    """The pairs whose shingle sets have true Jaccard similarity >= `threshold`."""
    keep = np.zeros(len(pairs), bool)
    for lo in range(0, len(pairs), VERIFY_CHUNK):
        keep[lo : lo + VERIFY_CHUNK] = jaccard_of_pairs(pairs[lo : lo + VERIFY_CHUNK], store) >= threshold
    return pairs[keep]
