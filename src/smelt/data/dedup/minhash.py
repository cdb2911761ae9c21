"""MinHash signatures over word n-grams, vectorized with numpy, and the LSH band/row choice.

Why this shape: datasketch hashes every shingle with SHA-1 and updates the signature one shingle at a
time in Python; here each word is hashed once with CRC-32 (C speed, deterministic across processes,
unlike Python's `hash`), n-gram hashes are combined with a vectorized polynomial over uint64, and all
permutations of all shingles of a batch of documents are one (num_perm x shingles) product reduced
per document with `np.minimum.reduceat`. A permutation is multiply-shift `(a*x + b) mod 2^64 >> 32` with
odd `a`, a universal family whose minima estimate Jaccard similarity like random permutations do. (A
uint32 family `a*x + b mod 2^32` then `h ^= h >> 15` was twice as fast and unbiased on random sets, but on
real near-duplicates it overestimated Jaccard by ~0.05 and pair precision fell from 0.985 to 0.94 in
bench/dedup_quality.py: measured, rejected.) Signatures are uint32, 4 * num_perm bytes per document.
"""

from __future__ import annotations

import string
import sys
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

SEED = 0x5EED_D0D0
MAX_HASH = np.uint32(0xFFFFFFFF)
_ASCII_PUNCT = bytes.maketrans(string.punctuation.encode(), b" " * len(string.punctuation))
_UNICODE_PUNCT = [c.encode("utf-8") for c in "\u2018\u2019\u201c\u201d\u2013\u2014\u2026\u00ab\u00bb"]
_MIX = np.uint64(0x9E3779B97F4A7C15)
_FINAL = np.uint64(0xFF51AFD7ED558CCD)
_LITTLE_ENDIAN = sys.byteorder == "little"
BATCH_CHARS = 1 << 20  # characters joined per batch
CHUNK_SHINGLES = 4096  # shingles per (num_perm x chunk) product: 4 MiB at 128 perms, near cache size
SENTINEL = " \x00smelt\x00 "  # separates documents in a batch; normalization removes \x00 from texts
_SENTINEL_CRC = np.uint64(zlib.crc32(SENTINEL.strip().encode("utf-8")))


def words(text: str) -> list[bytes]:
    """The normalized words of a text: lowercased, punctuation turned into spaces. Near-duplicates that
    differ in case or punctuation are still near-duplicates."""
    return _normalized_bytes(text).split()


def _normalized_bytes(text: str) -> bytes:
    """Lowercased UTF-8 with ASCII and common Unicode punctuation turned into spaces. bytes.translate
    and bytes.replace run at memory speed; str.translate with a dict was the slowest part of hashing."""
    data = text.lower().encode("utf-8").translate(_ASCII_PUNCT)
    for mark in _UNICODE_PUNCT:
        if mark in data:
            data = data.replace(mark, b" ")
    return data


def shingle_hashes(text: str, ngram: int) -> np.ndarray:
    """Distinct 64-bit hashes of the text's word n-grams (a text shorter than n words is one shingle)."""
    ws = words(text)
    if not ws:
        return np.zeros(0, np.uint64)
    h = np.fromiter(map(zlib.crc32, ws), np.uint64, len(ws))
    n = min(ngram, len(h))
    out = np.zeros(len(h) - n + 1, np.uint64)
    for i in range(n):
        out = out * _MIX + h[i : len(h) - n + 1 + i]
    return np.unique(out)


def set_values(hashes: np.ndarray) -> np.ndarray:
    """32-bit values of 64-bit shingle hashes for the stored shingle sets. The shingle hash's high bits
    hardly depend on its last word (the polynomial adds it to the low bits), so its top half would make
    shingles that differ in the last word collide; a multiply-xorshift finalizer spreads every bit."""
    with np.errstate(over="ignore"):
        h = hashes ^ (hashes >> np.uint64(33))
        h = h * _FINAL
        h ^= h >> np.uint64(29)
    return (h >> np.uint64(32)).astype(np.uint32)


