"""Deterministic byte-budgeted samples of the documents artifact (`<split>/<source>/part-*.parquet`)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from smelt.documents import document_parts, open_part
from smelt.errors import UserError

# The unit of the documents without a language label in a source whose other documents have one
# (ISO 639 "undetermined").
UNLABELLED = "und"
# A source or language drawn below this share of its target is flagged in the report.
DRAWN_TOLERANCE = 0.1


def _text_bytes_estimate(part: pq.ParquetFile) -> int:
    """The UTF-8 bytes of the `text` column, estimated from the parquet footer without reading the text:
    its uncompressed size less the 4-byte length stored with each value."""
    meta = part.metadata
    names = part.schema_arrow.names
    if "text" not in names:
        return 0
    column = names.index("text")
    groups = [meta.row_group(i) for i in range(meta.num_row_groups)]
    return sum(max(0, g.column(column).total_uncompressed_size - 4 * g.num_rows) for g in groups)


def _text_bytes(part: pq.ParquetFile) -> int:
    """The exact UTF-8 bytes of the `text` column (reads it)."""
    lengths = pc.binary_length(part.read(columns=["text"]).column("text"))
    return int(pc.sum(pc.fill_null(lengths, 0)).as_py() or 0)


@dataclass
class Sample:
    """Running totals of a sample being drawn."""

    documents: int = 0
    bytes: int = 0
    parts: list[str] = field(default_factory=list)
    # Per source ("code") and, in a source with language labels when languages are weighted, per
    # language ("web/en", "web/und" for its unlabelled documents): size in the split, target bytes, drawn.
    units: dict[str, dict[str, float]] = field(default_factory=dict)

    def short_units(self, tolerance: float = DRAWN_TOLERANCE) -> list[str]:
        """The units drawn more than `tolerance` below their target."""
        return [
            unit
            for unit, row in sorted(self.units.items())
            if row.get("target", 0) > 0 and row.get("drawn", 0) < (1 - tolerance) * row["target"]
        ]


@dataclass(frozen=True)
class Weighting:
    """How the byte budget is shared: temperature `alpha` on sizes, per source then per language.

    A source's share is proportional to weight(source) * size(source) ** source_alpha; within a source,
    a language's share to weight(lang) * size(lang) ** lang_alpha. alpha = 1 keeps natural proportions,
    alpha = 0 gives every unit the same share. Documents without a language (null or empty `lang`) in a
    source with labelled ones are one more unit of it (`und`); a source without labels is one unit. A
    unit never gets more than it holds: the excess goes to the others.
    """

    source_alpha: float = 1.0
    lang_alpha: float = 1.0
    source_weights: tuple[tuple[str, float], ...] = ()
    lang_weights: tuple[tuple[str, float], ...] = ()

    @property
    def by_language(self) -> bool:
        return self.lang_alpha != 1.0 or bool(self.lang_weights)

    @classmethod
    def from_config(cls, cfg) -> Weighting:
        def pairs(name: str) -> tuple[tuple[str, float], ...]:
            raw = getattr(cfg, name) or {}
            if not isinstance(raw, dict):
                raise UserError(f"tokenizer.{name} must be a table of name = weight, got {raw!r}.")
            out = []
            for key, value in sorted(raw.items()):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise UserError(
                        f"tokenizer.{name}.{key} = {value!r}: a weight must be a number >= 0 (0 drops it)."
                    )
                out.append((str(key), float(value)))
            return tuple(out)

        return cls(cfg.source_alpha, cfg.lang_alpha, pairs("source_weights"), pairs("lang_weights"))


def _share(
    budget: float, sizes: dict[str, float], weights: dict[str, float], alpha: float
) -> dict[str, float]:
    """Split `budget` over units by weight * size ** alpha, capping each unit at its size (water filling)."""
    targets = {u: 0.0 for u in sizes}
    open_units = sorted(u for u, s in sizes.items() if s > 0 and weights.get(u, 1.0) > 0)
    left = float(budget)
    while open_units and left > 1e-9:
        scores = {u: weights.get(u, 1.0) * sizes[u] ** alpha for u in open_units}
        total = sum(scores.values())
        full = [u for u in open_units if targets[u] + left * scores[u] / total >= sizes[u]]
        if not full:
            for u in open_units:
                targets[u] += left * scores[u] / total
            break
        for u in full:
            left -= sizes[u] - targets[u]
            targets[u] = float(sizes[u])
        open_units = [u for u in open_units if u not in full]
    return targets


def _whole(sizes: dict[str, float], weights: dict[str, float]) -> dict[str, float]:
    """Targets when everything fits the budget: every unit whole, but a weight of 0 still drops one."""
    return {u: (size if weights.get(u, 1.0) > 0 else 0.0) for u, size in sizes.items()}


def _lang_sizes(part: pq.ParquetFile) -> list[dict[str, int]] | None:
    """UTF-8 text bytes per language for each row group; None when the part has no language labels."""
    if "lang" not in part.schema_arrow.names:
        return None
    labels = part.read(columns=["lang"]).column(0)  # cheap: the text is read only when there are labels
    if labels.null_count == len(labels) or not pc.any(pc.not_equal(labels, "")).as_py():
        return None
    out: list[dict[str, int]] = []
    for group in range(part.metadata.num_row_groups):
        table = part.read_row_group(group, columns=["text", "lang"])
        langs = table.column("lang").to_pylist()
        sizes = pc.fill_null(pc.binary_length(table.column("text")), 0).to_pylist()
        per: dict[str, int] = {}
        for lang, size in zip(langs, sizes, strict=True):
            key = lang or UNLABELLED
            per[key] = per.get(key, 0) + size
        out.append(per)
    return out


class _SystematicPicker:
    """Keeps the i-th document (counting from 0 within its unit) when floor(p (i + 1) + u) > floor(p i + u):
    with start u uniform in [0, 1), every document is kept with probability p, and the first n documents
    of a unit always yield floor(p n) or floor(p n) + 1 kept ones."""

    def __init__(self, keep: dict[str, float], seed: int):
        self.keep = keep
        self.seed = seed
        self.seen: dict[str, int] = {}
        self.start: dict[str, float] = {}

    def _start(self, unit: str) -> float:
        if unit not in self.start:
            stream = np.random.PCG64([self.seed, zlib.crc32(unit.encode("utf-8"))])
            self.start[unit] = float(np.random.Generator(stream).random())
        return self.start[unit]

    def pick(self, names: list[str]) -> np.ndarray:
        """Indices of the kept rows among the next rows, whose units are `names`."""
        if not names:
            return np.zeros(0, dtype=np.int64)
        labels = np.array(names, dtype=object)
        kept = np.zeros(len(names), dtype=bool)
        for unit in dict.fromkeys(names):
            rows = np.flatnonzero(labels == unit) if len(set(names)) > 1 else np.arange(len(names))
            first = self.seen.get(unit, 0)
            self.seen[unit] = first + rows.size
            p = self.keep.get(unit, 0.0)
            if p >= 1.0:
                kept[rows] = True
            elif p > 0.0:
                index = np.arange(first, first + rows.size, dtype=np.float64)
                u = self._start(unit)
                kept[rows] = np.floor(p * (index + 1) + u) > np.floor(p * index + u)
        return np.flatnonzero(kept)


@dataclass
class SamplePlan:
    """Keep probability per unit, language sizes per part (None: no labels read), the report rows."""

    keep: dict[str, float]
    part_langs: list[list[dict[str, int]] | None]
    units: dict[str, dict[str, float]]
    lang_sources: frozenset[str]  # sources sampled per language

    def unit(self, source: str, lang: str | None) -> str:
        """The unit a document of `source` with label `lang` counts in."""
        return f"{source}/{lang or UNLABELLED}" if source in self.lang_sources else source


def plan_sample(
    parts: list[Path], files: list[pq.ParquetFile], budget_bytes: int, weighting: Weighting
) -> SamplePlan:
    """Share the budget over sources (and languages) and turn each unit's target into a keep probability.

    Sizes are exact where the text was read (parts with language labels, and every part when the split
    fits the budget) and the footer's estimate elsewhere."""
    part_langs = [_lang_sizes(part) if weighting.by_language else None for part in files]
    estimates = [
        0 if langs else _text_bytes_estimate(part) for part, langs in zip(files, part_langs, strict=True)
    ]
    labelled_bytes = sum(sum(per.values()) for langs in part_langs for per in langs or [])
    fits = labelled_bytes + sum(estimates) <= budget_bytes
    source_sizes: dict[str, float] = {}
    lang_sizes: dict[str, dict[str, float]] = {}
    unlabelled: dict[str, float] = {}
    for path, part, langs, estimate in zip(parts, files, part_langs, estimates, strict=True):
        source = path.parent.name
        if langs:
            bucket = lang_sizes.setdefault(source, {})
            for per in langs:
                for lang, size in per.items():
                    bucket[lang] = bucket.get(lang, 0.0) + size
            size = sum(sum(per.values()) for per in langs)
        else:
            # everything is read when the split fits: exact sizes cost one more read of at most the budget
            size = _text_bytes(part) if fits else estimate
            unlabelled[source] = unlabelled.get(source, 0.0) + size
        source_sizes[source] = source_sizes.get(source, 0.0) + size
    for source, size in unlabelled.items():
        if source in lang_sizes:
            lang_sizes[source][UNLABELLED] = lang_sizes[source].get(UNLABELLED, 0.0) + size

    source_weights, lang_weights = dict(weighting.source_weights), dict(weighting.lang_weights)
    source_targets = (
        _whole(source_sizes, source_weights)
        if fits
        else _share(budget_bytes, source_sizes, source_weights, weighting.source_alpha)
    )
    keep: dict[str, float] = {}
    units: dict[str, dict[str, float]] = {}
    for source, size in sorted(source_sizes.items()):
        target = source_targets[source]
        units[source] = {"size": size, "target": round(target, 1)}
        langs = lang_sizes.get(source)
        if not langs:
            keep[source] = min(1.0, target / size) if size else 0.0
            continue
        lang_targets = (
            _whole(langs, lang_weights)
            if fits
            else _share(min(target, size), langs, lang_weights, weighting.lang_alpha)
        )
        for lang, lang_size in sorted(langs.items()):
            unit = f"{source}/{lang}"
            keep[unit] = min(1.0, lang_targets[lang] / lang_size) if lang_size else 0.0
            units[unit] = {"size": lang_size, "target": round(lang_targets[lang], 1)}
        units[source]["target"] = round(sum(lang_targets.values()), 1)  # what its languages can reach
    return SamplePlan(keep, part_langs, units, frozenset(lang_sizes))


