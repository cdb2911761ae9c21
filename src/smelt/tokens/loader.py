"""The training loader: seeded, sequence-level shuffled windows of a split's token stream, resumable in O(1).

The split's stream (all sources concatenated in sorted source order, documents joined by EOS) is cut
into windows of seq_len + 1 tokens starting at 0, seq_len, 2 seq_len, ... (consecutive windows share
their boundary token, so every token but the first is a target exactly once per epoch). Each epoch
visits the windows in a permutation drawn from numpy's PCG64 seeded with (seed, epoch); rank r of W takes
positions r, r + W, r + 2W, ... of that order, in batches of batch_size. Each rank gets the same number
of batches per epoch (the few windows left over are dropped for that epoch only, a different few each
epoch). The state is (epoch, cursor), so resuming is exact and costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smelt.errors import UserError
from smelt.tokens.shards import ShardSet


def epoch_permutation(seed: int, epoch: int, num_windows: int) -> np.ndarray:
    return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_windows)


class TokenLoader:
    def __init__(
        self,
        tokens_dir: Path,
        split: str,
        seq_len: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
    ):
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len ({seq_len}) and batch_size ({batch_size}) must be positive")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.shards = ShardSet(tokens_dir, split)
        self.split = split
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        total = self.shards.total_tokens
        self.num_windows = max(0, (total - 1) // seq_len)
        self.batches_per_epoch = self.num_windows // world_size // batch_size
        if self.batches_per_epoch == 0:
            need = seq_len * batch_size * world_size + 1
            raise UserError(
                f"split {split!r} has {total:,} tokens, too few for one batch: {world_size} rank(s) x "
                f"batch {batch_size} x (seq_len {seq_len} + 1) needs at least {need:,}. Lower train.seq_len "
                f"or train.micro_batch, or add more data to the {split!r} split."
            )
        self.epoch = 0
        self.cursor = 0  # batches this rank has taken in the current epoch
        self._perm_epoch = -1
        self._mine: np.ndarray | None = None

    # -- sizes --------------------------------------------------------------------------------------

    @property
    def sequences_per_epoch(self) -> int:
        """Sequences all ranks together consume in one epoch."""
        return self.batches_per_epoch * self.batch_size * self.world_size

    @property
    def tokens_per_epoch(self) -> int:
        """Target tokens all ranks together consume in one epoch."""
        return self.sequences_per_epoch * self.seq_len

    @property
    def total_tokens(self) -> int:
        return self.shards.total_tokens

    # -- batches ------------------------------------------------------------------------------------

    def _windows(self) -> np.ndarray:
        """This rank's window indices for the current epoch, in order."""
        if self._perm_epoch != self.epoch:
            perm = epoch_permutation(self.seed, self.epoch, self.num_windows)
            usable = self.batches_per_epoch * self.batch_size * self.world_size
            self._mine = perm[:usable][self.rank :: self.world_size]
            self._perm_epoch = self.epoch
        assert self._mine is not None
        return self._mine

    def next_batch_windows(self) -> np.ndarray:
        """The window indices of the next batch (advances the state)."""
        if self.cursor >= self.batches_per_epoch:
            self.epoch += 1
            self.cursor = 0
        windows = self._windows()[self.cursor * self.batch_size : (self.cursor + 1) * self.batch_size]
        self.cursor += 1
        return windows

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 [batch_size, seq_len]; targets are the inputs shifted by one."""
        windows = self.next_batch_windows()
        span = self.seq_len + 1
        rows = np.empty((len(windows), span), dtype=np.int64)
        for row, window in enumerate(windows.tolist()):
            rows[row] = self.shards.read(window * self.seq_len, span)
        data = torch.from_numpy(rows)
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        while True:
            yield self.next_batch()

    # -- state --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "num_windows": self.num_windows,
            "split": self.split,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("seq_len", "num_windows"):
            if key in state and state[key] != getattr(self, key):
                raise UserError(
                    f"cannot resume the {self.split!r} loader: the saved state has {key} = {state[key]} but "
                    f"this run has {getattr(self, key)} (the token shards or train.seq_len changed). Resume "
                    f"with the original data and seq_len, or start a fresh run."
                )
        epoch, cursor = int(state["epoch"]), int(state["cursor"])
        old = (int(state.get("batch_size", self.batch_size)), int(state.get("world_size", self.world_size)))
        if old != (self.batch_size, self.world_size):
            # a different batch or world size: continue at the same global position of the epoch
            consumed = cursor * old[0] * old[1]
            cursor = -(-consumed // (self.batch_size * self.world_size))
        self.epoch, self.cursor = epoch, cursor
        self._perm_epoch = -1


def eval_windows(
    tokens_dir: Path, split: str, seq_len: int, max_tokens: int = 0, source: str | None = None
) -> Iterator[np.ndarray]:
    """Consecutive windows of seq_len + 1 tokens (int64) over the first `max_tokens` of a split (0: all).

    Windows start at 0, seq_len, 2 seq_len, ...; consecutive windows share one token, so each token but
    the first is a target exactly once. The last window is shorter when the stream does not divide evenly.
    """
    shards = ShardSet(tokens_dir, split, source)
    limit = shards.total_tokens if max_tokens <= 0 else min(max_tokens, shards.total_tokens)
    start = 0
    while start + 1 < limit:
        yield shards.read(start, min(seq_len + 1, limit - start)).astype(np.int64)
        start += seq_len
