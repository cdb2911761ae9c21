"""Packing: fixed-length sequences cut from a source's EOS-joined documents, with their boundaries.

A source's shards form one stream (every document followed by its EOS). Sequence q of the source is
the window of seq_len + 1 tokens starting at q x seq_len: consecutive windows share one token, so a
window's inputs and targets are its first and last seq_len tokens, every token but the first is a
target once per epoch, and nothing is padded. Long documents simply span several windows.

Document boundaries come from the shards' `.idx` offsets, not from scanning for EOS, and follow the
model's convention (`smelt.model.transformer.doc_ids_from_tokens`): the EOS that ends a document opens
the next segment, so it is position 0 there and predicts the next document's first token while the
last token of a document still predicts the EOS from inside its own document. A batch carries them as
`doc_ids` and `position_ids` [B, T] (what the model takes) and as `cu_seqlens` (segment offsets over
the flattened batch, the form varlen attention kernels take).

Fill-in-the-middle (Bavarian et al. 2022) rewrites a segment's content c into
PSM `<pre> prefix <suf> suffix <mid> middle` or SPM `<pre> <suf> suffix <mid> prefix middle`,
dropping its last three tokens to make room for the sentinels (as StarCoder's Megatron fork does), so
a window keeps its length and the stream its O(1) indexing.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np
import torch

from smelt.tokens.shards import ShardSet

MIN_FIM_CONTENT = 8  # segments shorter than this are left alone


class SourceStream:
    """One source's shards as a stream of windows of seq_len + 1 tokens, with their document ends.

    Document ends are looked up in each shard's memory-mapped `.idx`, so no per-document array is
    held in memory (a billion-document source would need gigabytes for one).
    """

    def __init__(self, shards: ShardSet, seq_len: int):
        self.name = shards.sources[0]
        self.seq_len = seq_len
        self.shards = shards
        self.total_tokens = self.shards.total_tokens
        self.sequences = max(0, (self.total_tokens - 1) // seq_len)
        self._bounds = self.shards.starts.tolist()

    def read(self, sequence: int, out: np.ndarray) -> None:
        """Copy window `sequence` (seq_len + 1 tokens) into `out`."""
        out[:] = self.shards.read(sequence * self.seq_len, self.seq_len + 1)

    def ends_in(self, start: int, stop: int) -> np.ndarray:
        """Stream offsets in [start, stop) that hold a document's last token (its EOS), ascending."""
        found = []
        k = bisect.bisect_right(self._bounds, start) - 1
        while k < len(self.shards.shards) and self._bounds[k] < stop:
            base, shard = self._bounds[k], self.shards.shards[k]
            lo, hi = max(start - base, 0), min(stop - base, len(shard))
            # a document ends one token before the next one starts, and at the end of the shard
            i, j = np.searchsorted(shard.offsets, [lo + 1, hi + 1])
            found.append(np.asarray(shard.offsets[i:j]) + (base - 1))
            if lo <= len(shard) - 1 < hi:
                found.append(np.array([base + len(shard) - 1], dtype=np.int64))
            k += 1
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)

    def boundaries(self, sequences: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(row, position) of every document end inside the given windows (positions 0..seq_len)."""
        rows, positions = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
        for row, q in enumerate(np.asarray(sequences, dtype=np.int64).tolist()):
            first = q * self.seq_len
            ends = self.ends_in(first, first + self.seq_len + 1) - first
            rows.append(np.full(len(ends), row, dtype=np.int64))
            positions.append(ends)
        return np.concatenate(rows), np.concatenate(positions)


@dataclass
class Batch:
    """One micro batch: inputs and targets [B, T] with their document structure and provenance."""

    inputs: torch.Tensor  # int64 [B, T]
    targets: torch.Tensor  # int64 [B, T]: the inputs shifted by one
    doc_ids: torch.Tensor  # int64 [B, T]: equal ids share a document (attend only within it)
    position_ids: torch.Tensor  # int64 [B, T]: restart at 0 at each document
    cu_seqlens: torch.Tensor  # int32 [segments + 1]: segment offsets over the flattened B x T positions
    sources: list[str] = field(default_factory=list)  # source of each row
    sequences: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # window index in its source
    epochs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # the source epoch of each row
    fim: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # rows with a FIM segment

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        moved = {
            name: getattr(self, name).to(device, non_blocking=non_blocking)
            for name in ("inputs", "targets", "doc_ids", "position_ids", "cu_seqlens")
        }
        return Batch(
            **moved, sources=self.sources, sequences=self.sequences, epochs=self.epochs, fim=self.fim
        )

    def pin_memory(self) -> Batch:
        pinned = {
            name: getattr(self, name).pin_memory()
            for name in ("inputs", "targets", "doc_ids", "position_ids", "cu_seqlens")
        }
        return Batch(
            **pinned, sources=self.sources, sequences=self.sequences, epochs=self.epochs, fim=self.fim
        )


def document_structure(ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """doc_ids, position_ids [B, T] and cu_seqlens from a boolean [B, T] mask of document-end tokens.

    A document end (EOS) opens a new segment; row starts always open one.
    """
    rows, width = ends.shape
    doc_ids = np.cumsum(ends, axis=1, dtype=np.int64)
    opens = ends.copy()
    opens[:, 0] = True
    positions = np.arange(width, dtype=np.int64)
    start_of = np.maximum.accumulate(np.where(opens, positions, 0), axis=1)
    position_ids = positions - start_of
    flat = np.flatnonzero(opens.reshape(-1))
    cu_seqlens = np.append(flat, rows * width).astype(np.int32)
    return doc_ids, position_ids, cu_seqlens


def fim_segment(
    content: np.ndarray, rng: np.random.Generator, spm: bool, fim_ids: tuple[int, int, int]
) -> np.ndarray:
    """A FIM rewrite of `content` with the same length (its last 3 tokens make room for the sentinels)."""
    prefix_id, middle_id, suffix_id = fim_ids
    keep = content[: len(content) - 3]
    a, b = np.sort(rng.integers(0, len(keep) + 1, size=2))
    prefix, middle, suffix = keep[:a], keep[a:b], keep[b:]
    pre, mid, suf = (np.array([t], dtype=content.dtype) for t in (prefix_id, middle_id, suffix_id))
    if spm:
        return np.concatenate([pre, suf, suffix, mid, prefix, middle])
    return np.concatenate([pre, prefix, suf, suffix, mid, middle])


def apply_fim(
    window: np.ndarray,
    ends: np.ndarray,
    rng: np.random.Generator,
    rate: float,
    spm_rate: float,
    fim_ids: tuple[int, int, int],
    bos_id: int | None = None,
) -> bool:
    """Rewrite each document segment of one window (in place) to FIM with probability `rate`.

    `ends`: positions of document ends (EOS) in the window, ascending. The EOS (and a BOS after it)
    stay where they are, so the document boundaries do not move. Returns whether any segment changed.
    """
    changed = False
    cuts = [-1, *ends.tolist(), len(window)]
    for start, stop in zip(cuts[:-1], cuts[1:], strict=True):
        lo = start + 1  # skip the EOS that opens the segment
        hi = stop if stop < len(window) else len(window)
        if bos_id is not None and lo < hi and window[lo] == bos_id:
            lo += 1
        if hi - lo < MIN_FIM_CONTENT or rng.random() >= rate:
            continue
        window[lo:hi] = fim_segment(window[lo:hi], rng, rng.random() < spm_rate, fim_ids)
        changed = True
    return changed


def pack(
    windows: np.ndarray, ends_rows: np.ndarray, ends_positions: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tensors of a batch from windows [B, T + 1] and the (row, position) of document ends in them."""
    width = windows.shape[1] - 1
    ends = np.zeros((windows.shape[0], width), dtype=bool)
    inside = ends_positions < width  # an end at the last position is only a target
    ends[ends_rows[inside], ends_positions[inside]] = True
    doc_ids, position_ids, cu_seqlens = document_structure(ends)
    data = torch.from_numpy(windows.astype(np.int64, copy=False))
    return (
        data[:, :-1],
        data[:, 1:],
        torch.from_numpy(doc_ids),
        torch.from_numpy(position_ids),
        torch.from_numpy(cu_seqlens),
    )
