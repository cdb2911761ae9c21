"""The two orders behind the loader, both pure functions of integers.

A month-long run cannot afford an index that grows with its length (Megatron's blending index holds
one entry per sample), nor a resume that has to replay the stream. So every position of the run is
mapped to its data by arithmetic alone:

- `Interleave`: which source fills each position of a stage. Source i contributes exactly c_i of the
  stage's n positions; its j-th sequence gets the key (j + a_i / Q) / c_i (evenly spaced, with a
  seeded phase a_i so that no source always goes first), and positions follow the merged key order.
  Any window of m positions then holds c_i m / n sequences of source i up to about two, so the
  realized mixture of every 1,000-sequence window sits within a few tenths of a point of the target,
  where a per-sequence random draw would wander by several points. The merged rank of any (i, j)
  is a closed formula, so the sources of positions [p, p + m) cost O(m + sources^2) at any p.
- `permute`: which sequence of a source comes next. A seeded Feistel network over the smallest
  power-of-4 domain that holds the n windows, cycle-walked back into [0, n): a bijection of [0, n)
  computed index by index, so the epoch's global shuffle needs no permutation array (a 100B-token
  source at seq_len 2048 would need 400 MB per epoch for one) and any index is O(1).
"""

from __future__ import annotations

import hashlib

import numpy as np

PHASE_BITS = 16
Q = 1 << PHASE_BITS
_ROUNDS = 6


def name_key(*parts: object) -> int:
    """A stable 64-bit integer from names and numbers (seeds for sources, stages and epochs)."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def phase(seed: int, stage: int, source: str) -> int:
    """The seeded phase a in [1, Q - 1] of a source's keys in one stage."""
    return 1 + name_key("phase", seed, stage, source) % (Q - 1)


class Interleave:
    """The merge of evenly spaced source sequences into the n positions of one stage.

    counts[i] sequences of source i (zero allowed); phases[i] in [0, scale] (seeded ones in
    [1, Q - 1] with scale Q). Item (i, j) has the key (j scale + a_i) / (scale c_i); ties (equal keys)
    go to the lower source index. All arithmetic is on Python integers, so it is exact for any count.
    A fork that continues its parent's data gets the phases (on a finer scale) at which the parent's
    interleave stood at the fork point (`continuation`), so it goes on as the parent's would have.
    """

    def __init__(self, counts: list[int], phases: list[int], scale: int = Q):
        if len(counts) != len(phases) or any(c < 0 for c in counts):
            raise ValueError("counts and phases must match and counts be non-negative")
        if scale < 1 or any(not 0 <= a <= scale for a in phases):
            raise ValueError(f"phases must lie in [0, scale = {scale}]")
        self.counts = [int(c) for c in counts]
        self.phases = [int(a) for a in phases]
        self.scale = int(scale)
        self.total = sum(self.counts)

    def rank(self, i: int, j: int) -> int:
        """The position (0-based, within the stage) of source i's j-th sequence."""
        c_i, x = self.counts[i], j * self.scale + self.phases[i]
        unit = self.scale * c_i
        position = j
        for k, (c_k, a_k) in enumerate(zip(self.counts, self.phases, strict=True)):
            if k == i or c_k == 0:
                continue
            # items j' of source k before (i, j): (j' Q + a_k) c_i < x c_k, or equal and k < i
            r = x * c_k - a_k * c_i
            if k < i:
                before = r // unit + 1 if r >= 0 else 0
            else:
                before = (r + unit - 1) // unit if r > 0 else 0
            position += min(before, c_k)
        return position

    def count_before(self, i: int, position: int) -> int:
        """How many of source i's sequences sit at positions < `position` (binary search on rank)."""
        lo, hi = 0, self.counts[i]
        while lo < hi:
            mid = (lo + hi) // 2
            if self.rank(i, mid) < position:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def cursors(self, position: int) -> list[int]:
        """Sequences each source has contributed to positions [0, position)."""
        return [self.count_before(i, position) if c else 0 for i, c in enumerate(self.counts)]

    def continuation(self, position: int) -> tuple[list[int | None], int]:
        """(phases, scale) under which an interleave of counts proportional to these, starting at 0,
        orders its items as this one orders those from `position` on (None for a source of count 0).

        Subtracting one number t from every key keeps the order. With t the key of the item at
        `position`, (i0, j0), source i's next item (its cursor k_i) gets the key (r_i / scale) / c_i with
        r_i = k_i scale + a_i - t scale c_i in [0, scale]; on the scale scale c_i0 that is an integer.
        At the end of the stage (t = 1) the phases stay as they are."""
        if position >= self.total:
            return [a if c else None for a, c in zip(self.phases, self.counts, strict=True)], self.scale
        (source,), (j0,) = self.slice(position, position + 1)
        i0, cursors = int(source), self.cursors(position)
        c0, x0 = self.counts[i0], int(j0) * self.scale + self.phases[i0]
        phases: list[int | None] = [
            (k * self.scale + a) * c0 - x0 * c if c else None
            for k, a, c in zip(cursors, self.phases, self.counts, strict=True)
        ]
        return phases, self.scale * c0

    def slice(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, j) of positions start..stop-1, in position order."""
        if not 0 <= start <= stop <= self.total:
            raise ValueError(f"positions [{start}, {stop}) outside the stage's {self.total}")
        m = stop - start
        sources = len(self.counts)
        found: list[tuple[int, int, int]] = []
        for i, c_i in enumerate(self.counts):
            if c_i == 0:
                continue
            first = self.count_before(i, start)
            # In any m consecutive positions source i has at most c_i (m + S) / n + 1 sequences.
            span = -(-c_i * (m + sources) // self.total) + 1
            for j in range(first, min(c_i, first + span)):
                position = self.rank(i, j)
                if position >= stop:
                    break
                found.append((position, i, j))
        found.sort()
        if [p for p, _, _ in found] != list(range(start, stop)):
            raise AssertionError(f"interleave of positions [{start}, {stop}) is not a permutation")
        return (
            np.fromiter((i for _, i, _ in found), dtype=np.int64, count=m),
            np.fromiter((j for _, _, j in found), dtype=np.int64, count=m),
        )


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a cheap, well-mixing hash of uint64 values (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def permute(index: np.ndarray, n: int, *key: object) -> np.ndarray:
    """The images of `index` (values in [0, n)) under the seeded bijection of [0, n) named by `key`."""
    if n <= 0:
        raise ValueError("permute needs n > 0")
    index = np.asarray(index, dtype=np.int64)
    if index.size and (index.min() < 0 or index.max() >= n):
        raise ValueError(f"permute: indices must lie in [0, {n})")
    half = max(1, -(-(n - 1).bit_length() // 2))
    mask = np.uint64((1 << half) - 1)
    shift = np.uint64(half)
    round_keys = [np.uint64(name_key("feistel", *key, r)) for r in range(_ROUNDS)]

    def rounds(x: np.ndarray) -> np.ndarray:
        left, right = x >> shift, x & mask
        for k in round_keys:
            left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << shift) | right

    with np.errstate(over="ignore"):
        out = rounds(index.astype(np.uint64))
        outside = out >= np.uint64(n)
        while outside.any():  # cycle-walk: the domain is < 4n, so a few rounds at most on average
            out[outside] = rounds(out[outside])
            outside = out >= np.uint64(n)
    return out.astype(np.int64)
