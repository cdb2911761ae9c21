"""The training loader and validation windows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smelt.errors import UserError
from smelt.tokens.loader import TokenLoader, eval_windows

from .conftest import make_stream


def _window_starts(inputs: torch.Tensor) -> list[int]:
    return inputs[:, 0].tolist()  # in the counting stream a token's value is its position


def test_shapes_and_shift(counting_stream):
    tokens_dir, stream = counting_stream
    loader = TokenLoader(tokens_dir, "train", seq_len=64, batch_size=8, seed=0)
    inputs, targets = loader.next_batch()
    assert inputs.shape == targets.shape == (8, 64)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    for row in range(8):
        start = int(inputs[row, 0])
        assert start % 64 == 0
        assert inputs[row].tolist() == stream[start : start + 64].tolist()
        assert targets[row].tolist() == stream[start + 1 : start + 65].tolist()
    assert loader.num_windows == 10_000 // 64
    assert loader.batches_per_epoch == 156 // 8
    assert loader.sequences_per_epoch == 152 and loader.tokens_per_epoch == 152 * 64


def test_epoch_covers_every_window_once(counting_stream):
    tokens_dir, _ = counting_stream
    loader = TokenLoader(tokens_dir, "train", seq_len=100, batch_size=10, seed=5)  # 100 windows
    assert loader.batches_per_epoch == 10
    seen = [s for _ in range(10) for s in _window_starts(loader.next_batch()[0])]
    assert sorted(seen) == list(range(0, 10_000, 100))
    assert seen != sorted(seen)  # shuffled
    second = [s for _ in range(10) for s in _window_starts(loader.next_batch()[0])]
    assert loader.epoch == 1 and sorted(second) == sorted(seen) and second != seen
    other_seed = TokenLoader(tokens_dir, "train", seq_len=100, batch_size=10, seed=6)
    assert _window_starts(other_seed.next_batch()[0]) != seen[:10]


def test_ranks_are_disjoint(counting_stream):
    tokens_dir, _ = counting_stream
    world = 3
    per_rank = []
    for rank in range(world):
        loader = TokenLoader(tokens_dir, "train", 100, 4, seed=1, rank=rank, world_size=world)
        assert loader.batches_per_epoch == 8  # 100 windows // 3 ranks // 4
        per_rank.append([s for _ in range(8) for s in _window_starts(loader.next_batch()[0])])
    sets = [set(r) for r in per_rank]
    assert all(len(s) == 32 for s in sets)
    assert not (sets[0] & sets[1]) and not (sets[0] & sets[2]) and not (sets[1] & sets[2])
    single = TokenLoader(tokens_dir, "train", 100, 4, seed=1)
    order = single._windows()  # the same permutation, dealt round-robin
    assert per_rank[1][:4] == [int(w) * 100 for w in order[1:12:3]]


# 10 batches per epoch on one rank, 5 per rank on two: mid-epoch, at and across the epoch boundary
@pytest.mark.parametrize(("world", "taken"), [(1, 3), (1, 10), (1, 17), (2, 2), (2, 5), (2, 7), (2, 13)])
def test_exact_resume(counting_stream, world, taken):
    tokens_dir, _ = counting_stream
    rank = world - 1
    original = TokenLoader(tokens_dir, "train", 100, 10, seed=2, rank=rank, world_size=world)
    for _ in range(taken):
        original.next_batch()
    state = original.state_dict()
    assert set(state) >= {"epoch", "cursor"}
    restored = TokenLoader(tokens_dir, "train", 100, 10, seed=2, rank=rank, world_size=world)
    restored.load_state_dict(state)
    for _ in range(12):
        a, b = original.next_batch(), restored.next_batch()
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert original.state_dict() == restored.state_dict()


def test_resume_with_changed_data_is_a_user_error(counting_stream):
    tokens_dir, _ = counting_stream
    state = TokenLoader(tokens_dir, "train", 100, 10, seed=2).state_dict()
    with pytest.raises(UserError, match="saved state has seq_len = 100 but this run has 50"):
        TokenLoader(tokens_dir, "train", 50, 10, seed=2).load_state_dict(state)


def test_too_few_tokens(tmp_path):
    make_stream(tmp_path / "tokens", "val", {"x": [np.arange(500)]})
    with pytest.raises(
        UserError, match=r"split 'val' has 500 tokens, too few.*needs at least 1,025.*seq_len"
    ):
        TokenLoader(tmp_path / "tokens", "val", seq_len=128, batch_size=8, seed=0)
    loader = TokenLoader(tmp_path / "tokens", "val", seq_len=128, batch_size=3, seed=0)
    assert loader.batches_per_epoch == 1
    for _ in range(3):  # every batch is a new epoch
        assert loader.next_batch()[0].shape == (3, 128)
    assert loader.epoch == 2


def test_eval_windows_cover_the_stream(counting_stream):
    tokens_dir, stream = counting_stream
    windows = list(eval_windows(tokens_dir, "train", seq_len=64))
    assert all(len(w) == 65 for w in windows[:-1]) and 2 <= len(windows[-1]) <= 65
    assert all(w.dtype == np.int64 for w in windows)
    targets = np.concatenate([w[1:] for w in windows])
    assert np.array_equal(targets, stream[1:])
    assert [int(w[0]) for w in windows] == list(range(0, 10_000, 64))
    limited = list(eval_windows(tokens_dir, "train", seq_len=64, max_tokens=200))
    assert np.array_equal(np.concatenate([w[1:] for w in limited]), stream[1:200])
    again = list(eval_windows(tokens_dir, "train", seq_len=64))
    assert all(np.array_equal(a, b) for a, b in zip(windows, again, strict=True))
