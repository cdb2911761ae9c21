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
    """One document. `line` is the 1-based line (jsonl) or 0-based row (parquet); None for text files."""

    source: str
    source_index: int
    id: str
    text: str
    file: str
    line: int | None = None
    url: str | None = None
    split: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    def sort_key(self) -> tuple:
        """Canonical order: source order in the config, then id (file and line break id ties)."""
        return (self.source_index, self.id, self.file, -1 if self.line is None else self.line)


def preview(text: str) -> str:
    return text[:PREVIEW_CHARS]


@dataclass
class Ledger:
    """Quarantine/drop log entries and per-step counts; mergeable across processes."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    steps: Counter = field(default_factory=Counter)  # (step, "in"|"out") -> n
    records_in: Counter = field(default_factory=Counter)  # source -> records seen by the readers
    files: Counter = field(default_factory=Counter)  # (source, "ok"|"empty"|"unreadable") -> files
    n_quarantined: int = 0
    step: str = ""  # the step now running; DocStep.run sets it, so drop entries name their step

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
        self.n_quarantined += 1

    def drop(self, doc: Doc, reason: str, step: str = "", **extra: Any) -> None:
        """A readable document removed by a filter or by dedup; a preview, never the full text.
        `step` defaults to the step now running (`self.step`)."""
        entry = {
            "kind": DROPPED,
            "step": step or self.step,
            "id": doc.id,
            "source": doc.source,
            "file": doc.file,
            "line": doc.line,
            "reason": reason,
            "chars": len(doc.text),
            "preview": preview(doc.text),
        }
        entry.update(extra)
        self.entries.append(entry)

    def count(self, step: str, n_in: int, n_out: int) -> None:
        self.steps[(step, "in")] += n_in
        self.steps[(step, "out")] += n_out

    def merge(self, other: Ledger) -> None:
        self.entries.extend(other.entries)
        self.steps.update(other.steps)
        self.records_in.update(other.records_in)
        self.files.update(other.files)
        self.n_quarantined += other.n_quarantined
