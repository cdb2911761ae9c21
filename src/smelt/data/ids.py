"""Document ids must be unique within a source: they key splits, dedup logs and later stages."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator

from smelt.data.digests import DigestTable
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep


class UniqueIds(CorpusStep):
    """Quarantine (`duplicate_id`) every record whose (source, id) an earlier record in canonical order
    already used. Memory: the digest table (at most 72 bytes per id) and the first record's place (12)."""

    name = "unique_id"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        table = DigestTable()
        files: list[str] = []
        file_index: dict[str, int] = {}
        first_files, first_lines = array("i"), array("q")
        for doc in docs:
            key = hashlib.blake2b(f"{doc.source}\x00{doc.id}".encode(), digest_size=16).digest()
            first = table.first(key, len(first_lines))
            if first is not None:
                file = files[first_files[first]]
                line = first_lines[first] if first_lines[first] >= 0 else None
                ledger.quarantine(
                    doc.source,
                    doc.id,
                    doc.file,
                    doc.line,
                    "duplicate_id",
                    f"id also used by {file}:{line}; set id_field to a unique field",
                    kept_file=file,
                    kept_line=line,
                )
                continue
            if doc.file not in file_index:
                file_index[doc.file] = len(files)
                files.append(doc.file)
            first_files.append(file_index[doc.file])
            first_lines.append(-1 if doc.line is None else doc.line)
            yield doc
