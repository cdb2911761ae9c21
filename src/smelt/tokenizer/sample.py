"""Deterministic byte-budgeted samples of the documents artifact (`<split>/<source>/part-*.parquet`)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from smelt.documents import document_parts, open_part
from smelt.errors import UserError

# The unit of the documents without a language label in a source whose other documents have one
# (ISO 639 "undetermined").
UNLABELLED = "und"
# A source or language drawn below this share of its target is flagged in the report.
DRAWN_TOLERANCE = 0.1
# When the budget binds, a longer document is drawn in pieces of about this many characters.
PIECE_CHARS = 4_096


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
    """Systematic sampling with unequal probabilities (Madow's method), one stream per source: with p_i
    the keep probability of the i-th document (or piece) of a source, its unit's, and C_i = p_1 + ... +
    p_i, it is kept when floor(C_i + u) > floor(C_(i-1) + u), u uniform in [0, 1) drawn from the seed and
    the source name. Each is kept with probability p_i, and the count kept from a source is C_n to
    within one, so the draws of its languages do not add up their independent luck."""

    def __init__(self, seed: int):
        self.seed = seed
        self.total: dict[str, float] = {}  # C so far, per source
        self.start: dict[str, float] = {}

    def _start(self, source: str) -> float:
        if source not in self.start:
            stream = np.random.PCG64([self.seed, zlib.crc32(source.encode("utf-8"))])
            self.start[source] = float(np.random.Generator(stream).random())
        return self.start[source]

    def pick(self, source: str, probability: np.ndarray) -> np.ndarray:
        """Indices of the kept rows among the source's next rows, whose keep probabilities are given."""
        before = self.total.get(source, 0.0)
        after = before + np.cumsum(np.minimum(probability, 1.0))
        if after.size:
            self.total[source] = float(after[-1])
        u = self._start(source)
        previous = np.concatenate(([before], after[:-1]))
        return np.flatnonzero((np.floor(after + u) > np.floor(previous + u)) & (probability > 0))


def _drawn_texts(
    column: pa.ChunkedArray, probability: np.ndarray, picker: _SystematicPicker, source: str
) -> Iterator[tuple[int, str]]:
    """(row, text) of what a row group gives the sample. A document longer than PIECE_CHARS counts as
    ceil(length / PIECE_CHARS) pieces, each drawn with the document's probability: a source of a few
    long documents is then drawn close to its target too. A document whose every piece is drawn is
    yielded whole; otherwise its drawn pieces, cut at line ends."""
    if probability.min() >= 1.0:
        yield from enumerate(column.to_pylist())
        return
    chars = pc.fill_null(pc.utf8_length(column), 0).to_numpy(zero_copy_only=False)
    pieces = np.maximum(1, -(-chars // PIECE_CHARS))
    chosen = picker.pick(source, np.repeat(probability, pieces))
    if chosen.size == 0:
        return
    row_of = np.repeat(np.arange(len(pieces)), pieces)
    first_piece = np.concatenate(([0], np.cumsum(pieces)[:-1]))
    rows = np.unique(row_of[chosen])
    texts = column.take(rows).to_pylist()
    by_row: dict[int, list[int]] = {}
    for piece in chosen.tolist():
        by_row.setdefault(int(row_of[piece]), []).append(piece - int(first_piece[row_of[piece]]))
    for row, text in zip(rows.tolist(), texts, strict=True):
        drawn = by_row[row]
        if len(drawn) == pieces[row]:
            yield row, text
            continue
        bounds = _piece_bounds(text or "", int(pieces[row]))
        for index in drawn:
            yield row, (text or "")[bounds[index] : bounds[index + 1]]


def _piece_bounds(text: str, pieces: int) -> list[int]:
    """pieces + 1 offsets cutting `text` into `pieces` even pieces, each cut moved to the next line end
    when there is one within half a piece, so that a cut rarely falls inside a word."""
    n = len(text)
    bounds = [0]
    for k in range(1, pieces):
        ideal = k * n // pieces
        line_end = text.find("\n", ideal, ideal + n // (2 * pieces))
        bounds.append(max(bounds[-1], line_end + 1 if line_end >= 0 else ideal))
    return [*bounds, n]


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
    size) and each document, or each piece of about PIECE_CHARS characters of a longer one, is kept
    with probability p = target / size of its unit, by systematic sampling over each source's pieces
    in order (`_SystematicPicker`): the count kept is the expected count to within one, so the bytes
    drawn stay close to the target, and the sample is the same on every run. A source takes no text that
    would carry it further past its target than it is short of it (an early source's luck never eats a
    later one's share), and texts that would overflow the budget are left out. Only row groups with
    nothing to draw (weight 0) are not read. `sample` (if given) is updated with the texts (documents
    or pieces) and bytes yielded, and its `units` with the bytes drawn per unit.
    """
    weighting = weighting or Weighting()
    parts = document_parts(documents_dir, split)
    files = [open_part(p) for p in parts]
    plan = plan_sample(parts, files, budget_bytes, weighting)
    sample = sample if sample is not None else Sample()
    sample.units = {unit: {**row, "drawn": 0} for unit, row in plan.units.items()}
    picker = _SystematicPicker(seed)
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
            probability = np.array([plan.keep.get(name, 0.0) for name in names])
            if not probability.any():
                continue  # nothing of this row group can be drawn: not read
            column = part.read_row_group(group, columns=["text"]).column("text")
            batch: list[str] = []
            for row, text in _drawn_texts(column, probability, picker, source):
                if not text:
                    continue
                size = len(text.encode("utf-8"))
                unit = sample.units[names[row]]
                if sample.bytes + size > budget_bytes or totals["drawn"] + size / 2 > totals["target"]:
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
