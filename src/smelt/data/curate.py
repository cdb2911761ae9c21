"""The curate stage: raw files -> documents (parquet parts per split and source) + stats.

Order of steps (design section 5): read (+ extraction) -> normalize -> publishers' wrappers (Project
Gutenberg headers and licences, stripped before language id reads the text) -> language id -> heuristic filters
-> length filter -> quality scoring -> PII -> unique ids -> exact dedup -> MinHash near-dedup ->
boilerplate line removal -> quality top fraction -> decontamination -> split (dedup before the split,
so a near-duplicate cluster never straddles splits; decontamination last, on what would be trained on).

Execution is map/reduce over work shards (see data/work_units.py):
* map: the leading per-document steps run on each shard as a task on the executor (`data.executor`: a
  local process pool, or Ray tasks on a local or existing cluster); each shard writes its
  surviving documents and ledger under `<out>/_work/map/` and a completion marker, so a killed run
  resumes at the first unfinished shard and ends byte-identical to an uninterrupted run;
* reduce: the corpus steps (id uniqueness, dedup, split) stream over the shards' documents in canonical
  order and the writer streams parts out, in this process whatever the executor (each corpus step
  depends on the documents before it); memory holds one shard's documents per worker, one part per
  writer, and a 16-byte digest per document for the dedup and id checks.
Near-dedup plans between the two phases (dedup/near.py): MinHash signatures per map shard as executor
tasks, LSH buckets on disk within `data.near_dedup.memory_mb`, union-find clusters; the reduce step then
applies the decisions.
Quality scoring and PII run in the map phase, before dedup: both are per-document functions, and there
they cost one pass instead of a second one over the deduplicated stream.
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smelt.config import DataConfig, hash_json
from smelt.config.data import PLACEMENT_KEYS
from smelt.data.canary_step import plant_canaries
from smelt.data.checks import check_usable
from smelt.data.dedup.decontam import Decontaminate
from smelt.data.dedup.exact import ExactDedup
from smelt.data.dedup.lines import LineDedup, count_lines
from smelt.data.dedup.near import NearDedup, check_scope, params_of, plan_near_dedup
from smelt.data.executor import iter_entries, iter_shard_docs, read_column, run_map
from smelt.data.filters import FILTER_STEPS, LengthFilter
from smelt.data.filters.boilerplate import Boilerplate
from smelt.data.ids import UniqueIds
from smelt.data.ingest.readers import ReadSpec, check_readable
from smelt.data.langid import LanguageId, check_declared_languages
from smelt.data.ledger import Doc, Ledger
from smelt.data.normalize import Normalize
from smelt.data.pii import Pii
from smelt.data.plots import retention_svg
from smelt.data.quality import QualityScore, top_fraction_cutoff
from smelt.data.sources import resolve_all
from smelt.data.split import SPLITS, TEST, TRAIN, VAL, Split, check_units, forced_units
from smelt.data.stats import (
    KeptStats,
    build_stats,
    loss_warnings,
    removed_chars,
    split_warnings,
    warning_text,
)
from smelt.data.steps import CorpusStep, Step, run_steps, split_at_first_corpus_step
from smelt.data.work_units import WorkShard, plan_shards, read_plan, write_plan
from smelt.data.writer import QUARANTINE_DIR, PartWriter, clear_outputs, write_quarantine
from smelt.executors import TaskExecutor, make_executor, start_method
from smelt.manifest import write_json
from smelt.progress import log, progress
from smelt.storage import is_remote, local_path, publish, staging_dir

WORK_DIR = "_work"
MIN_SHARD_BYTES = 1 << 20
# What a curate run replaces in a documents directory: a store's copy loses the files of these that the
# new run did not write.
OWNED_OUTPUTS = (*SPLITS, QUARANTINE_DIR)


def resolve_sources(cfg: DataConfig) -> dict[str, list[Path]]:
    """Files per source name, sorted. Raises UserError (naming the source, root and glob, and the fix) when
    a source's globs match no files, or when cfg.sources is empty. `root = "{stdlib}"` means the running
    interpreter's standard library directory, sysconfig.get_paths()["stdlib"]; there, site-packages is
    always excluded."""
    return {name: files for name, (_, files) in resolve_all(cfg).items()}


def build_steps(cfg: DataConfig) -> list[Step]:
    """The curation steps in design order; per-document steps first (they run in the map phase)."""
    steps: list[Step | None] = [
        Normalize.from_config(cfg),
        Boilerplate.from_config(cfg),
        LanguageId.from_config(cfg),
        *(step.from_config(cfg) for step in FILTER_STEPS),
        LengthFilter(cfg.min_chars, cfg.max_chars),
        QualityScore.from_config(cfg),
        Pii.from_config(cfg),
        UniqueIds(),
        ExactDedup() if cfg.exact_dedup else None,
        NearDedup() if cfg.near_dedup.enabled else None,
        LineDedup(cfg.line_dedup.max_docs, cfg.line_dedup.min_chars) if cfg.line_dedup.enabled else None,
        QualityTopFraction() if cfg.quality.model and cfg.quality.top_fraction < 1 else None,
        Decontaminate.from_config(cfg.decontam),
        Split(cfg.val_fraction, cfg.test_fraction),
    ]
    return [step for step in steps if step is not None]


class QualityTopFraction(CorpusStep):
    """Keep the top `data.quality.top_fraction` of each scored source by quality score. The per-source
    cutoffs come from the scores of all documents leaving the map phase (before dedup), set by `curate`."""

    name = "quality_top_fraction"

    def __init__(self) -> None:
        self.cutoffs: dict[str, float] = {}

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        for doc in docs:
            cutoff = self.cutoffs.get(doc.source)
            score = doc.meta.get("quality")
            if cutoff is not None and score is not None and score < cutoff:
                ledger.drop(doc, "quality.top_fraction", step=self.name, score=score, cutoff=cutoff)
                continue
            yield doc


def _fingerprint(cfg: DataConfig, resolved: dict[str, tuple[Path, list[Path]]]) -> str:
    """What a resumed run must share with the interrupted one: the config and the input files."""
    config = asdict(cfg)
    for key in ("workers", *PLACEMENT_KEYS):  # where tasks run: a resumed run may change them
        config.pop(key)
    files = []
    for _, paths in resolved.values():
        for path in paths:
            stat = path.stat()
            files.append([str(path), stat.st_size, stat.st_mtime_ns])
    return hash_json({"config": config, "files": files})


def _plan(
    cfg: DataConfig, specs: list[tuple[ReadSpec, list[Path]]], work: Path, fingerprint: str, workers: int
):
    plan_path = work / "plan.json"
    shards = read_plan(plan_path, fingerprint)
    if shards is not None:
        return shards
    shutil.rmtree(work, ignore_errors=True)
    total = sum(path.stat().st_size for _, files in specs for path in files)
    # Enough shards to keep every worker busy, never more bytes per shard than configured.
    target = min(cfg.shard_bytes, max(MIN_SHARD_BYTES, total // (4 * workers)))
    shards = plan_shards(specs, target)
    write_plan(plan_path, fingerprint, shards)
    return shards


def curate(cfg: DataConfig, out_dir: Path | str) -> dict:
    """Run the curation; write documents; return the stats dict (also written to out_dir/stats.json).
    `out_dir` may be a file:// URL; the map tasks write under it, so on a cluster it is a path every node
    shares. A store's URL (s3://...) gets the documents from a staging directory under `data.url_cache`
    (where the map tasks write), published when the run is done (storage.py)."""
    if is_remote(str(out_dir)):
        staging = staging_dir(cfg.url_cache, str(out_dir))
        log(f"curate: writing under {staging}, then to {out_dir}")
        stats = curate(cfg, staging)
        publish(staging, str(out_dir), "curate", OWNED_OUTPUTS, last=("stats.json",))
        return stats
    out_dir = Path(local_path(str(out_dir)))
    check_units(cfg)
    check_declared_languages(cfg)
    check_scope(cfg.near_dedup)
    resolved = resolve_all(cfg)
    specs = []
    for index, source in enumerate(cfg.sources):
        root, files = resolved[source.name]
        spec = ReadSpec.of(source, index, root)
        check_readable(spec, files)
        specs.append((spec, files))
        log(f"curate: source {source.name!r}: {len(files)} files under {root}")

    steps = build_steps(cfg)
    map_steps, corpus_steps = split_at_first_corpus_step(steps)
    work = out_dir / WORK_DIR
    with _executor(cfg) as executor:
        shards = _plan(cfg, specs, work, _fingerprint(cfg, resolved), executor.workers)
        return _curate(cfg, out_dir, resolved, steps, map_steps, corpus_steps, shards, executor)


def _executor(cfg: DataConfig) -> TaskExecutor:
    return make_executor(
        cfg.executor,
        cfg.workers,
        address=cfg.ray_address,
        retries=cfg.retries,
        key="data.executor",
    )


def _curate(
    cfg: DataConfig,
    out_dir: Path,
    resolved: dict[str, tuple[Path, list[Path]]],
    steps: list[Step],
    map_steps: list,
    corpus_steps: list[Step],
    shards: list[WorkShard],
    executor: TaskExecutor,
) -> dict:
    work = out_dir / WORK_DIR
    map_dir = work / "map"
    ledger = run_map(shards, map_steps, map_dir, executor)

    def entries_of(name: str) -> list[dict[str, Any]]:
        return [e for s in shards if s.spec.name == name for e in iter_entries(s, map_dir)]

    for source in cfg.sources:
        root, files = resolved[source.name]
        check_usable(source, root, len(files), ledger, entries_of)

    split_step = next(s for s in corpus_steps if isinstance(s, Split))
    extra: dict[str, Any] = {}
    for step in corpus_steps:
        if isinstance(step, QualityTopFraction):
            step.cutoffs = _quality_cutoffs(shards, map_dir, cfg.quality.top_fraction)
        if isinstance(step, NearDedup):
            log(f"curate: near-dedup: {params_of(cfg.near_dedup).describe()}")
            parquets = [(s.spec.name, map_dir / f"{s.key}.parquet") for s in shards]
            step.plan = plan_near_dedup(cfg, parquets, work, executor.workers, start_method(), executor)
            extra["near_dedup"] = step.plan.report
            log(f"curate: near-dedup: {step.plan.report}")
        if isinstance(step, LineDedup):
            step.set_counts(*count_lines([map_dir / f"{s.key}.parquet" for s in shards], step.min_chars))
            extra["line_dedup"] = {"boilerplate_lines": len(step.boilerplate)}
    executor.close()  # the reduce runs in this process: the workers' memory is not needed any more
    units = _docs_per_unit(shards, map_dir)
    split_step.forced = forced_units(units, cfg.val_fraction, cfg.test_fraction, cfg.min_split_docs)
    clear_outputs(out_dir, SPLITS)
    n_docs = sum(sum(c.values()) for c in units.values())
    del units  # an entry per unit, by default per document: not to be held through the reduce
    kept, reduce_entries = _reduce(shards, map_dir, corpus_steps, ledger, out_dir, cfg.docs_per_part, n_docs)
    planted = plant_canaries(cfg, out_dir)
    if planted is not None:
        extra["canaries"] = planted
    removed: dict[str, Counter] = {}
    for source in cfg.sources:
        mine = [e for e in reduce_entries if e["source"] == source.name]
        entries = [*entries_of(source.name), *mine]
        removed[source.name] = removed_chars(entries)
        write_quarantine(entries, source.name, out_dir)

    forced = {
        source: {split: sum(1 for s in moves.values() if s == split) for split in (VAL, TEST)}
        for source, moves in split_step.forced.items()
    }
    extra["units_forced"] = forced
    for step in corpus_steps:
        if isinstance(step, Decontaminate):
            extra["decontamination"] = step.report()
            write_json(out_dir / "decontamination.json", step.report())
    names = [s.name for s in cfg.sources]
    stats = build_stats(
        names, {n: len(resolved[n][1]) for n in names}, ledger, kept, [s.name for s in steps], extra
    )
    split_units = {
        s.name: _unit_label(s.split_unit, ReadSpec.of(s, 0, Path(".")).split_unit) for s in cfg.sources
    }
    stats["warnings"] = loss_warnings(stats, removed) + split_warnings(
        stats, kept, split_units, cfg.val_fraction, cfg.test_fraction
    )
    write_json(out_dir / "stats.json", stats)
    (out_dir / "retention.svg").write_text(retention_svg(stats), encoding="utf-8")
    shutil.rmtree(work)
    splits = ", ".join(
        f"{k} {stats['splits'][k]['documents']}" for k in SPLITS if stats["splits"][k]["documents"]
    )
    log(
        f"curate: {stats['documents_in']} records in, {stats['documents_kept']} kept ({splits}), "
        f"{sum(stats['dropped'].values())} dropped, {sum(stats['quarantined'].values())} quarantined; "
        f"identity in = kept + dropped + quarantined holds"
    )
    for warning in stats["warnings"]:
        text = (
            warning["message"] if warning.get("kind") == "no_train" else warning_text(warning, str(out_dir))
        )
        log(f"curate: warning: {text}")
    return stats


def _unit_label(configured: str, effective: str) -> str:
    """A source's split_unit for a warning: `'id' (the file)` where a text file's parts stay together."""
    return repr(configured) if configured == effective else f"{configured!r} (the {effective})"


def _quality_cutoffs(shards: list[WorkShard], map_dir: Path, fraction: float) -> dict[str, float]:
    scores: dict[str, list[float]] = {}
    for shard in shards:
        values = [v for v in read_column(shard, map_dir, "quality") if v is not None]
        scores.setdefault(shard.spec.name, []).extend(values)
    return {name: top_fraction_cutoff(values, fraction) for name, values in scores.items() if values}


def _docs_per_unit(shards: list[WorkShard], map_dir: Path) -> dict[str, Counter]:
    units: dict[str, Counter] = {}
    for shard in shards:
        units.setdefault(shard.spec.name, Counter()).update(read_column(shard, map_dir, "unit_hash"))
    return units


def _reduce(
    shards: list[WorkShard],
    map_dir: Path,
    steps: list[Step],
    ledger: Ledger,
    out_dir: Path,
    docs_per_part: int,
    n_docs: int,
) -> tuple[KeptStats, list[dict[str, Any]]]:
    """Stream the map outputs through the corpus steps into the parts; return the kept totals and the
    entries the corpus steps logged (their counts are merged into `ledger`)."""
    reduce_ledger = Ledger()
    writer = PartWriter(out_dir, docs_per_part)
    kept = KeptStats()
    with progress(total=n_docs, desc="curate: reduce", unit="doc") as bar:

        def stream() -> Iterator[Doc]:
            for shard in shards:
                count = 0
                for doc in iter_shard_docs(shard, map_dir):
                    count += 1
                    yield doc
                bar.update(count)

        for doc in run_steps(steps, stream(), reduce_ledger):
            writer.add(doc)
            kept.add(doc)
        writer.flush_all()
    ledger.merge_counts(reduce_ledger)
    return kept, reduce_ledger.entries


__all__ = ["TRAIN", "VAL", "build_steps", "curate", "resolve_sources"]
