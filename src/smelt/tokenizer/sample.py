"""Deterministic byte-budgeted samples of the documents artifact (`<split>/<source>/part-*.parquet`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

from smelt.documents import document_parts, open_part
from smelt.errors import UserError


def _text_bytes_estimate(part: pq.ParquetFile) -> int:
    """Uncompressed size of the `text` column from the parquet footer: an upper bound on its UTF-8 bytes."""
    meta = part.metadata
    names = part.schema_arrow.names
    if "text" not in names:
        return 0
    column = names.index("text")
    return sum(meta.row_group(i).column(column).total_uncompressed_size for i in range(meta.num_row_groups))


@dataclass
class Sample:
    """Running totals of a sample being drawn."""

    documents: int = 0
    bytes: int = 0
    parts: list[str] = field(default_factory=list)
    # per unit ("source" or "source/lang"): size in the split, target bytes, bytes drawn
    units: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class Weighting:
    """How the byte budget is shared: temperature `alpha` on sizes, per source then per language.

    A source's share is proportional to weight(source) * size(source) ** source_alpha; within a source,
    a language's share to weight(lang) * size(lang) ** lang_alpha. alpha = 1 keeps natural proportions,
    alpha = 0 gives every unit the same share. Documents without a language (null or empty `lang`)
    make their source one unit. A unit never gets more than it holds: the excess goes to the others.
    """

    source_alpha: float = 1.0
    lang_alpha: float = 1.0
    source_weights: tuple[tuple[str, float], ...] = ()
    lang_weights: tuple[tuple[str, float], ...] = ()

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


def _lang_sizes(part: pq.ParquetFile) -> list[dict[str, int]] | None:
    """UTF-8 text bytes per language for each row group; None when the part has no language labels."""
    if "lang" not in part.schema_arrow.names:
        return None
    labels = part.read(columns=["lang"]).column(0)  # cheap: the text is read only when there are labels
    if labels.null_count == len(labels) or not pc.any(pc.not_equal(labels, "")).as_py():
        return None
    out: list[dict[str, int]] = []
    labelled = False
    for group in range(part.metadata.num_row_groups):
        table = part.read_row_group(group, columns=["text", "lang"])
        langs = table.column("lang").to_pylist()
        sizes = pc.fill_null(pc.binary_length(table.column("text")), 0).to_pylist()
        per: dict[str, int] = {}
        for lang, size in zip(langs, sizes, strict=True):
            key = lang or ""
            labelled = labelled or bool(key)
            per[key] = per.get(key, 0) + size
        out.append(per)
    return out if labelled else None


def plan_sample(
    parts: list[Path], files: list[pq.ParquetFile], budget_bytes: int, weighting: Weighting
) -> tuple[dict[str, float], list[list[dict[str, int]] | None], dict[str, dict[str, float]]]:
    """Keep probability per unit key, per-part language sizes, and the per-unit plan for the report."""
    source_sizes: dict[str, float] = {}
    part_langs: list[list[dict[str, int]] | None] = []
    lang_sizes: dict[str, dict[str, float]] = {}
    for path, part in zip(parts, files, strict=True):
        source = path.parent.name
        langs = _lang_sizes(part) if weighting.lang_alpha != 1.0 or weighting.lang_weights else None
        part_langs.append(langs)
        # exact text bytes where the languages were counted, else the footer's estimate
        size = sum(sum(per.values()) for per in langs) if langs else _text_bytes_estimate(part)
        source_sizes[source] = source_sizes.get(source, 0.0) + size
        for per in langs or []:
            for lang, size in per.items():
                bucket = lang_sizes.setdefault(source, {})
                bucket[lang] = bucket.get(lang, 0.0) + size
    total = sum(source_sizes.values())
    keep: dict[str, float] = {}
    plan: dict[str, dict[str, float]] = {}
    if total <= budget_bytes:
        for source, size in source_sizes.items():
            keep[source] = 1.0
            plan[source] = {"size": size, "target": size}
        return keep, part_langs, plan
    source_targets = _share(
        budget_bytes, source_sizes, dict(weighting.source_weights), weighting.source_alpha
    )
    for source, size in source_sizes.items():
        target = source_targets[source]
        keep[source] = min(1.0, target / size) if size else 0.0
        plan[source] = {"size": size, "target": round(target, 1)}
        langs = lang_sizes.get(source)
        if not langs:
            continue
        exact = sum(langs.values())
        lang_targets = _share(min(target, exact), langs, dict(weighting.lang_weights), weighting.lang_alpha)
        for lang, lang_size in langs.items():
            unit = f"{source}/{lang}" if lang else source
            keep[unit] = min(1.0, lang_targets[lang] / lang_size) if lang_size else 0.0
            plan[unit] = {"size": lang_size, "target": round(lang_targets[lang], 1)}
    return keep, part_langs, plan


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
    size) and each document is kept with probability target / size of its unit, decided by a generator
    seeded with (seed, part number, row group), so the sample is the same on every run and spreads over
    all sources; a row group with no kept document is not read at all. Documents that would overflow
    the budget are left out. `sample` (if given) is updated with the documents and bytes yielded.
    """
    weighting = weighting or Weighting()
    parts = document_parts(documents_dir, split)
    files = [open_part(p) for p in parts]
    keep, part_langs, plan = plan_sample(parts, files, budget_bytes, weighting)
    sample = sample if sample is not None else Sample()
    sample.units = {unit: {**row, "drawn": 0} for unit, row in plan.items()}
    for part_index, (path, part) in enumerate(zip(parts, files, strict=True)):
        source = path.parent.name
        sample.parts.append(path.relative_to(documents_dir).as_posix())
        langs = part_langs[part_index]
        for group in range(part.metadata.num_row_groups):
            rows = part.metadata.row_group(group).num_rows
            languages: list[str] | None = None
            if langs is not None:
                languages = [
                    lang or "" for lang in part.read_row_group(group, columns=["lang"]).column(0).to_pylist()
                ]
                probability = np.array(
                    [keep.get(f"{source}/{lang}" if lang else source, 0.0) for lang in languages]
                )
            else:
                probability = np.full(rows, keep.get(source, 0.0))
            if probability.min(initial=1.0) < 1.0:
                rng = np.random.Generator(np.random.PCG64([seed, part_index, group]))
                chosen = np.flatnonzero(rng.random(rows) < probability)
                if chosen.size == 0:
                    continue
                texts = part.read_row_group(group, columns=["text"]).column("text").take(chosen).to_pylist()
            else:
                chosen = np.arange(rows)
                texts = part.read_row_group(group, columns=["text"]).column("text").to_pylist()
            batch: list[str] = []
            for row, text in zip(chosen.tolist(), texts, strict=True):
                if not text:
                    continue
                size = len(text.encode("utf-8"))
                if sample.bytes + size > budget_bytes:
                    continue
                sample.bytes += size
                sample.documents += 1
                lang = languages[row] if languages is not None else ""
                unit = sample.units.get(f"{source}/{lang}" if lang else source)
                if unit is not None:
                    unit["drawn"] += size
                batch.append(text)
                if len(batch) >= batch_docs:
                    yield batch
                    batch = []
            if batch:
                yield batch
            if sample.bytes >= budget_bytes:
                return
