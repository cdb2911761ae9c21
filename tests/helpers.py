"""Helpers shared by tests of several stages."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_documents(root: Path, split: str, source: str, texts: list[str], part: int = 0) -> Path:
    """Write one documents part with the curate stage's columns (the documents artifact contract)."""
    directory = root / split / source
    directory.mkdir(parents=True, exist_ok=True)
    n = len(texts)
    table = pa.table(
        {
            "id": [f"{source}:{part}:{i}" for i in range(n)],
            "text": texts,
            "source": [source] * n,
            "url": [""] * n,
            "lang": [""] * n,
            "meta": ["{}"] * n,
        }
    )
    path = directory / f"part-{part:05d}.parquet"
    pq.write_table(table, path)
    return path
