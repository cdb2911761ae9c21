"""Document ids must be unique within a source: they key splits, dedup logs and later stages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from smelt.data.document import Doc, Ledger
from smelt.data.steps import CorpusStep


class UniqueIds(CorpusStep):
    """Quarantine (`duplicate_id`) every later record whose (source, id) was already seen.

    Relies on canonical order, so the record kept is the one with the smallest (file, line)."""

    name = "unique_id"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        previous: Doc | None = None
        for doc in docs:
            if previous is not None and (doc.source, doc.id) == (previous.source, previous.id):
                ledger.quarantine(
                    doc.source,
                    doc.id,
                    doc.file,
                    doc.line,
                    "duplicate_id",
                    f"id also used by {previous.file}:{previous.line}; set id_field to a unique field",
                    kept_file=previous.file,
                    kept_line=previous.line,
                )
                continue
            previous = doc
            yield doc
