"""Write the documents artifact: parquet parts per split and source, and the quarantine logs.

Layout: `<out>/<split>/<source>/part-NNNNN.parquet` and `<out>/quarantine/<source>.jsonl`. Parts hold
documents in canonical order and contain no timestamps, so reruns are byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from itertools import groupby
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.data.document import Doc

SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("lang", pa.string()),
        pa.field("meta", pa.string(), nullable=False),
    ]
)
QUARANTINE_DIR = "quarantine"
COMPRESSION = "zstd"


def clear_outputs(out_dir: Path, splits: Iterable[str]) -> None:
    """Remove what a previous curate run wrote here (only the directories this stage owns)."""
    for name in [*splits, QUARANTINE_DIR]:
        shutil.rmtree(out_dir / name, ignore_errors=True)
    (out_dir / "stats.json").unlink(missing_ok=True)


def doc_meta(doc: Doc) -> str:
    meta = {"file": doc.file, "line": doc.line, "chars": len(doc.text), **doc.meta}
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def write_part(docs: list[Doc], path: Path) -> None:
    table = pa.table(
        {
            "id": [d.id for d in docs],
            "text": [d.text for d in docs],
            "source": [d.source for d in docs],
            "url": [d.url for d in docs],
            "lang": [d.meta.get("lang") for d in docs],
            "meta": [doc_meta(d) for d in docs],
        },
        schema=SCHEMA,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression=COMPRESSION)
    os.replace(tmp, path)


def write_documents(docs: list[Doc], out_dir: Path, docs_per_part: int) -> list[Path]:
    """Write docs (already in canonical order, `split` set) as parts; return the part paths."""
    paths = []
    ordered = sorted(docs, key=lambda d: (d.split, d.source_index))  # stable: keeps id order within
    for (split, _), group in groupby(ordered, key=lambda d: (d.split, d.source_index)):
        group_docs = list(group)
        source = group_docs[0].source
        for part, start in enumerate(range(0, len(group_docs), docs_per_part)):
            path = out_dir / split / source / f"part-{part:05d}.parquet"
            write_part(group_docs[start : start + docs_per_part], path)
            paths.append(path)
    return paths


def _entry_key(entry: dict[str, Any]) -> tuple:
    line = entry.get("line")
    return (entry["file"], -1 if line is None else line, entry["id"], entry["reason"])


def write_quarantine(entries: list[dict[str, Any]], sources: list[str], out_dir: Path) -> None:
    """One `<source>.jsonl` per source (possibly empty), entries sorted by file, line and id."""
    directory = out_dir / QUARANTINE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    by_source: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    for entry in entries:
        by_source[entry["source"]].append(entry)
    for name, items in by_source.items():
        items.sort(key=_entry_key)
        lines = [json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in items]
        tmp = directory / f"{name}.jsonl.tmp"
        tmp.write_text("".join(lines), encoding="utf-8")
        os.replace(tmp, directory / f"{name}.jsonl")
