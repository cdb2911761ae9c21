"""Token shards: the format, the writer and the verified reader of `tokens/<split>/<source>/NNNNN.bin`.

`.bin` is a flat little-endian uint16 array (uint32 when the padded vocabulary exceeds 65,536): each
document's tokens (after BOS when `tokens.bos` is set) followed by EOS. `.idx` is a little-endian int64
array with the start offset of every document within its shard. A shard holds at most
`tokens.shard_tokens` tokens; documents are never split across shards, and a document longer than a
shard gets a shard of its own. `NNNNN.done` (JSON) is written last for each shard: counts, sha256 of
`.bin` and `.idx`, and the key of the settings it was made with; a shard without it does not exist
(it is rewritten on resume). `meta.json` records the dtype, special ids and tokenizer hash,
`stats.json` the counts per split and source, `shards.json` every shard's checksums and counts (the
reader checks shards against it). Encoding lives in `smelt.tokens.tokenize`.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from smelt.errors import UserError

META_JSON = "meta.json"
STATS_JSON = "stats.json"
SHARDS_JSON = "shards.json"
DONE_SUFFIX = ".done"
FORCE_HINT = "re-run `smelt tokenize CONFIG --force`"


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size <= 65536 else np.dtype("<u4")


def shard_name(index: int) -> str:
    return f"{index:05d}"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file and a rename, so a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# Writing


class ShardWriter:
    """Appends documents (tokens + EOS) to numbered shards of one split/source directory.

    `first_shard` > 0 continues after shards kept from an interrupted run (their files are left alone;
    every later `.bin`/`.idx`/`.done` is removed). With `key` set, each closed shard gets its `.done`
    marker (counts, checksums, key); `first_document` is the index of the next document in the source.
    """

    def __init__(
        self,
        directory: Path,
        dtype: np.dtype,
        shard_tokens: int,
        first_shard: int = 0,
        first_document: int = 0,
        key: str | None = None,
    ):
        self.directory = directory
        self.dtype = dtype
        self.shard_tokens = shard_tokens
        self.shards = first_shard
        self.key = key
        self.document = first_document
        self.markers: list[dict[str, Any]] = []
        self._file = None
        self._offsets: list[int] = []
        self._fill = 0
        self._bytes = 0
        self._hash = hashlib.sha256()
        directory.mkdir(parents=True, exist_ok=True)
        for stale in sorted(directory.iterdir()):
            stem = stale.name.split(".", 1)[0]
            if stem.isdigit() and int(stem) >= first_shard:
                stale.unlink()

    def _open(self) -> None:
        self._file = open(self.directory / f"{shard_name(self.shards)}.bin", "wb")  # noqa: SIM115
        self._offsets = []
        self._fill = 0
        self._bytes = 0
        self._hash = hashlib.sha256()
        self._first_document = self.document

    def close_shard(self) -> None:
        if self._file is None:
            return
        self._file.close()
        name = shard_name(self.shards)
        index = np.asarray(self._offsets, dtype="<i8")
        index.tofile(self.directory / f"{name}.idx")
        if self.key is not None:
            marker = {
                "shard": name,
                "tokens": self._fill,
                "documents": len(self._offsets),
                "bytes": self._bytes,
                "first_document": self._first_document,
                "sha256": self._hash.hexdigest(),
                "idx_sha256": hashlib.sha256(index.tobytes()).hexdigest(),
                "key": self.key,
            }
            write_json_atomic(self.directory / f"{name}{DONE_SUFFIX}", marker)
            self.markers.append(marker)
        self._file = None
        self.shards += 1

    def write_batch(self, flat: np.ndarray, lengths: np.ndarray, sizes: np.ndarray | None = None) -> None:
        """Write documents given as one flat token array (each already ending in EOS) and their lengths;
        `sizes` (UTF-8 bytes of each document's text) feed the per-shard byte counts."""
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
            data = flat[position : position + size].tobytes()
            self._file.write(data)
            self._hash.update(data)
            if sizes is not None:
                self._bytes += int(np.sum(sizes[i : i + take]))
            self._fill += size
            self.document += take
            position += size
            i += take
            if self._fill >= self.shard_tokens:
                self.close_shard()

    def close(self) -> int:
        self.close_shard()
        return self.shards


# ---------------------------------------------------------------------------------------------
# Reading


def has_shards(split_dir: Path) -> bool:
    """Whether a split directory holds at least one non-empty token shard."""
    return split_dir.is_dir() and any(p.stat().st_size > 0 for p in split_dir.rglob("*.bin"))


def read_meta_if_any(tokens_dir: Path) -> dict[str, Any]:
    """The shards' meta.json, or {} where there is none yet."""
    return read_meta(tokens_dir) if (Path(tokens_dir) / META_JSON).is_file() else {}


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
        self.offsets = np.memmap(self.idx_path, dtype="<i8", mode="r")  # paged in on demand, not held
        n = len(self.tokens)
        if self.offsets[0] != 0 or self.offsets[-1] >= n or np.any(np.diff(self.offsets) <= 0):
            raise UserError(
                f"shard index {self.idx_path} has document offsets outside 0..{n - 1} or out of order "
                f"for {bin_path.name} ({n} tokens); {FORCE_HINT}."
            )

    def __len__(self) -> int:
        return len(self.tokens)


def _check_shard(shard: Shard, entry: dict[str, Any], verify: str) -> None:
    if len(shard) != int(entry["tokens"]) or len(shard.offsets) != int(entry["documents"]):
        raise UserError(
            f"token shard {shard.bin_path} holds {len(shard)} tokens in {len(shard.offsets)} documents but "
            f"{SHARDS_JSON} records {entry['tokens']} tokens in {entry['documents']}: it is corrupt; {FORCE_HINT}."
        )
    if verify == "checksum":
        for path, key in ((shard.bin_path, "sha256"), (shard.idx_path, "idx_sha256")):
            actual = sha256_file(path)
            if actual != entry[key]:
                raise UserError(
                    f"token shard file {path} is corrupt: its sha256 {actual[:16]}… differs from the "
                    f"{entry[key][:16]}… recorded in {SHARDS_JSON}; {FORCE_HINT}."
                )


def list_sources(tokens_dir: str | Path, split: str) -> list[str]:
    """The sources of one split (sorted directory names); a missing split is a UserError."""
    tokens_dir = Path(tokens_dir)
    split_dir = tokens_dir / split
    if not split_dir.is_dir():
        available = sorted(p.name for p in tokens_dir.iterdir() if p.is_dir()) if tokens_dir.is_dir() else []
        raise UserError(
            f"no token shards for split {split!r} in {tokens_dir} (splits present: "
            f"{', '.join(available) or 'none'}). Check the split name or re-run `smelt tokenize`."
        )
    return sorted(p.name for p in split_dir.iterdir() if p.is_dir())


class ShardSet:
    """The shards of `tokens_dir/<split>` (all sources, in sorted source order) or of one source.

    Presents them as one concatenated token stream: `read(start, length)`, `document_starts()`.
    """

    def __init__(
        self, tokens_dir: str | Path, split: str, source: str | None = None, verify: str = "checksum"
    ):
        """`verify`: "checksum" (default) checks every shard's sha256 against `shards.json`; "size" only
        that every recorded shard is there with its recorded length; "none" trusts the files."""
        if verify not in ("checksum", "size", "none"):
            raise ValueError(f"verify={verify!r}: use 'checksum', 'size' or 'none'")
        self.tokens_dir = Path(tokens_dir)
        self.split = split
        self.source = source
        self.meta = read_meta(self.tokens_dir)
        self.dtype = np.dtype(self.meta["dtype"]).newbyteorder("<")
        self.eos_id = int(self.meta["eos_id"])
        split_dir = self.tokens_dir / split
        if source is None:
            self.sources = list_sources(self.tokens_dir, split)
        else:
            list_sources(self.tokens_dir, split)  # the split must exist
            if not (split_dir / source).is_dir():
                raise UserError(f"no token shards for source {source!r} in {split_dir}.")
            self.sources = [source]
        recorded = self._recorded(split) if verify != "none" else None
        if recorded is not None and source is None:
            missing = sorted(set(recorded) - set(self.sources))
            if missing:
                raise UserError(
                    f"token shards for source {missing[0]!r} of split {split!r} are missing from "
                    f"{self.tokens_dir} (shards.json records them); {FORCE_HINT}."
                )
        self.shards: list[Shard] = []
        self.shard_sources: list[str] = []
        for name in self.sources:
            bins = sorted((split_dir / name).glob("*.bin"))
            if recorded is not None:
                self._check_listing(split_dir / name, bins, recorded.get(name))
            for bin_path in bins:
                shard = Shard(bin_path, self.dtype)
                if recorded is not None:
                    _check_shard(shard, recorded[name][bin_path.stem], verify)
                self.shards.append(shard)
                self.shard_sources.append(name)
        self._index()

    def _index(self) -> None:
        sizes = [len(s) for s in self.shards]
        self.starts = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int64)
        self.total_tokens = int(self.starts[-1])
        self._starts_list = self.starts.tolist()
        self._document_starts: np.ndarray | None = None

    def select(self, source: str) -> ShardSet:
        """The shards of one of this set's sources, as their own stream (already verified, same memmaps)."""
        if source not in self.sources:
            raise UserError(f"no token shards for source {source!r} in {self.tokens_dir / self.split}.")
        view = object.__new__(ShardSet)
        view.__dict__.update(self.__dict__)
        view.source, view.sources = source, [source]
        keep = [i for i, name in enumerate(self.shard_sources) if name == source]
        view.shards = [self.shards[i] for i in keep]
        view.shard_sources = [source] * len(keep)
        view._index()
        return view

    def __len__(self) -> int:
        return self.total_tokens

    def _recorded(self, split: str) -> dict[str, dict[str, dict[str, Any]]] | None:
        """shard name -> recorded entry, per source of `split`; None for shards written without a manifest."""
        if not self.meta.get("checksummed"):
            return None
        path = self.tokens_dir / SHARDS_JSON
        if not path.is_file():
            raise UserError(
                f"token shards at {self.tokens_dir} are incomplete: {SHARDS_JSON} is missing, so a "
                f"`smelt tokenize` run did not finish. Run `smelt tokenize CONFIG` again (it resumes from the "
                f"finished shards) or {FORCE_HINT}."
            )
        try:
            manifest = json.loads(path.read_text())
            sources = manifest["splits"].get(split, {})
            return {name: {row["shard"]: row for row in entry["shards"]} for name, entry in sources.items()}
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(f"{path} is not a valid shard manifest ({exc}); {FORCE_HINT}.") from exc

    @staticmethod
    def _check_listing(directory: Path, bins: list[Path], recorded: dict[str, Any] | None) -> None:
        recorded = recorded or {}
        names = {b.stem for b in bins}
        missing = sorted(set(recorded) - names)
        if missing:
            raise UserError(
                f"token shard {directory / (missing[0] + '.bin')} is missing ({len(missing)} of "
                f"{len(recorded)} recorded shards of this source are gone); {FORCE_HINT}."
            )
        extra = sorted(names - set(recorded))
        if extra:
            raise UserError(
                f"token shard {directory / (extra[0] + '.bin')} is not recorded in {SHARDS_JSON}: it was added "
                f"or left over by another run; remove it or {FORCE_HINT}."
            )

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
