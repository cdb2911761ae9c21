"""Document ids must be unique within a source: they key splits, dedup logs and later stages."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from smelt.data.document import Doc, Ledger
from smelt.data.steps import CorpusStep


class UniqueIds(CorpusStep):
    """Quarantine (`duplicate_id`) every record whose (source, id) an earlier record in canonical order
    already used. Memory: a 16-byte digest and the first record's place per id."""

    name = "unique_id"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        seen: dict[bytes, tuple[str, int | None]] = {}
        for doc in docs:
            key = hashlib.blake2b(f"{doc.source}\x00{doc.id}".encode(), digest_size=16).digest()
            first = seen.get(key)
            if first is not None:
                ledger.quarantine(
                    doc.source,
                    doc.id,
                    doc.file,
                    doc.line,
                    "duplicate_id",
                    f"id also used by {first[0]}:{first[1]}; set id_field to a unique field",
                    kept_file=first[0],
                    kept_line=first[1],
                )
                continue
            seen[key] = (doc.file, doc.line)
            yield doc
