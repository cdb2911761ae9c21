"""`smelt inspect documents`: read what a curate run kept, dropped and quarantined, with reasons and scores.

Reading a hundred kept and a hundred dropped documents per step is how curation rules are checked;
this prints them from the documents artifact alone (parts, `quarantine/<source>.jsonl`).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from smelt.data.ledger import DROPPED, QUARANTINED
from smelt.data.writer import QUARANTINE_DIR
from smelt.errors import UserError
from smelt.jsonl import json_objects

ENTRY_FIELDS = {"kind", "step", "id", "source", "file", "line", "reason", "chars", "preview", "text", "url"}


def documents_dir(path: Path) -> Path:
    """Accept a documents directory or a run directory holding one."""
    for candidate in (path, path / "documents"):
        if (candidate / "stats.json").is_file():
            return candidate
    raise UserError(
        f"{path} is not a curate output (no stats.json in it or in {path / 'documents'}). Pass the documents "
        f"directory of a run, e.g. runs/quickstart/documents, or run `smelt curate CONFIG` first."
    )


def _entries(directory: Path, source: str | None) -> Iterator[dict[str, Any]]:
    for path in sorted((directory / QUARANTINE_DIR).glob("*.jsonl")):
        if source and path.stem != source:
            continue
        with open(path, encoding="utf-8") as handle:
            for _, entry in json_objects(handle, path, "quarantine file", "Run `smelt curate --force`."):
                yield entry


def _clip(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[:chars] + f"\n[... {len(text) - chars:,} more characters]"


def _header(n: int, fields: dict[str, Any]) -> str:
    parts = [f"{k}={v}" for k, v in fields.items() if v not in (None, "")]
    return f"--- [{n}] " + "  ".join(parts)


def dropped_or_quarantined(
    path: Path,
    kind: str,
    step: str | None = None,
    reason: str | None = None,
    source: str | None = None,
    n: int = 20,
    chars: int = 2000,
) -> str:
    """The first `n` dropped (by `step`) or quarantined records in canonical order, as text."""
    directory = documents_dir(path)
    stats = json.loads((directory / "stats.json").read_text())
    if step and kind == DROPPED:
        steps = [s["step"] for s in stats["steps"]]
        if step not in steps:
            raise UserError(
                f"--dropped-by {step!r}: this run has no such step. Its steps: {', '.join(steps)}."
            )
    out = []
    for entry in _entries(directory, source):
        if entry["kind"] != kind or (step and entry.get("step") != step):
            continue
        if reason and entry["reason"] != reason:
            continue
        scores = {k: v for k, v in entry.items() if k not in ENTRY_FIELDS}
        where = entry["file"] + (f":{entry['line']}" if entry.get("line") is not None else "")
        head = _header(
            len(out) + 1,
            {"source": entry["source"], "id": entry["id"], "at": where, "url": entry.get("url")},
        )
        body = entry.get("text") or entry.get("preview") or ""
        note = "" if "text" in entry else " (preview)"
        lines = [head, f"    {entry.get('step') or kind}: {entry['reason']}{note}"]
        if scores:
            lines.append("    " + json.dumps(scores, ensure_ascii=False, sort_keys=True))
        lines.append(_clip(body, chars))
        out.append("\n".join(lines))
        if len(out) >= n:
            break
    if not out:
        what = f"dropped by {step!r}" if kind == DROPPED and step else kind
        return f"no documents {what}" + (f" with reason {reason!r}" if reason else "") + "."
    return "\n\n".join(out)


def kept(
    path: Path,
    source: str | None = None,
    split: str | None = None,
    n: int = 20,
    chars: int = 2000,
    seed: int = 0,
) -> str:
    """A seeded random sample of `n` kept documents with their meta (filter scores, language...)."""
    directory = documents_dir(path)
    parts = sorted(p for p in directory.glob("*/*/part-*.parquet") if p.parent.parent.name != QUARANTINE_DIR)
    parts = [
        p
        for p in parts
        if (not source or p.parent.name == source) and (not split or p.parent.parent.name == split)
    ]
    if not parts:
        raise UserError(f"no document parts in {directory} for source={source!r} split={split!r}.")
    index = [(p, row) for p in parts for row in range(pq.ParquetFile(p).metadata.num_rows)]
    chosen = sorted(random.Random(seed).sample(index, min(n, len(index))))
    out = []
    for i, (part, row) in enumerate(chosen, start=1):
        table = pq.ParquetFile(part).read()
        record = {name: table.column(name)[row].as_py() for name in table.column_names}
        meta = json.loads(record["meta"])
        where = meta.pop("file", "") + (f":{meta['line']}" if meta.get("line") is not None else "")
        meta.pop("line", None)
        head = _header(
            i, {"split": part.parent.parent.name, "source": record["source"], "id": record["id"], "at": where}
        )
        out.append(
            "\n".join(
                [
                    head,
                    "    " + json.dumps(meta, ensure_ascii=False, sort_keys=True),
                    _clip(record["text"], chars),
                ]
            )
        )
    return "\n\n".join(out)


__all__ = ["DROPPED", "QUARANTINED", "documents_dir", "dropped_or_quarantined", "kept"]
