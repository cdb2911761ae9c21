"""The curate stage: raw files -> documents (parquet parts per split and source) + stats.

Order of steps (design section 5): read -> normalize -> [language id] -> [heuristic filters] ->
length filter -> unique ids -> exact dedup -> [MinHash near-dedup] -> [quality scoring] -> [PII] ->
[decontamination] -> split. Bracketed steps are slots for later work: insert a `DocStep` or
`CorpusStep` into `build_steps`; the leading per-document steps run inside the reader processes.

Memory: the kept documents of one run are held in memory between reading and writing (fine for the
quickstart corpus and for corpora of a few GB; streaming spills are future work).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from smelt.config import DataConfig
from smelt.data.checks import check_usable
from smelt.data.dedup.exact import ExactDedup
from smelt.data.document import Doc, Ledger
from smelt.data.executor import read_all
from smelt.data.filters import LengthFilter
from smelt.data.ids import UniqueIds
from smelt.data.normalize import Normalize
from smelt.data.readers import ReadSpec, check_readable
from smelt.data.sources import resolve_all
from smelt.data.split import TRAIN, VAL, Split
from smelt.data.stats import build_stats
from smelt.data.steps import Step, run_steps, split_at_first_corpus_step
from smelt.data.writer import clear_outputs, write_documents, write_quarantine
from smelt.manifest import write_json
from smelt.progress import log


def resolve_sources(cfg: DataConfig) -> dict[str, list[Path]]:
    """Files per source name, sorted. Raises UserError (naming the source, root and glob, and the fix) when
    a source's globs match no files, or when cfg.sources is empty. `root = "{stdlib}"` means the running
    interpreter's standard library directory, sysconfig.get_paths()["stdlib"]; there, site-packages is
    always excluded."""
    return {name: files for name, (_, files) in resolve_all(cfg).items()}


def build_steps(cfg: DataConfig) -> list[Step]:
    """The curation steps in design order; later issues insert theirs at the marked places."""
    steps: list[Step] = [
        Normalize(frozenset(s.name for s in cfg.sources if s.code)),
        # language id (DocStep) goes here, then heuristic quality filters (Gopher) as DocSteps.
        LengthFilter(cfg.min_chars, cfg.max_chars),
        UniqueIds(),
    ]
    if cfg.exact_dedup:
        steps.append(ExactDedup())
    # MinHash near-dedup, quality scoring, PII and decontamination go here.
    steps.append(Split(cfg.val_fraction))
    return steps


def curate(cfg: DataConfig, out_dir: Path) -> dict:
    """Run the curation; write documents; return the stats dict (also written to out_dir/stats.json)."""
    out_dir = Path(out_dir)
    resolved = resolve_all(cfg)
    tasks = []
    for index, source in enumerate(cfg.sources):
        root, files = resolved[source.name]
        spec = ReadSpec.of(source, index, root)
        check_readable(spec, files)
        tasks += [(spec, str(path)) for path in files]
        log(f"curate: source {source.name!r}: {len(files)} files under {root}")

    steps = build_steps(cfg)
    map_steps, corpus_steps = split_at_first_corpus_step(steps)
    docs, ledger = read_all(tasks, map_steps, cfg.workers)
    for source in cfg.sources:
        root, files = resolved[source.name]
        check_usable(source, root, len(files), ledger)

    kept = _run_corpus_steps(corpus_steps, docs, ledger)
    clear_outputs(out_dir, (TRAIN, VAL))
    write_documents(kept, out_dir, cfg.docs_per_part)
    write_quarantine(ledger.entries, [s.name for s in cfg.sources], out_dir)

    split_step = next(s for s in steps if isinstance(s, Split))
    extra: dict[str, Any] = {"val_forced": split_step.forced_val}
    stats = build_stats(
        [s.name for s in cfg.sources],
        {name: len(files) for name, (_, files) in resolved.items()},
        kept,
        ledger,
        [s.name for s in steps],
        extra,
    )
    write_json(out_dir / "stats.json", stats)
    log(
        f"curate: {stats['documents_in']} records in, {stats['documents_kept']} kept "
        f"(train {stats['splits'][TRAIN]['documents']}, val {stats['splits'][VAL]['documents']}), "
        f"{sum(stats['dropped'].values())} dropped, {sum(stats['quarantined'].values())} quarantined"
    )
    return stats


def _run_corpus_steps(steps: list[Step], docs: list[Doc], ledger: Ledger) -> list[Doc]:
    kept = list(run_steps(steps, docs, ledger))
    kept.sort(key=Doc.sort_key)
    return kept
