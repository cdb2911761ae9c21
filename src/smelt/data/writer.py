"""Write the documents artifact: parquet parts per split and source, and the quarantine logs.

Layout: `<out>/<split>/<source>/part-NNNNN.parquet` and `<out>/quarantine/<source>.jsonl`. Parts hold
documents in canonical order and contain no timestamps, so reruns are byte-identical.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.data.ledger import DROP_SAMPLE_DOCS, Doc

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


class PartWriter:
    """Streams documents (in canonical order, `split` set) into parts of `docs_per_part` documents per
    split and source; only one source's buffers are open at a time, so memory is bounded by a part."""

    def __init__(self, out_dir: Path, docs_per_part: int):
        self.out_dir = out_dir
        self.docs_per_part = docs_per_part
        self.buffers: dict[tuple[str, str], list[Doc]] = {}
        self.parts: dict[tuple[str, str], int] = {}
        self.paths: list[Path] = []
        self.source: str | None = None

    def add(self, doc: Doc) -> None:
        if doc.source != self.source:
            self.flush_all()
            self.source = doc.source
        key = (doc.split, doc.source)
        buffer = self.buffers.setdefault(key, [])
        buffer.append(doc)
        if len(buffer) >= self.docs_per_part:
            self._flush(key)

    def _flush(self, key: tuple[str, str]) -> None:
        docs = self.buffers.pop(key, [])
        if not docs:
            return
        part = self.parts.get(key, 0)
        self.parts[key] = part + 1
        path = self.out_dir / key[0] / key[1] / f"part-{part:05d}.parquet"
        write_part(docs, path)
        self.paths.append(path)

    def flush_all(self) -> None:
        for key in sorted(self.buffers):
            self._flush(key)


def write_documents(docs: Iterable[Doc], out_dir: Path, docs_per_part: int) -> list[Path]:
    """Write docs (in canonical order, `split` set) as parts; return the part paths."""
    writer = PartWriter(out_dir, docs_per_part)
    for doc in docs:
        writer.add(doc)
    writer.flush_all()
    return writer.paths


def _entry_key(entry: dict[str, Any]) -> tuple:
    line = entry.get("line")
    return (entry["file"], -1 if line is None else line, entry["id"], entry["reason"])


def write_quarantine(entries: Iterable[dict[str, Any]], source: str, out_dir: Path) -> None:
    """`quarantine/<source>.jsonl` (possibly empty): every quarantined and dropped record of the source,
    sorted by file, line and id. Only the first DROP_SAMPLE_DOCS drops per step keep their full text."""
    directory = out_dir / QUARANTINE_DIR
    directory.mkdir(parents=True, exist_ok=True)
    items = sorted(entries, key=_entry_key)
    with_text: Counter = Counter()
    for entry in items:
        if "text" in entry:
            with_text[entry.get("step")] += 1
            if with_text[entry.get("step")] > DROP_SAMPLE_DOCS:
                del entry["text"]
    tmp = directory / f"{source}.jsonl.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        for entry in items:
            handle.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
    os.replace(tmp, directory / f"{source}.jsonl")
