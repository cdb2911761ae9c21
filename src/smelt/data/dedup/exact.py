"""Exact deduplication of normalized text across all sources."""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, Iterator

from smelt.data.digests import DigestTable
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep


def text_digest(text: str) -> bytes:
    """128-bit blake2b of the UTF-8 text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class ExactDedup(CorpusStep):
    """Keep the first copy in canonical order (source order in the config, then id); drop the others
    with reason `exact_duplicate`, naming the kept copy. Memory: the digest table (at most 72 bytes per
    kept document) and the kept ids as UTF-8 (their length + 12 bytes each)."""

    name = "exact_dedup"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        table = DigestTable()
        sources: list[str] = []
        source_index: dict[str, int] = {}
        kept_sources = array("i")
        kept_ids, id_ends = bytearray(), array("q")
        for doc in docs:
            digest = text_digest(doc.text)
            first = table.first(digest, len(id_ends))
            if first is not None:
                start = id_ends[first - 1] if first else 0
                ledger.drop(
                    doc,
                    "exact_duplicate",
                    step=self.name,
                    kept_source=sources[kept_sources[first]],
                    kept_id=kept_ids[start : id_ends[first]].decode("utf-8", "surrogatepass"),
                )
                continue
            if doc.source not in source_index:
                source_index[doc.source] = len(sources)
                sources.append(doc.source)
            kept_sources.append(source_index[doc.source])
            kept_ids += doc.id.encode("utf-8", "surrogatepass")
            id_ends.append(len(kept_ids))
            doc.meta["text_hash"] = digest.hex()
            yield doc
