"""The record that flows through curation, and the ledger that accounts for every record.

A `Doc` is one document with its provenance. A `Ledger` records every record that did not make it
(quarantined: unreadable input; dropped: removed by a filter or dedup) together with per-step
in/out counts, so that `documents_in == kept + dropped + quarantined` can be checked at the end.
Ledgers are filled in worker processes and merged in the parent.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

PREVIEW_CHARS = 200

QUARANTINED = "quarantined"
DROPPED = "dropped"


@dataclass(slots=True)
class Doc:
    """One document. `line` is the 1-based line (jsonl), 0-based row (parquet) or byte offset (warc);
    None for text files. Canonical order is source order in the config, then file order, then `line`."""

    source: str
    source_index: int
    id: str
    text: str
    file: str
    line: int | None = None
    url: str | None = None
    split: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    unit_hash: int = 0  # hash of the provenance unit (see data/split.py), set at the end of the map phase


def preview(text: str) -> str:
    return text[:PREVIEW_CHARS]


FILE_STATUS_RANK = {"empty": 0, "unreadable": 1, "ok": 2}
DROP_SAMPLE_DOCS = 100  # full text kept for the first N drops per (step, source), for `smelt inspect`
DROP_SAMPLE_CHARS = 20_000


@dataclass
class Ledger:
    """Quarantine/drop log entries and per-step, per-source counts; mergeable across processes.

    `steps` and `chars` count documents and characters entering and leaving each step, keyed by
    (step, source, "in"|"out"); `reasons` counts (kind, source, reason). `file_status` holds the status of
    each file read ("ok", "empty" or "unreadable"); a file read in several byte ranges merges to the best."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    steps: Counter = field(default_factory=Counter)
    chars: Counter = field(default_factory=Counter)
    reasons: Counter = field(default_factory=Counter)
    records_in: Counter = field(default_factory=Counter)  # source -> records seen by the readers
    file_status: dict[tuple[str, str], str] = field(default_factory=dict)  # (source, file) -> status
    samples: Counter = field(default_factory=Counter)  # (step, source) -> drops kept with full text
    notes: Counter = field(default_factory=Counter)  # (source, what) -> n, e.g. utf8_replaced_records
    step: str = ""  # the step now running; DocStep.run sets it, so drop entries name their step

    @property
    def n_quarantined(self) -> int:
        return sum(n for (kind, _, _), n in self.reasons.items() if kind == QUARANTINED)

    def files(self, source: str, status: str) -> int:
        return sum(1 for (s, _), st in self.file_status.items() if s == source and st == status)

    def set_file_status(self, source: str, file: str, status: str) -> None:
        old = self.file_status.get((source, file))
        if old is None or FILE_STATUS_RANK[status] > FILE_STATUS_RANK[old]:
            self.file_status[(source, file)] = status

    def quarantine(
        self, source: str, id: str, file: str, line: int | None, reason: str, detail: str = "", **extra: Any
    ) -> None:
        """A record that could not be read as a document (binary file, bad JSON, missing field...)."""
        entry = {
            "kind": QUARANTINED,
            "id": id,
            "source": source,
            "file": file,
            "line": line,
            "reason": reason,
        }
        if detail:
            entry["detail"] = detail
        entry.update(extra)
        self.entries.append(entry)
        self.reasons[(QUARANTINED, source, reason)] += 1

    def drop(self, doc: Doc, reason: str, step: str = "", **extra: Any) -> None:
        """A readable document removed by a filter or by dedup. The entry keeps a preview; the first
        DROP_SAMPLE_DOCS drops per step and source also keep the text, for reading what a step removes.
        `step` defaults to the step now running (`self.step`)."""
        step = step or self.step
        entry = {
            "kind": DROPPED,
            "step": step,
            "id": doc.id,
            "source": doc.source,
            "file": doc.file,
            "line": doc.line,
            "reason": reason,
            "chars": len(doc.text),
            "preview": preview(doc.text),
        }
        if doc.url:
            entry["url"] = doc.url
        if self.samples[(step, doc.source)] < DROP_SAMPLE_DOCS:
            self.samples[(step, doc.source)] += 1
            entry["text"] = doc.text[:DROP_SAMPLE_CHARS]
        entry.update(extra)
        self.entries.append(entry)
        self.reasons[(DROPPED, doc.source, reason)] += 1

    def count(self, step: str, source: str, kind: str, chars: int) -> None:
        self.steps[(step, source, kind)] += 1
        self.chars[(step, source, kind)] += chars

    def merge_counts(self, other: Ledger) -> None:
        """Merge everything but the entries (those go to disk per work shard)."""
        self.steps.update(other.steps)
        self.chars.update(other.chars)
        self.reasons.update(other.reasons)
        self.records_in.update(other.records_in)
        for (source, file), status in other.file_status.items():
            self.set_file_status(source, file, status)
        self.samples.update(other.samples)
        self.notes.update(other.notes)

    def merge(self, other: Ledger) -> None:
        self.merge_counts(other)
        self.entries.extend(other.entries)
