"""The digest table behind exact dedup and the unique-id check: first value wins, growth keeps all."""

import hashlib
import tracemalloc

import pytest

from smelt.data.digests import DigestTable


def digest(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


def test_first_value_wins_across_growth():
    table = DigestTable(capacity=16)
    for i in range(5000):
        assert table.first(digest(i), i) is None
    assert len(table) == 5000 and 2 * len(table.values) >= 3 * 5000  # grew, load at most two thirds
    for i in range(5000):
        assert table.first(digest(i), 10**9) == i  # a repeat returns the first value, stores nothing
    assert len(table) == 5000


def test_equal_low_bits_are_told_apart_by_the_rest():
    table = DigestTable(capacity=16)
    same_low = [bytes(8) + i.to_bytes(8, "little") for i in range(40)]  # one slot, 40 different keys
    assert [table.first(d, i) for i, d in enumerate(same_low)] == [None] * 40
    assert [table.first(d, 99) for d in same_low] == list(range(40))
    with pytest.raises(ValueError):
        table.first(digest(-1), -5)


@pytest.mark.slow
def test_memory_per_entry_is_a_fraction_of_a_dict():
    tracemalloc.start()
    table = DigestTable()
    for i in range(100_000):
        table.first(digest(i), i)
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert used / 100_000 <= 75  # a dict of bytes -> tuple costs about 230 bytes per entry
