"""Deterministic byte-budgeted samples of the documents artifact (`<split>/<source>/part-*.parquet`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from smelt.errors import UserError


def document_parts(documents_dir: Path, split: str) -> list[Path]:
    """The parquet parts of one split, in (source, part) order."""
    return sorted((Path(documents_dir) / split).glob("*/part-*.parquet"))


def _text_bytes_estimate(part: pq.ParquetFile) -> int:
    """Uncompressed size of the `text` column from the parquet footer: an upper bound on its UTF-8 bytes."""
    meta = part.metadata
    names = part.schema_arrow.names
    if "text" not in names:
        return 0
    column = names.index("text")
    return sum(meta.row_group(i).column(column).total_uncompressed_size for i in range(meta.num_row_groups))


def _open(path: Path) -> pq.ParquetFile:
    try:
        part = pq.ParquetFile(path)
    except Exception as exc:
        raise UserError(
            f"documents part {path} cannot be read as parquet ({exc}). Re-run `smelt curate --force`."
        ) from exc
    if "text" not in part.schema_arrow.names:
        raise UserError(
            f"documents part {path} has no `text` column (columns: {', '.join(part.schema_arrow.names)}). "
            f"Re-run `smelt curate --force`."
        )
    return part


@dataclass
class Sample:
    """Running totals of a sample being drawn."""

    documents: int = 0
    bytes: int = 0
    parts: list[str] = field(default_factory=list)


def sample_texts(
    documents_dir: Path,
    split: str,
    budget_bytes: int,
    seed: int,
    sample: Sample | None = None,
    batch_docs: int = 1024,
) -> Iterator[list[str]]:
    """Yield batches of document texts: a seeded sample of `split` of at most `budget_bytes` UTF-8 bytes.

    When the split fits the budget, every document is used, in (source, part, row) order. Otherwise
    each document is kept with probability budget / size, decided by a generator seeded with
    (seed, part number, row group), so the sample is the same on every run and spreads over all sources;
    a row group with no kept document is not read at all. Documents that would overflow the budget are
    left out. `sample` (if given) is updated with the documents and bytes yielded.
    """
    parts = document_parts(documents_dir, split)
    files = [_open(p) for p in parts]
    total = sum(_text_bytes_estimate(f) for f in files)
    keep = 1.0 if total <= budget_bytes else budget_bytes / total
    sample = sample if sample is not None else Sample()
    for part_index, (path, part) in enumerate(zip(parts, files, strict=True)):
        sample.parts.append(path.relative_to(documents_dir).as_posix())
        for group in range(part.metadata.num_row_groups):
            rows = part.metadata.row_group(group).num_rows
            if keep < 1.0:
                rng = np.random.Generator(np.random.PCG64([seed, part_index, group]))
                chosen = np.flatnonzero(rng.random(rows) < keep)
                if chosen.size == 0:
                    continue
                texts = part.read_row_group(group, columns=["text"]).column("text").take(chosen).to_pylist()
            else:
                texts = part.read_row_group(group, columns=["text"]).column("text").to_pylist()
            batch: list[str] = []
            for text in texts:
                if not text:
                    continue
                size = len(text.encode("utf-8"))
                if sample.bytes + size > budget_bytes:
                    continue
                sample.bytes += size
                sample.documents += 1
                batch.append(text)
                if len(batch) >= batch_docs:
                    yield batch
                    batch = []
            if batch:
                yield batch
            if sample.bytes >= budget_bytes:
                return
