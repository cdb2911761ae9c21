"""Exact deduplication of normalized text across all sources."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from smelt.data.document import Doc, Ledger
from smelt.data.steps import CorpusStep


def text_digest(text: str) -> bytes:
    """128-bit blake2b of the UTF-8 text."""
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).digest()


class ExactDedup(CorpusStep):
    """Keep the first copy in canonical order (source order in the config, then id); drop the others
    with reason `exact_duplicate`, naming the kept copy. Memory: 16 bytes + the kept id per document."""

    name = "exact_dedup"

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        seen: dict[bytes, tuple[str, str]] = {}
        for doc in docs:
            digest = text_digest(doc.text)
            kept = seen.get(digest)
            if kept is not None:
                ledger.drop(doc, "exact_duplicate", step=self.name, kept_source=kept[0], kept_id=kept[1])
                continue
            seen[digest] = (doc.source, doc.id)
            doc.meta["text_hash"] = digest.hex()
            yield doc
