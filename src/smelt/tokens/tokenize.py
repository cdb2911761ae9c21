"""Documents -> token shards, in parallel, streaming and resumable per shard.

The main process reads each source's parquet parts batch by batch (never the whole corpus) and hands
the text batches to a pool of encoding processes (each encodes a batch with the tokenizer's fastest
backend, smelt's compiled encoder by default, and returns one packed token array); results come back
in submission order and are packed into shards by one `ShardWriter` per source, so the output is
byte-identical whatever the number of workers or the batch size. At most a few batches per worker are
in flight.

Resume: every finished shard has a `.done` marker with its checksums and the key of the settings
(tokenizer hash, shard size, BOS, dtype, input parts). A rerun keeps the leading shards whose markers
match and whose files check out, skips the documents they hold, and rewrites the rest. A tokens
directory written with another tokenizer is refused (the tokenizer hash is recorded in `meta.json`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from smelt.config import TokensConfig
from smelt.documents import open_part
from smelt.errors import UserError
from smelt.executors import ProcessPool, TaskExecutor, make_executor
from smelt.progress import log, progress
from smelt.storage import is_remote, local_path, publish, staging_dir
from smelt.tokenizer.load import Tokenizer
from smelt.tokens.drop_list import DocFilter, write_dropped
from smelt.tokens.shards import (
    DONE_SUFFIX,
    FORCE_HINT,
    META_JSON,
    SHARDS_JSON,
    STATS_JSON,
    ShardWriter,
    sha256_file,
    shard_name,
    token_dtype,
    write_json_atomic,
)

FORMAT_VERSION = 2

# ---------------------------------------------------------------------------------------------
# Encoding (runs in the worker processes, or in this one when there is a single worker)

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_dir: str, threads: int) -> None:
    # one Rust thread per process: the pool provides the parallelism
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    _WORKER["tokenizer"] = Tokenizer.load(tokenizer_dir)


def encode_packed(
    tokenizer: Tokenizer, texts: list[str], eos: int, bos: int | None, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Encode texts and pack them: one flat array of [BOS] tokens EOS per document, and the lengths."""
    ids, counts = tokenizer.encode_flat(texts)
    extra = 2 if bos is not None else 1
    lengths = counts + extra
    ends = np.cumsum(lengths)
    flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    flat[ends - 1] = eos
    if bos is not None:
        flat[ends - lengths] = bos
    # each document's ids land after its BOS: shift every id by the specials added before it
    document = np.repeat(np.arange(len(counts)), counts)
    flat[np.arange(len(ids)) + document * extra + (1 if bos is not None else 0)] = ids
    return flat, lengths


def _encode_in_worker(
    texts: pa.Array, eos: int, bos: int | None, dtype: str
) -> tuple[np.ndarray, np.ndarray]:
    strings = [t or "" for t in texts.to_pylist()]
    return encode_packed(_WORKER["tokenizer"], strings, eos, bos, np.dtype(dtype))


# ---------------------------------------------------------------------------------------------
# Orchestration


def _splits(documents_dir: Path) -> list[str]:
    return sorted(p.name for p in documents_dir.iterdir() if p.is_dir() and list(p.glob("*/part-*.parquet")))


# Below this much text per extra process, starting it (interpreter, libraries, the encoder's compiled
# kernels: about 1.5 s) costs more than it saves: the whole 37 MB shared corpus encodes in 3.8 s alone.
BYTES_PER_EXTRA_WORKER = 32_000_000


