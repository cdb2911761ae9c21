"""Heuristic document filters. For now: length in characters (after normalization)."""

from __future__ import annotations

from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep


class LengthFilter(DocStep):
    """Drop documents with only whitespace (`empty`), fewer than `min_chars` characters (`too_short`)
    or more than `max_chars` (`too_long`). Whitespace-only documents are `empty` even when min_chars = 0."""

    name = "length_filter"

    def __init__(self, min_chars: int, max_chars: int):
        self.min_chars = min_chars
        self.max_chars = max_chars

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        n = len(doc.text)
        if not doc.text.strip():
            ledger.drop(doc, "empty")
        elif n < self.min_chars:
            ledger.drop(doc, "too_short", min_chars=self.min_chars)
        elif n > self.max_chars:
            ledger.drop(doc, "too_long", max_chars=self.max_chars)
        else:
            return doc
        return None
