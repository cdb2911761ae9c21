"""Reading the documents artifact (`documents/<split>/<source>/part-NNNNN.parquet`), for every stage
that consumes it: the tokenizer, tokenize and evaluation."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from smelt.errors import UserError


def document_parts(documents_dir: Path, split: str, source: str = "*") -> list[Path]:
    """The parquet parts of one split (optionally one source), in (source, part) order."""
    return sorted((Path(documents_dir) / split).glob(f"{source}/part-*.parquet"))


def open_part(path: Path) -> pq.ParquetFile:
    """Open one documents part, or say which file is broken and how to rebuild it."""
    try:
        part = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(
            f"documents part {path} cannot be read as parquet ({exc}). Re-run `smelt curate --force`."
        ) from exc
    if "text" not in part.schema_arrow.names:
        raise UserError(
            f"documents part {path} has no `text` column (columns: {', '.join(part.schema_arrow.names)}). "
            f"Re-run `smelt curate --force`."
        )
    return part


def read_texts(documents_dir: Path, split: str, source: str) -> list[str]:
    """Every text of one split and source, in document order."""
    texts: list[str] = []
    for path in document_parts(documents_dir, split, source):
        texts.extend(open_part(path).read(columns=["text"]).column("text").to_pylist())
    return texts