def sample_texts(
    documents_dir: Path,
    split: str,
    budget_bytes: int,
    seed: int,
    sample: Sample | None = None,
    batch_docs: int = 1024,
    weighting: Weighting | None = None,
) -> Iterator[list[str]]:
    """Yield batches of document texts: a seeded sample of `split` of at most `budget_bytes` UTF-8 bytes.

    When the split fits the budget, every document is used, in (source, part, row) order. Otherwise
    the budget is shared over sources and languages (see `Weighting`; the default is proportional to
    size) and each document is kept with probability p = target / size of its unit, by systematic
    sampling over the unit's documents in order (`_SystematicPicker`), so the count kept is p times the
    count seen to within one, the bytes drawn stay close to the target, and the sample is the same on
    every run; a row group with no kept document is not read at all. A unit takes no document that would
    carry it further past its target than it is short of it (an early unit's luck never eats a later
    one's share), and documents that would overflow the budget are left out. `sample` (if given) is
    updated with the documents and bytes yielded, and its `units` with the bytes drawn per unit.
    """
    weighting = weighting or Weighting()
    parts = document_parts(documents_dir, split)
    files = [open_part(p) for p in parts]
    plan = plan_sample(parts, files, budget_bytes, weighting)
    sample = sample if sample is not None else Sample()
    sample.units = {unit: {**row, "drawn": 0} for unit, row in plan.units.items()}
    picker = _SystematicPicker(plan.keep, seed)
    for part_index, (path, part) in enumerate(zip(parts, files, strict=True)):
        source = path.parent.name
        totals = sample.units[source]
        sample.parts.append(path.relative_to(documents_dir).as_posix())
        labelled = plan.part_langs[part_index] is not None
        for group in range(part.metadata.num_row_groups):
            rows = part.metadata.row_group(group).num_rows
            if labelled:
                langs = part.read_row_group(group, columns=["lang"]).column(0).to_pylist()
                names = [plan.unit(source, lang) for lang in langs]
            else:
                names = [plan.unit(source, None)] * rows
            chosen = picker.pick(names)
            if chosen.size == 0:
                continue
            column = part.read_row_group(group, columns=["text"]).column("text")
            texts = (column if chosen.size == rows else column.take(chosen)).to_pylist()
            batch: list[str] = []
            for row, text in zip(chosen.tolist(), texts, strict=True):
                if not text:
                    continue
                size = len(text.encode("utf-8"))
                unit = sample.units[names[row]]
                if sample.bytes + size > budget_bytes or unit["drawn"] + size / 2 > unit["target"]:
                    continue
                sample.bytes += size
                sample.documents += 1
                unit["drawn"] += size
                if unit is not totals:
                    totals["drawn"] += size
                batch.append(text)
                if len(batch) >= batch_docs:
                    yield batch
                    batch = []
            if batch:
                yield batch
            if sample.bytes >= budget_bytes:
                return
