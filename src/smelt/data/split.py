"""Deterministic train/val assignment by a hash of the provenance unit (source, stable id)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from smelt.data.document import Doc, Ledger
from smelt.data.steps import CorpusStep

TRAIN, VAL = "train", "val"


def split_hash(source: str, doc_id: str) -> int:
    """A 64-bit hash of (source, id); the same id always lands in the same split."""
    blob = source.encode("utf-8") + b"\x00" + doc_id.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big")


def assign_split(source: str, doc_id: str, val_fraction: float) -> str:
    return VAL if split_hash(source, doc_id) / 2**64 < val_fraction else TRAIN


class Split(CorpusStep):
    """Set `doc.split`. When val_fraction > 0 but no document falls into val while train has >= 2,
    the train document with the smallest hash moves to val (recorded in `forced_val`).
    Holds the kept documents of the run in memory (needed for that rule)."""

    name = "split"

    def __init__(self, val_fraction: float):
        self.val_fraction = val_fraction
        self.forced_val: dict[str, str] | None = None

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        kept = list(docs)
        for doc in kept:
            doc.split = assign_split(doc.source, doc.id, self.val_fraction)
        if self.val_fraction > 0 and len(kept) >= 2 and all(doc.split == TRAIN for doc in kept):
            chosen = min(kept, key=lambda d: (split_hash(d.source, d.id), d.sort_key()))
            chosen.split = VAL
            self.forced_val = {"source": chosen.source, "id": chosen.id}
        yield from kept
