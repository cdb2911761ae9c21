"""The closed-form orders behind the loader: source interleaving and the per-epoch shuffle."""

from __future__ import annotations

import numpy as np
import pytest

from smelt.tokens.order import Interleave, Q, permute, phase


@pytest.mark.parametrize(
    "counts",
    [[5], [3, 0, 7], [1, 1, 1], [40, 13, 7, 1, 0], [17, 17], [2, 99]],
)
def test_interleave_is_a_permutation_of_the_stage(counts):
    rng = np.random.default_rng(sum(counts))
    for phases in ([7] * len(counts), rng.integers(1, Q, len(counts)).tolist()):  # ties and seeded phases
        order = Interleave(counts, phases)
        ranks = sorted(order.rank(i, j) for i, c in enumerate(counts) for j in range(c))
        assert ranks == list(range(sum(counts)))
        middle = order.total // 2
        for start, stop in ((0, order.total), (1, order.total - 1), (middle, min(order.total, middle + 3))):
            source, j = order.slice(start, stop)
            assert [order.rank(int(i), int(k)) for i, k in zip(source, j, strict=True)] == list(
                range(start, stop)
            )
        assert order.cursors(order.total) == counts
        assert order.cursors(0) == [0] * len(counts)


def test_interleave_windows_stay_within_a_point_of_the_target():
    counts = [25_000, 10_000, 7_500, 5_000, 2_000, 500]  # weights 0.5 ... 0.01 of 50,000 positions
    n = sum(counts)
    order = Interleave(counts, [phase(3, 0, f"s{i}") for i in range(len(counts))])
    source, _ = order.slice(0, n)
    window = 1000
    for i, c in enumerate(counts):
        hits = np.concatenate(([0], np.cumsum(source == i)))
        shares = (hits[window:] - hits[:-window]) / window  # every window of 1,000 consecutive positions
        assert np.abs(shares - c / n).max() < 0.01
    # a seeded per-sequence draw with the same weights is much noisier
    draws = np.random.default_rng(0).choice(len(counts), size=n, p=np.array(counts) / n)
    hits = np.concatenate(([0], np.cumsum(draws == 0)))
    assert np.abs((hits[window:] - hits[:-window]) / window - 0.5).max() > 0.03


def test_interleave_of_a_huge_stage_is_cheap_at_any_position():
    order = Interleave([10**12, 3 * 10**11, 7 * 10**11], [11, 222, 3333])
    start = 987_654_321_012
    source, j = order.slice(start, start + 512)
    assert np.bincount(source, minlength=3).tolist() in ([256, 77, 179], [256, 76, 180], [255, 77, 180])
    cursors = order.cursors(start)
    assert sum(cursors) == start
    for i in range(3):  # the slice continues each source right after its cursor
        assert j[source == i][0] == cursors[i]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 17, 64, 1000, 4097])
def test_permute_is_a_seeded_bijection(n):
    a = permute(np.arange(n), n, 1, "web", 0)
    assert sorted(a.tolist()) == list(range(n))
    assert np.array_equal(a, permute(np.arange(n), n, 1, "web", 0))
    index = np.arange(n)[::-1]
    assert np.array_equal(permute(index, n, 1, "web", 0), a[::-1])  # element-wise: any index, any order
    if n >= 64:
        assert not np.array_equal(a, np.arange(n))
        assert not np.array_equal(a, permute(np.arange(n), n, 1, "web", 1))  # each epoch its own order
        assert not np.array_equal(a, permute(np.arange(n), n, 2, "web", 0))  # and each seed
        assert not np.array_equal(a, permute(np.arange(n), n, 1, "code", 0))  # and each source


def test_permute_rejects_indices_outside_the_domain():
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        permute(np.array([10]), 10, 0)
