"""Token shards: documents -> `tokens/<split>/<source>/NNNNN.bin` + `NNNNN.idx`, and the reader.

`.bin` is a flat little-endian uint16 array (uint32 when the padded vocabulary exceeds 65,536): each
document's tokens followed by EOS. `.idx` is a little-endian int64 array with the start offset of every
document within its shard. A shard holds at most `tokens.shard_tokens` tokens; documents are never split
across shards, and a document longer than a shard gets a shard of its own. `meta.json` records the
dtype and special ids, `stats.json` the counts per split and source.
"""

from __future__ import annotations

import bisect
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from smelt.config import TokensConfig
from smelt.errors import UserError
from smelt.progress import log, progress
from smelt.tokenizer.load import Tokenizer

META_JSON = "meta.json"
STATS_JSON = "stats.json"
FORCE_HINT = "re-run `smelt tokenize CONFIG --force`"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def shard_name(index: int) -> str:
    return f"{index:05d}"


# ---------------------------------------------------------------------------------------------
# Writing


class ShardWriter:
    """Appends documents (tokens + EOS) to numbered shards of one split/source directory."""

    def __init__(self, directory: Path, dtype: np.dtype, shard_tokens: int):
        self.directory = directory
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.shards = 0
        self._file = None
        self._offsets: list[int] = []
        self._fill = 0
        directory.mkdir(parents=True, exist_ok=True)
        for stale in list(directory.glob("*.bin")) + list(directory.glob("*.idx")):
            stale.unlink()

    def _open(self) -> None:
        self._file = open(self.directory / f"{shard_name(self.shards)}.bin", "wb")  # noqa: SIM115
        self._offsets = []
        self._fill = 0

    def close_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        np.asarray(self._offsets, dtype="<i8").tofile(self.directory / f"{shard_name(self.shards)}.idx")
        self._file = None
        self.shards += 1

    def write_batch(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Write documents given as one flat token array (each already ending in EOS) and their lengths."""
        position = 0
        count = len(lengths)
        i = 0
        while i < count:
            if self._file is None:
                self._open()
            room = self.shard_tokens - self._fill
            if lengths[i] > room and self._fill > 0:
                self.close_shard()
                continue
            # take as many whole documents as fit (at least one: an oversized document gets its own shard)
            ends = np.cumsum(lengths[i:], dtype=np.int64)
            take = max(1, int(np.searchsorted(ends, room, side="right")))
            size = int(ends[take - 1])
            starts = self._fill + np.concatenate(([0], ends[: take - 1]))
            self._offsets.extend(starts.tolist())
            self._file.write(flat[position : position + size].tobytes())
            self._fill += size
            position += size
            i += take
            if self._fill >= self.shard_tokens:
                self.close_shard()

    def close(self) -> int:
        self.close_shard()
        return self.shards


def _splits(documents_dir: Path) -> list[str]:
    return sorted(p.name for p in documents_dir.iterdir() if p.is_dir() and list(p.glob("*/part-*.parquet")))


def tokenize(cfg: TokensConfig, documents_dir: Path, tokenizer_dir: Path, out_dir: Path) -> dict[str, Any]:
    """Encode every split/source of documents into out_dir/<split>/<source>/NNNNN.bin + NNNNN.idx.

    Writes out_dir/meta.json and out_dir/stats.json; returns the stats (with throughput figures).
    Per source: documents, tokens (the stream, EOS included), bytes (UTF-8 of the text),
    bytes_per_token (bytes over text tokens, EOS excluded), shards.
    """
    started = time.time()
    documents_dir, out_dir = Path(documents_dir), Path(out_dir)
    tokenizer = Tokenizer.load(tokenizer_dir)
    if not documents_dir.is_dir() or not _splits(documents_dir):
        raise UserError(
            f"no documents to tokenize: {documents_dir} has no <split>/<source>/part-*.parquet files. "
            f"Run `smelt curate CONFIG` first."
        )
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": eos,
        "bos_id": tokenizer.bos_id,
        "pad_id": tokenizer.pad_id,
    }
    (out_dir / META_JSON).write_text(json.dumps(meta, indent=2) + "\n")

    parts = {
        split: sorted((documents_dir / split).glob("*/part-*.parquet")) for split in _splits(documents_dir)
    }
    total_docs = sum(pq.ParquetFile(p).metadata.num_rows for files in parts.values() for p in files)
    splits: dict[str, Any] = {}
    bar = progress(total=total_docs, desc="tokenize", unit="doc", unit_scale=True)
    try:
        for split, files in parts.items():
            sources: dict[str, list[Path]] = {}
            for path in files:
                sources.setdefault(path.parent.name, []).append(path)
            split_stats: dict[str, Any] = {}
            for source, source_files in sources.items():
                writer = ShardWriter(out_dir / split / source, dtype, cfg.shard_tokens)
                counts = {"documents": 0, "tokens": 0, "bytes": 0}
                for path in source_files:
                    _encode_part(path, tokenizer, writer, cfg.batch_docs, eos, dtype, counts, bar)
                shards = writer.close()
                text_tokens = counts["tokens"] - counts["documents"]
                split_stats[source] = {
                    **counts,
                    "bytes_per_token": round(counts["bytes"] / text_tokens, 4) if text_tokens else 0.0,
                    "shards": shards,
                }
            splits[split] = {"sources": split_stats, **_totals(split_stats.values())}
    finally:
        bar.close()

    wall = time.time() - started
    totals = _totals(splits.values())
    stats = {"splits": splits, **totals, "dtype": dtype.name, "vocab_size": tokenizer.vocab_size}
    (out_dir / STATS_JSON).write_text(json.dumps(stats, indent=2) + "\n")
    result = {
        **stats,
        "wall_time_s": round(wall, 3),
        "mb_per_s": round(totals["bytes"] / 1e6 / wall, 3) if wall > 0 else 0.0,
        "tokens_per_s": round(totals["tokens"] / wall, 1) if wall > 0 else 0.0,
    }
    log(
        f"[tokenize] {totals['documents']} documents -> {totals['tokens']} tokens "
        f"({totals['bytes_per_token']} bytes/token) in {wall:.1f} s, {result['mb_per_s']} MB/s"
    )
    return result


def _totals(rows) -> dict[str, Any]:
    rows = list(rows)
    out = {key: sum(r[key] for r in rows) for key in ("documents", "tokens", "bytes", "shards")}
    text_tokens = out["tokens"] - out["documents"]
    out["bytes_per_token"] = round(out["bytes"] / text_tokens, 4) if text_tokens else 0.0
    return out


def _encode_part(
    path: Path,
    tokenizer: Tokenizer,
    writer: ShardWriter,
    batch_docs: int,
    eos: int,
    dtype: np.dtype,
    counts: dict[str, int],
    bar,
) -> None:
    """Encode one parquet part batch by batch; the next batch encodes (in Rust, GIL released) while
    this one is packed and written."""
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=batch_docs, columns=["text"])
    except Exception as exc:
        raise UserError(
            f"documents part {path} cannot be read ({exc}); re-run `smelt curate --force`."
        ) from exc

    def encode(batch) -> tuple[list[list[int]], int, int]:
        column = batch.column(0)
        texts = [t or "" for t in column.to_pylist()]
        size = pc.sum(pc.binary_length(column)).as_py() or 0
        return tokenizer.encode_batch(texts), len(texts), size

    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = None
        for batch in batches:
            following = pool.submit(encode, batch)
            if pending is not None:
                _write_encoded(pending.result(), writer, eos, dtype, counts, bar)
            pending = following
        if pending is not None:
            _write_encoded(pending.result(), writer, eos, dtype, counts, bar)


def _write_encoded(encoded_batch, writer: ShardWriter, eos: int, dtype: np.dtype, counts, bar) -> None:
    encoded, documents, size = encoded_batch
    lengths = np.fromiter((len(ids) + 1 for ids in encoded), dtype=np.int64, count=len(encoded))
    flat = np.empty(int(lengths.sum()), dtype=dtype)
    flat[np.cumsum(lengths) - 1] = eos
    position = 0
    for ids, length in zip(encoded, lengths, strict=True):
        flat[position : position + length - 1] = ids
        position += length
    writer.write_batch(flat, lengths)
    counts["documents"] += documents
    counts["tokens"] += int(lengths.sum())
    counts["bytes"] += size
    bar.update(documents)


# ---------------------------------------------------------------------------------------------
# Reading


def read_meta(tokens_dir: Path) -> dict[str, Any]:
    path = Path(tokens_dir) / META_JSON
    if not path.is_file():
        raise UserError(
            f"no token shards at {tokens_dir}: {META_JSON} is missing. Run `smelt tokenize CONFIG` first."
        )
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); {FORCE_HINT}.") from exc


class Shard:
    """One `.bin` + `.idx` pair, opened as read-only numpy memmaps and validated."""

    def __init__(self, bin_path: Path, dtype: np.dtype):
        self.bin_path = bin_path
        self.idx_path = bin_path.with_suffix(".idx")
        size = bin_path.stat().st_size
        if size == 0 or size % dtype.itemsize:
            raise UserError(
                f"token shard {bin_path} is {size} bytes, not a positive multiple of {dtype.itemsize} "
                f"({dtype.name} tokens): it is truncated or corrupt; {FORCE_HINT}."
            )
        if not self.idx_path.is_file():
            raise UserError(f"token shard {bin_path} has no index {self.idx_path.name}; {FORCE_HINT}.")
        idx_size = self.idx_path.stat().st_size
        if idx_size == 0 or idx_size % 8:
            raise UserError(
                f"shard index {self.idx_path} is {idx_size} bytes, not a positive multiple of 8; {FORCE_HINT}."
            )
        self.tokens = np.memmap(bin_path, dtype=dtype, mode="r")
        self.offsets = np.fromfile(self.idx_path, dtype="<i8")
        n = len(self.tokens)
        if self.offsets[0] != 0 or self.offsets[-1] >= n or np.any(np.diff(self.offsets) <= 0):
            raise UserError(
                f"shard index {self.idx_path} has document offsets outside 0..{n - 1} or out of order "
                f"for {bin_path.name} ({n} tokens); {FORCE_HINT}."
            )

    def __len__(self) -> int:
        return len(self.tokens)


class ShardSet:
    """The shards of `tokens_dir/<split>` (all sources, in sorted source order) or of one source.

    Presents them as one concatenated token stream: `read(start, length)`, `document_starts()`.
    """

    def __init__(self, tokens_dir: str | Path, split: str, source: str | None = None):
        self.tokens_dir = Path(tokens_dir)
        self.split = split
        self.source = source
        self.meta = read_meta(self.tokens_dir)
        self.dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        self.eos_id = int(self.meta["eos_id"])
        split_dir = self.tokens_dir / split
        if not split_dir.is_dir():
            available = sorted(p.name for p in self.tokens_dir.iterdir() if p.is_dir())
            raise UserError(
                f"no token shards for split {split!r} in {self.tokens_dir} (splits present: "
                f"{', '.join(available) or 'none'}). Check the split name or re-run `smelt tokenize`."
            )
        if source is None:
            self.sources = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
        else:
            if not (split_dir / source).is_dir():
                raise UserError(f"no token shards for source {source!r} in {split_dir}.")
            self.sources = [source]
        self.shards: list[Shard] = []
        self.shard_sources: list[str] = []
        for name in self.sources:
            for bin_path in sorted((split_dir / name).glob("*.bin")):
                self.shards.append(Shard(bin_path, self.dtype))
                self.shard_sources.append(name)
        sizes = [len(s) for s in self.shards]
        self.starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int64)
        self.total_tokens = int(self.starts[-1])
        self._starts_list = self.starts.tolist()
        self._document_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return self.total_tokens

    @property
    def num_documents(self) -> int:
        return sum(len(s.offsets) for s in self.shards)

    def document_starts(self) -> np.ndarray:
        """Global start offset (int64) of every document in the concatenated stream, ascending."""
        if self._document_starts is None:
            pieces = [s.offsets + start for s, start in zip(self.shards, self.starts[:-1], strict=True)]
            self._document_starts = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)
        return self._document_starts

    def document(self, index: int) -> np.ndarray:
        """Tokens of document `index` (in stream order), EOS included."""
        starts = self.document_starts()
        end = int(starts[index + 1]) if index + 1 < len(starts) else self.total_tokens
        return self.read(int(starts[index]), end - int(starts[index]))

    def read(self, start: int, length: int) -> np.ndarray:
        """`length` tokens from global offset `start` (a copy; fewer at the end of the stream)."""
        if start < 0 or length < 0:
            raise ValueError(f"read({start}, {length}): negative offset or length")
        end = min(start + length, self.total_tokens)
        if start >= end:
            return np.zeros(0, dtype=self.dtype)
        first = bisect.bisect_right(self._starts_list, start) - 1
        shard_start = self._starts_list[first]
        if end <= self._starts_list[first + 1]:
            return np.array(self.shards[first].tokens[start - shard_start : end - shard_start])
        pieces = []
        position = start
        index = first
        while position < end:
            lo = self._starts_list[index]
            hi = min(end, self._starts_list[index + 1])
            pieces.append(self.shards[index].tokens[position - lo : hi - lo])
            position = hi
            index += 1
        return np.concatenate(pieces)