def resolve_workers(cfg: TokensConfig, batches: int, text_bytes: int) -> int:
    """`tokens.workers`, or with 0 one process per core, but no more than the batches or the text
    (one process per BYTES_PER_EXTRA_WORKER) make worth starting."""
    if cfg.workers:
        return max(1, min(cfg.workers, batches))
    return max(1, min(os.cpu_count() or 1, batches, 1 + text_bytes // BYTES_PER_EXTRA_WORKER))


def _check_meta(out_dir: Path, meta: dict[str, Any], tokenizer_dir: Path) -> None:
    """Refuse to add to a tokens directory written with another tokenizer."""
    path = out_dir / META_JSON
    if not path.is_file():
        return
    try:
        old = json.loads(path.read_text())
    except json.JSONDecodeError:
        return  # unreadable: rewritten below, and no shard marker will match
    recorded = old.get("tokenizer_hash")
    if recorded and recorded != meta["tokenizer_hash"]:
        raise UserError(
            f"the token shards in {out_dir} were made with another tokenizer (hash {recorded[:12]}…) than "
            f"the one at {tokenizer_dir} (hash {meta['tokenizer_hash'][:12]}…); mixing them would corrupt the "
            f"data. Point the run at the tokenizer the shards were made with, or {FORCE_HINT} to tokenize "
            f"everything again with this one."
        )


def _source_key(
    meta: dict[str, Any], cfg: TokensConfig, files: list[Path], parts: list[pq.ParquetFile]
) -> str:
    """What a finished shard of this source depends on: tokenizer, settings, and the input parts."""
    inputs = [[p.name, p.stat().st_size, f.metadata.num_rows] for p, f in zip(files, parts, strict=True)]
    settings = {
        "format": FORMAT_VERSION,
        "tokenizer_hash": meta["tokenizer_hash"],
        "dtype": meta["dtype"],
        "shard_tokens": cfg.shard_tokens,
        "bos": cfg.bos,
        "inputs": inputs,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _finished_shards(directory: Path, key: str, itemsize: int) -> list[dict[str, Any]]:
    """The leading shards of an earlier run that can be kept: marker matches the key and the files check out."""
    kept: list[dict[str, Any]] = []
    documents = 0
    while True:
        name = shard_name(len(kept))
        marker_path = directory / f"{name}{DONE_SUFFIX}"
        bin_path, idx_path = directory / f"{name}.bin", directory / f"{name}.idx"
        if not (marker_path.is_file() and bin_path.is_file() and idx_path.is_file()):
            return kept
        try:
            marker = json.loads(marker_path.read_text())
        except json.JSONDecodeError:
            return kept
        if (
            marker.get("key") != key
            or marker.get("first_document") != documents
            or bin_path.stat().st_size != marker["tokens"] * itemsize
            or idx_path.stat().st_size != marker["documents"] * 8
            or sha256_file(bin_path) != marker["sha256"]
            or sha256_file(idx_path) != marker["idx_sha256"]
        ):
            return kept
        kept.append(marker)
        documents += marker["documents"]


class SpecialText:
    """Occurrences of special tokens' text (`<|eos|>` in a web page) in a source's documents, which the
    tokenizer encodes as ordinary text. Counted here, over every document of the source (those of shards
    kept from an earlier run too), so the figure does not depend on a resume."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.counts: Counter[str] = Counter()
        self.documents = 0

    def add(self, column: pa.Array) -> None:
        if not self.tokenizer.special_text_regex:
            return
        hits = pc.fill_null(pc.match_substring_regex(column, self.tokenizer.special_text_regex), False)
        texts = pc.filter(column, hits).to_pylist()
        self.documents += len(texts)
        self.counts.update(self.tokenizer.special_text_counts(texts))

    def row(self) -> dict[str, Any]:
        """`special_text`: occurrences per token text (most first), `special_text_documents`: documents
        holding any."""
        ordered = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        return {"special_text": dict(ordered), "special_text_documents": self.documents}


def _batches(
    files: list[Path],
    parts: list[pq.ParquetFile],
    skip: int,
    batch_docs: int,
    batch_bytes: int,
    special: SpecialText | None = None,
    keep: DocFilter | None = None,
) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """Text batches of a source after its first `skip` documents, with each document's UTF-8 size;
    a batch holds at most `batch_docs` documents and, past its first document, `batch_bytes` of text.
    `special` sees every document, the skipped ones too; `keep` leaves out the drop list's documents
    before anything else sees them (`skip` counts the documents kept)."""
    for path, part in zip(files, parts, strict=True):
        rows = part.metadata.num_rows
        if skip >= rows and special is None and keep is None:
            skip -= rows
            continue
        try:
            for batch in part.iter_batches(
                batch_size=batch_docs, columns=["id", "text"] if keep else ["text"]
            ):
                column = batch.column(batch.num_columns - 1)
                if keep:
                    mask = keep.keep(batch.column(0).to_pylist())
                    column = column if mask.all() else column.filter(pa.array(mask))
                if special is not None:
                    special.add(column)
                if skip:
                    if skip >= len(column):
                        skip -= len(column)
                        continue
                    column = column.slice(skip)
                    skip = 0
                sizes = pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False)
                yield from _split_by_bytes(column, sizes.astype(np.int64), batch_bytes)
        except UserError:
            raise
        except Exception as exc:
            raise UserError(
                f"documents part {path} cannot be read ({exc}); re-run `smelt curate --force`."
            ) from exc


def tokenize(
    cfg: TokensConfig,
    documents_dir: Path,
    tokenizer_dir: Path,
    out_dir: Path | str,
    workers: int | None = None,
    url_cache: str = "",
    drops: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Encode every split/source of documents into out_dir/<split>/<source>/NNNNN.bin + NNNNN.idx.

    Writes out_dir/meta.json (first), then the shards with their `.done` markers, then
    out_dir/shards.json (every shard's checksums and counts) and out_dir/stats.json; returns the stats
    (with throughput figures). Per source: documents, tokens (the stream, EOS/BOS included), bytes (UTF-8
    of the text), bytes_per_token (bytes over text tokens), shards, special_text (occurrences of special
    tokens' text, such as a literal `<|eos|>`, which is encoded as ordinary text; with the run's total
    at the top) and special_text_documents. `workers` overrides `cfg.workers`.
    `out_dir` may be a file:// URL, or a store's URL (s3://...): then the shards are written to a staging
    directory under `url_cache` (default ~/.cache/smelt/urls), where a rerun resumes, and published to
    the store (storage.py), `.done` markers after their shards and shards.json last.
    `drops`: the run's drop list (tokens/drop_list.py); its documents are left out and recorded in
    out_dir/dropped.jsonl.
    """
    if is_remote(str(out_dir)):
        staging = staging_dir(url_cache, str(out_dir))
        log(f"[tokenize] writing under {staging}, then to {out_dir}")
        result = tokenize(cfg, documents_dir, tokenizer_dir, staging, workers, drops=drops)
        publish(staging, str(out_dir), "tokenize", result["splits"], last=(STATS_JSON, SHARDS_JSON))
        return result
    started = time.time()
    documents_dir, tokenizer_dir = Path(documents_dir), Path(tokenizer_dir)
    out_dir = Path(local_path(str(out_dir)))
    tokenizer = Tokenizer.load(tokenizer_dir)
    if not documents_dir.is_dir() or not _splits(documents_dir):
        raise UserError(
            f"no documents to tokenize: {documents_dir} has no <split>/<source>/part-*.parquet files. "
            f"Run `smelt curate CONFIG` first."
        )
    dtype = token_dtype(tokenizer.vocab_size)
    eos = tokenizer.eos_id
    bos = tokenizer.bos_id if cfg.bos else None
    meta = {
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "eos_id": eos,
        "bos_id": tokenizer.bos_id,
        "pad_id": tokenizer.pad_id,
        "bos": cfg.bos,
        "tokenizer_hash": tokenizer.hash,
        "checksummed": True,
    }
    _check_meta(out_dir, meta, tokenizer_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / SHARDS_JSON).unlink(missing_ok=True)  # rewritten when every shard is done
    write_json_atomic(out_dir / META_JSON, meta)

    layout: dict[str, dict[str, list[Path]]] = {}
    for split in _splits(documents_dir):
        for path in sorted((documents_dir / split).glob("*/part-*.parquet")):
            layout.setdefault(split, {}).setdefault(path.parent.name, []).append(path)
    opened = {
        path: open_part(path) for sources in layout.values() for files in sources.values() for path in files
    }
    total_docs = sum(f.metadata.num_rows for f in opened.values())
    total_bytes = sum(_text_bytes(f) for f in opened.values())
    batches = max(-(-total_docs // cfg.batch_docs), -(-total_bytes // cfg.batch_bytes))
    n_workers = workers if workers is not None else resolve_workers(cfg, batches, total_bytes)
    n_workers = max(1, n_workers)
    if n_workers > 1 or cfg.executor != "pool":
        pool = make_executor(
            cfg.executor,
            n_workers,
            address=cfg.ray_address,
            retries=cfg.retries,
            key="tokens.executor",
            initializer=_init_worker,
            initargs=(str(tokenizer_dir), 1),
            start="spawn",
        )
        n_workers = pool.workers
    else:  # one worker: encode in this process
        _WORKER["tokenizer"] = tokenizer
        pool = ProcessPool(1)

    manifest: dict[str, Any] = {"tokenizer_hash": tokenizer.hash, "dtype": dtype.name, "splits": {}}
    splits: dict[str, Any] = {}
    resumed = 0
    special_total: Counter[str] = Counter()
    dropped: list[dict[str, Any]] = []
    bar = progress(total=total_docs, desc="tokenize", unit="doc", unit_scale=True)
    try:
        for split, sources in layout.items():
            split_stats: dict[str, Any] = {}
            for source, files in sources.items():
                parts = [opened[p] for p in files]
                directory = out_dir / split / source
                keep = DocFilter(split, source, drops or [])
                key = _source_key(meta, cfg, files, parts) + (f"-drop-{keep.key()}" if keep else "")
                kept = _finished_shards(directory, key, dtype.itemsize) if directory.is_dir() else []
                skip = sum(m["documents"] for m in kept)
                resumed += len(kept)
                bar.update(skip)
                writer = ShardWriter(directory, dtype, cfg.shard_tokens, len(kept), skip, key)
                special = SpecialText(tokenizer)
                _encode_source(
                    pool,
                    n_workers,
                    _batches(files, parts, skip, cfg.batch_docs, cfg.batch_bytes, special, keep or None),
                    writer,
                    eos,
                    bos,
                    dtype,
                    bar,
                )
                writer.close()
                markers = kept + writer.markers
                counts = {k: sum(m[k] for m in markers) for k in ("documents", "tokens", "bytes")}
                overhead = counts["documents"] * (2 if cfg.bos else 1)
                text_tokens = counts["tokens"] - overhead
                split_stats[source] = {
                    **counts,
                    "bytes_per_token": round(counts["bytes"] / text_tokens, 4) if text_tokens > 0 else 0.0,
                    "shards": len(markers),
                    **special.row(),
                    **({"dropped": len(keep.dropped)} if keep.dropped else {}),
                }
                dropped.extend(keep.dropped)
                manifest["splits"].setdefault(split, {})[source] = {
                    **counts,
                    "shards": [{k: m[k] for k in m if k != "key"} for m in markers],
                }
            splits[split] = {"sources": split_stats, **_totals(split_stats.values(), cfg.bos)}
            special_total.update(_special_totals(split_stats.values()))
    finally:
        bar.close()
        pool.close()

    wall = time.time() - started
    totals = _totals(splits.values(), cfg.bos)
    stats = {
        "splits": splits,
        **totals,
        "dtype": dtype.name,
        "vocab_size": tokenizer.vocab_size,
        "tokenizer_hash": tokenizer.hash,
        "special_text": dict(sorted(special_total.items(), key=lambda kv: (-kv[1], kv[0]))),
    }
    if drops:
        write_dropped(out_dir, dropped)
        log(
            f"[tokenize] {len(dropped)} document(s) left out by the run's drop list (listed in {out_dir / 'dropped.jsonl'})"
        )
    write_json_atomic(out_dir / SHARDS_JSON, manifest)
    (out_dir / STATS_JSON).write_text(json.dumps(stats, indent=2) + "\n")
    result = {
        **stats,
        "workers": n_workers,
        "resumed_shards": resumed,
        "wall_time_s": round(wall, 3),
        "mb_per_s": round(totals["bytes"] / 1e6 / wall, 3) if wall > 0 else 0.0,
        "tokens_per_s": round(totals["tokens"] / wall, 1) if wall > 0 else 0.0,
    }
    log(
        f"[tokenize] {totals['documents']} documents -> {totals['tokens']} tokens "
        f"({totals['bytes_per_token']} bytes/token) in {wall:.1f} s, {result['mb_per_s']} MB/s, "
        f"{n_workers} worker(s)" + (f", {resumed} shard(s) kept from an earlier run" if resumed else "")
    )
    if special_total:
        found = ", ".join(f"{text} x{n:,}" for text, n in stats["special_text"].items())
        log(
            f"[tokenize] special-token text in the documents, encoded as ordinary text (special ids come "
            f"only from EOS/BOS, chat templates and FIM): {found}"
        )
    return result


def _text_bytes(part: pq.ParquetFile) -> int:
    """The text column's uncompressed size from the part's footer: about its UTF-8 bytes."""
    meta = part.metadata
    return sum(
        meta.row_group(g).column(c).total_uncompressed_size
        for g in range(meta.num_row_groups)
        for c in range(meta.num_columns)
        if meta.row_group(g).column(c).path_in_schema == "text"
    )


def _split_by_bytes(
    column: pa.Array, sizes: np.ndarray, batch_bytes: int
) -> Iterator[tuple[pa.Array, np.ndarray]]:
    start = 0
    while start < len(sizes):
        ends = np.cumsum(sizes[start:])
        stop = start + max(1, int(np.searchsorted(ends, batch_bytes, side="right")))
        part = column if (start, stop) == (0, len(sizes)) else column.slice(start, stop - start)
        # a slice would be pickled to the encoding process with its parent's whole buffers: copy it
        sliced = part is not column or part.offset > 0
        yield (pa.concat_arrays([part]) if sliced else part), sizes[start:stop]
        start = stop


def _encode_source(
    pool: TaskExecutor, workers: int, batches, writer: ShardWriter, eos, bos, dtype, bar
) -> None:
    """Submit batches to the pool with a bounded window; write results in submission order."""
    window: deque[tuple[Future, np.ndarray]] = deque()
    limit = 2 * workers + 1
    for column, sizes in batches:
        window.append((pool.submit(_encode_in_worker, column, eos, bos, dtype.name), sizes))
        while len(window) >= limit:
            _write(window.popleft(), writer, bar)
    while window:
        _write(window.popleft(), writer, bar)


def _write(item: tuple[Future, np.ndarray], writer: ShardWriter, bar) -> None:
    future, sizes = item
    flat, lengths = future.result()
    writer.write_batch(flat, lengths, sizes)
    bar.update(len(lengths))


def _special_totals(rows) -> Counter[str]:
    total: Counter[str] = Counter()
    for row in rows:
        total.update(row.get("special_text", {}))
    return total


def _totals(rows, bos: bool = False) -> dict[str, Any]:
    rows = list(rows)
    out = {key: sum(r[key] for r in rows) for key in ("documents", "tokens", "bytes", "shards")}
    text_tokens = out["tokens"] - out["documents"] * (2 if bos else 1)
    out["bytes_per_token"] = round(out["bytes"] / text_tokens, 4) if text_tokens > 0 else 0.0
    return out
