"""A set of 128-bit digests with a small integer per entry, in flat arrays.

Exact dedup and the unique-id check remember one digest per document of the whole corpus. A Python
dict of bytes keys costs about 230 bytes per entry; open addressing over two uint64 arrays and an int64
array costs 24 bytes per slot, 36 to 72 bytes per entry at the load kept here (a third to two thirds).
"""

from __future__ import annotations

import numpy as np

_EMPTY = -1


class DigestTable:
    """`first(digest, value)`: the value stored with an earlier equal digest, or None after storing
    `value` with this one. Digests are uniformly distributed (blake2b), so their first 8 bytes index."""

    def __init__(self, capacity: int = 1 << 16) -> None:
        self._allocate(max(16, 1 << (capacity - 1).bit_length()))
        self.size = 0

    def _allocate(self, slots: int) -> None:
        self.low = np.zeros(slots, dtype=np.uint64)
        self.high = np.zeros(slots, dtype=np.uint64)
        self.values = np.full(slots, _EMPTY, dtype=np.int64)
        self.mask = slots - 1

    def __len__(self) -> int:
        return self.size

    def first(self, digest: bytes, value: int) -> int | None:
        low = int.from_bytes(digest[:8], "little")
        high = int.from_bytes(digest[8:16], "little")
        slot = self._find(low, high)
        found = int(self.values[slot])
        if found != _EMPTY:
            return found
        if value < 0:
            raise ValueError("DigestTable values must be 0 or more")
        self.low[slot], self.high[slot], self.values[slot] = low, high, value
        self.size += 1
        if 3 * self.size > 2 * len(self.values):
            self._grow()
        return None

    def _find(self, low: int, high: int) -> int:
        """The slot holding (low, high), or the empty slot where it belongs."""
        slot = low & self.mask
        while self.values[slot] != _EMPTY and (self.low[slot] != low or self.high[slot] != high):
            slot = (slot + 1) & self.mask
        return slot

    def _grow(self) -> None:
        used = self.values != _EMPTY
        low, high, values = self.low[used], self.high[used], self.values[used]
        self._allocate(2 * len(self.values))
        for lo, hi, value in zip(low.tolist(), high.tolist(), values.tolist(), strict=True):
            slot = self._find(lo, hi)
            self.low[slot], self.high[slot], self.values[slot] = lo, hi, value
