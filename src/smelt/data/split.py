"""Deterministic train/val/test assignment by a hash of each document's provenance unit.

Related documents (pages of one site, files of one repository, chapters of one book) must never
straddle splits, or validation loss measures memorization. Each source names its unit
(`split_unit`): the document id, its URL, its URL's domain, its file, the top directory of its file
(a repository or book folder in a text tree), a record field (`field:repo`), or `document`: each
document on its own, the parts of a long text file too (`id` keeps those together, as `file` does).
A unit lands whole in one split, so a source or a language that is a single unit can land wholly in
validation; curate warns about every source and language left with no training documents. The unit is hashed
with the source name; the hash alone picks the split, so a unit lands in the same split in every run
and whatever else is in the corpus.

A per-source minimum (`min_split_docs`) moves the train units with the smallest hashes into val (then
test) when the hash draw leaves them short; that decision is taken from the unit hashes of all the
documents that reach the split step, before any document is written, so the step itself stays a pure
function of each document.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from smelt.config import DataConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import CorpusStep
from smelt.errors import ConfigError

TRAIN, VAL, TEST = "train", "val", "test"
SPLITS = (TRAIN, VAL, TEST)
UNITS = ("id", "document", "url", "domain", "file", "dir")


def check_units(cfg: DataConfig) -> None:
    for i, source in enumerate(cfg.sources):
        unit = source.split_unit
        if unit in UNITS or (unit.startswith("field:") and len(unit) > len("field:")):
            continue
        raise ConfigError(
            f"data.sources[{i}].split_unit = {unit!r} (source {source.name!r}) is not a provenance unit. "
            f"Use one of {', '.join(UNITS)}, or field:<record field> (e.g. field:repo)."
        )


def unit_key(doc: Doc, unit: str) -> str:
    """The provenance unit of a document; falls back to the id when the document lacks it (no URL...)."""
    if unit in ("id", "document"):
        return doc.id
    if unit == "url":
        return doc.url or doc.id
    if unit == "domain":
        host = urlsplit(doc.url).hostname if doc.url else None
        return host.removeprefix("www.") if host else doc.id
    if unit == "file":
        return doc.file
    if unit == "dir":
        head, sep, _ = doc.file.partition("/")
        return head if sep else doc.file
    value = doc.meta.get(unit.removeprefix("field:"))
    return str(value) if value not in (None, "") else doc.id


def split_hash(source: str, unit: str) -> int:
    """A 64-bit hash of (source, unit); the same unit always lands in the same split."""
    blob = source.encode("utf-8") + b"\x00" + unit.encode("utf-8")
    return int.from_bytes(hashlib.blake2b(blob, digest_size=8).digest(), "big")


def assign_split(unit_hash: int, val_fraction: float, test_fraction: float = 0.0) -> str:
    u = unit_hash / 2**64
    if u < val_fraction:
        return VAL
    return TEST if u < val_fraction + test_fraction else TRAIN


def forced_units(
    docs_per_unit: dict[str, Counter], val_fraction: float, test_fraction: float, min_docs: int
) -> dict[str, dict[int, str]]:
    """Per source, the train units moved to val or test to reach `min_docs` documents in each split
    whose fraction is above zero. Units move in ascending hash order, and train always keeps at least
    one unit. `docs_per_unit[source][unit_hash]` counts the documents of each unit."""
    forced: dict[str, dict[int, str]] = {}
    for source, units in docs_per_unit.items():
        have = Counter()
        train_units = []
        for h in sorted(units):
            split = assign_split(h, val_fraction, test_fraction)
            have[split] += units[h]
            if split == TRAIN:
                train_units.append(h)
        moves: dict[int, str] = {}
        for split, fraction in ((VAL, val_fraction), (TEST, test_fraction)):
            while fraction > 0 and have[split] < min_docs and len(train_units) > 1:
                h = train_units.pop(0)
                moves[h] = split
                have[split] += units[h]
                have[TRAIN] -= units[h]
        if moves:
            forced[source] = moves
    return forced


class Split(CorpusStep):
    """Set `doc.split` from the document's unit hash (`doc.unit_hash`), or from the forced moves."""

    name = "split"

    def __init__(
        self, val_fraction: float, test_fraction: float = 0.0, forced: dict[str, dict[int, str]] | None = None
    ):
        self.val_fraction = val_fraction
        self.test_fraction = test_fraction
        self.forced = forced or {}

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        for doc in docs:
            moved = self.forced.get(doc.source)
            split = moved.get(doc.unit_hash) if moved else None
            doc.split = split or assign_split(doc.unit_hash, self.val_fraction, self.test_fraction)
            yield doc