def permutations(num_perm: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """The uint64 (a, b) of the multiply-shift permutations; a is odd."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2**64 - 1, num_perm, dtype=np.uint64, endpoint=True) | np.uint64(1)
    b = rng.integers(0, 2**64 - 1, num_perm, dtype=np.uint64, endpoint=True)
    return a, b


class MinHasher:
    """Signatures for batches of texts; the same parameters give the same signatures in any process."""

    def __init__(self, num_perm: int = 128, ngram: int = 5, seed: int = SEED):
        self.num_perm = num_perm
        self.ngram = ngram
        self.a, self.b = permutations(num_perm, seed)

    def signatures(self, texts: list[str]) -> np.ndarray:
        """(len(texts), num_perm) uint32; an empty text gets all MAX_HASH. Texts are processed in batches
        of about BATCH_CHARS characters: one join, one split, one CRC-32 pass and a few array operations
        per batch instead of per document (per-document numpy overhead dominated short documents)."""
        return self.sketch(texts, sets=False)[0]

    def shingle_sets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each text's distinct shingles as 32-bit values (`set_values`), sorted, concatenated:
        (values uint32, offsets int64 of length len(texts) + 1). For true-Jaccard verification: 4 bytes
        per shingle; a 32-bit collision among a document pair's ~10^3 shingles happens about once in
        10^3 pairs and then moves its Jaccard by ~10^-3."""
        _, values, offsets = self.sketch(texts, sets=True)
        return values, offsets

    def sketch(self, texts: list[str], sets: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Signatures and (if `sets`) the shingle sets of `shingle_sets`, from one hashing pass."""
        out = np.full((len(texts), self.num_perm), MAX_HASH, np.uint32)
        values, counts = [np.zeros(0, np.uint32)], np.zeros(len(texts), np.int64)
        for lo, hi in self._batches(texts):
            grams, doc = self._batch_shingles(texts, lo, hi)
            self._minimize(grams, doc, lo, out)
            if sets:
                key = np.sort((doc.astype(np.uint64) << np.uint64(32)) | set_values(grams))
                key = key[np.concatenate([[True], key[1:] != key[:-1]])]  # np.unique hashes: 10x slower
                values.append((key & np.uint64(0xFFFFFFFF)).astype(np.uint32))
                counts[lo:hi] = np.bincount((key >> np.uint64(32)).astype(np.int64), minlength=hi - lo)
        offsets = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        return out, np.concatenate(values), offsets

    def _batches(self, texts: list[str]) -> Iterator[tuple[int, int]]:
        lo = 0
        while lo < len(texts):
            hi, size = lo, 0
            while hi < len(texts) and (size < BATCH_CHARS or hi == lo):
                size += len(texts[hi])
                hi += 1
            yield lo, hi
            lo = hi

    def _batch_shingles(self, texts: list[str], lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """The shingle hashes of texts[lo:hi] (with repeats) and the document of each, relative to lo;
        each document's shingles are one contiguous run."""
        joined = _normalized_bytes(SENTINEL.join(texts[lo:hi])).split()
        h = np.fromiter(map(zlib.crc32, joined), np.uint64, len(joined))
        sentinel = h == _SENTINEL_CRC
        if int(sentinel.sum()) != hi - lo - 1:  # a text holds the sentinel word itself: one at a time
            return self._each_shingles(texts, range(lo, hi), lo)
        doc = np.cumsum(sentinel)  # the sentinel word takes the number of the document after it
        n_words = np.bincount(doc[~sentinel], minlength=hi - lo)
        # A text shorter than n words is one shingle of all its words (as in shingle_hashes).
        short_grams, short_doc = self._each_shingles(
            texts, (lo + d for d in np.flatnonzero((n_words > 0) & (n_words < self.ngram)).tolist()), lo
        )
        n = self.ngram
        if len(h) < n:
            return short_grams, short_doc
        grams = np.zeros(len(h) - n + 1, np.uint64)
        with np.errstate(over="ignore"):
            for i in range(n):
                grams = grams * _MIX + h[i : len(h) - n + 1 + i]
        valid = (doc[: len(grams)] == doc[n - 1 :]) & ~sentinel[: len(grams)]
        return (
            np.concatenate([grams[valid], short_grams]),
            np.concatenate([doc[: len(grams)][valid], short_doc]),
        )

    def _each_shingles(
        self, texts: list[str], indices: Iterable[int], lo: int
    ) -> tuple[np.ndarray, np.ndarray]:
        grams, docs = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)]
        for i in indices:
            g = shingle_hashes(texts[i], self.ngram)
            grams.append(g)
            docs.append(np.full(len(g), i - lo, np.int64))
        return np.concatenate(grams), np.concatenate(docs)

    def _minimize(self, grams: np.ndarray, gram_doc: np.ndarray, lo: int, out: np.ndarray) -> None:
        for c in range(0, len(grams), CHUNK_SHINGLES):
            x, d = grams[c : c + CHUNK_SHINGLES], gram_doc[c : c + CHUNK_SHINGLES]
            starts = np.flatnonzero(np.concatenate([[True], d[1:] != d[:-1]]))
            mins = self._minima(x, starts)
            rows = lo + d[starts]
            out[rows] = np.minimum(out[rows], mins.T)

    def _minima(self, x: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """(num_perm, len(starts)) minima of the permuted hashes of each run of x beginning at `starts`."""
        h = np.multiply.outer(self.a, x)
        h += self.b[:, None]
        if _LITTLE_ENDIAN:  # the high 32 bits are every second uint32: no shift, no copy
            return np.minimum.reduceat(h.view(np.uint32)[:, 1::2], starts, axis=1)
        return np.minimum.reduceat((h >> np.uint64(32)).astype(np.uint32), starts, axis=1)

    def _one(self, shingles: np.ndarray) -> np.ndarray:
        if len(shingles) == 0:
            return np.full(self.num_perm, MAX_HASH, np.uint32)
        return self._minima(shingles, np.zeros(1, np.int64))[:, 0]


def estimated_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """The share of equal signature entries: an unbiased estimate of the Jaccard similarity."""
    return float(np.mean(sig_a == sig_b))


def jaccard(text_a: str, text_b: str, ngram: int = 5) -> float:
    """True Jaccard similarity of the two texts' word n-gram sets."""
    a, b = shingle_hashes(text_a, ngram), shingle_hashes(text_b, ngram)
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


@dataclass(frozen=True)
class LshParams:
    """Bands x rows and the S-curve's error rates around the threshold: `false_positive` is the
    integral of P(candidate) below the threshold, `false_negative` of P(miss) above it (per unit of J)."""

    bands: int
    rows: int
    threshold: float
    false_positive: float
    false_negative: float

    def probability(self, jaccard: float) -> float:
        """P(a pair with this Jaccard becomes a candidate) = 1 - (1 - J^r)^b."""
        return 1.0 - (1.0 - jaccard**self.rows) ** self.bands

    def describe(self) -> str:
        return (
            f"LSH {self.bands} bands x {self.rows} rows for Jaccard {self.threshold}: "
            f"S-curve midpoint {(1 / self.bands) ** (1 / self.rows):.3f}, "
            f"false positive area {self.false_positive:.4f}, false negative area {self.false_negative:.4f}, "
            f"P(candidate | J=0.7) {self.probability(0.7):.3f}, "
            f"P(candidate | J=0.85) {self.probability(0.85):.4f}"
        )


def lsh_params(threshold: float, num_perm: int, fp_weight: float = 0.5, fn_weight: float = 0.5) -> LshParams:
    """The (bands, rows) with bands * rows <= num_perm that minimizes the weighted false positive and
    false negative areas of the S-curve (datasketch's rule, so results compare)."""
    below = np.linspace(0.0, threshold, 513)
    above = np.linspace(threshold, 1.0, 513)
    best = None
    for bands in range(1, num_perm + 1):
        for rows in range(1, num_perm // bands + 1):
            fp = float(np.trapezoid(1 - (1 - below**rows) ** bands, below))
            fn = float(np.trapezoid((1 - above**rows) ** bands, above))
            error = fp_weight * fp + fn_weight * fn
            if best is None or error < best[0]:
                best = (error, bands, rows, fp, fn)
    assert best is not None
    _, bands, rows, fp, fn = best
    return LshParams(bands, rows, threshold, fp, fn)
