"""The map phase of curation: read each work shard and run the per-document steps, one task per shard on
the stage's executor (`smelt.executors`: the local process pool, or Ray tasks).

Each shard's surviving documents go to `<work>/map/<key>.parquet`, its ledger entries to
`<key>.entries.jsonl` and its counts to `<key>.counts.json`; a `<key>.done` marker written last makes
the shard complete. A rerun after a crash (even SIGKILL) skips complete shards, and because a shard's
output depends only on its input and the steps, the resumed run's output is byte-identical to an
uninterrupted one. Memory per worker is bounded by one shard's documents.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.data.ingest.readers import read_file
from smelt.data.ledger import Doc, Ledger
from smelt.data.read_spec import DECLARED_LANG, ReadSpec
from smelt.data.split import split_hash, unit_key
from smelt.data.steps import DocStep, run_steps
from smelt.data.work_units import WorkShard
from smelt.executors import TaskExecutor
from smelt.jsonl import json_objects
from smelt.progress import log, progress
from smelt.storage import task_local

MAP_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("file", pa.string(), nullable=False),
        pa.field("line", pa.int64()),
        pa.field("url", pa.string()),
        pa.field("meta", pa.string(), nullable=False),
        pa.field("unit_hash", pa.uint64(), nullable=False),
        pa.field("quality", pa.float64()),
    ]
)
READ_BATCH = 2048


def _count_read(docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
    for doc in docs:
        ledger.count("read", doc.source, "out", len(doc.text))
        yield doc


def _declare(docs: Iterable[Doc], spec: ReadSpec) -> Iterator[Doc]:
    """Documents with `meta.declared_lang` from the source's declared_language (a code, file or dir),
    set before the steps so that the per-language filter rules see it."""
    for doc in docs:
        lang = spec.declared_for(doc.file)
        if lang and DECLARED_LANG not in doc.meta:
            doc.meta[DECLARED_LANG] = lang
        yield doc


def read_shard(shard: WorkShard, steps: list[DocStep]) -> tuple[list[Doc], Ledger]:
    """Read one shard and run the per-document steps on its records; documents in canonical order."""
    ledger = Ledger()
    docs: list[Doc] = []
    spec = shard.spec
    for path in shard.files:
        # a file in a store is copied to this task's temporary directory while it is read
        with task_local(spec.root, path) as (root, local):
            here = spec if root == spec.root else dataclasses.replace(spec, root=root)
            records = read_file(here, local, ledger, shard.start, shard.end, shard.first_line)
            if spec.declared_language:
                records = _declare(records, spec)
            for doc in run_steps(steps, _count_read(records, ledger), ledger):
                doc.unit_hash = split_hash(doc.source, unit_key(doc, spec.split_unit))
                docs.append(doc)
    ledger.steps[("read", spec.name, "in")] += ledger.records_in[spec.name]
    return docs, ledger


def map_shard(shard: WorkShard, steps: list[DocStep], map_dir: str) -> Ledger:
    """The worker entry point: process one shard, write its outputs and marker, return its counts."""
    docs, ledger = read_shard(shard, steps)
    base = Path(map_dir) / shard.key
    _write_atomic(base.with_suffix(".parquet"), lambda tmp: pq.write_table(_map_table(docs), tmp))
    lines = "".join(json.dumps(e, sort_keys=True, ensure_ascii=False) + "\n" for e in ledger.entries)
    _write_atomic(base.with_suffix(".entries.jsonl"), lambda tmp: tmp.write_text(lines, encoding="utf-8"))
    counts = json.dumps(counts_to_json(ledger), sort_keys=True)
    _write_atomic(base.with_suffix(".counts.json"), lambda tmp: tmp.write_text(counts))
    _write_atomic(base.with_suffix(".done"), lambda tmp: tmp.write_text(""))
    ledger.entries = []
    return ledger


def _write_atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def _map_table(docs: list[Doc]) -> pa.Table:
    return pa.table(
        {
            "id": [d.id for d in docs],
            "text": [d.text for d in docs],
            "file": [d.file for d in docs],
            "line": [d.line for d in docs],
            "url": [d.url for d in docs],
            "meta": [json.dumps(d.meta, sort_keys=True, ensure_ascii=False) for d in docs],
            "unit_hash": pa.array([d.unit_hash for d in docs], pa.uint64()),
            "quality": [d.meta.get("quality") for d in docs],
        },
        schema=MAP_SCHEMA,
    )


def iter_shard_docs(shard: WorkShard, map_dir: Path) -> Iterator[Doc]:
    """The documents a completed shard left, in canonical order."""
    spec = shard.spec
    parquet = pq.ParquetFile(map_dir / f"{shard.key}.parquet")
    for batch in parquet.iter_batches(batch_size=READ_BATCH):
        rows = batch.to_pydict()
        for i in range(batch.num_rows):
            doc = Doc(
                spec.name,
                spec.index,
                rows["id"][i],
                rows["text"][i],
                rows["file"][i],
                rows["line"][i],
                rows["url"][i],
                meta=json.loads(rows["meta"][i]),
            )
            doc.unit_hash = rows["unit_hash"][i]
            yield doc


def read_column(shard: WorkShard, map_dir: Path, column: str) -> list[Any]:
    return pq.read_table(map_dir / f"{shard.key}.parquet", columns=[column]).column(column).to_pylist()


def iter_entries(shard: WorkShard, map_dir: Path) -> Iterator[dict[str, Any]]:
    path = map_dir / f"{shard.key}.entries.jsonl"
    with open(path, encoding="utf-8") as handle:
        for _, entry in json_objects(
            handle, path, "curation's ledger entries", "Run `smelt curate --force`."
        ):
            yield entry


def counts_to_json(ledger: Ledger) -> dict[str, Any]:
    return {
        "steps": [[*k, v] for k, v in ledger.steps.items()],
        "chars": [[*k, v] for k, v in ledger.chars.items()],
        "reasons": [[*k, v] for k, v in ledger.reasons.items()],
        "records_in": dict(ledger.records_in),
        "file_status": [[*k, v] for k, v in ledger.file_status.items()],
        "samples": [[*k, v] for k, v in ledger.samples.items()],
        "notes": [[*k, v] for k, v in ledger.notes.items()],
    }


def counts_from_json(data: dict[str, Any]) -> Ledger:
    ledger = Ledger()
    for name in ("steps", "chars", "reasons", "samples", "notes"):
        getattr(ledger, name).update({tuple(row[:-1]): row[-1] for row in data[name]})
    ledger.records_in = Counter(data["records_in"])
    for source, file, status in data["file_status"]:
        ledger.set_file_status(source, file, status)
    return ledger


def run_map(shards: list[WorkShard], steps: list[DocStep], map_dir: Path, executor: TaskExecutor) -> Ledger:
    """Process every shard that has no completion marker yet on the executor; return the merged counts of
    all shards (the markers' counts for shards done by an earlier run)."""
    map_dir.mkdir(parents=True, exist_ok=True)
    done = {s.key for s in shards if (map_dir / f"{s.key}.done").exists()}
    todo = [s for s in shards if s.key not in done]
    if done:
        log(f"curate: resuming: {len(done)} of {len(shards)} work shards already done")
    total = Ledger()
    for shard in shards:
        if shard.key in done:
            total.merge_counts(
                counts_from_json(json.loads((map_dir / f"{shard.key}.counts.json").read_text()))
            )
    if not todo:
        return total
    if executor.workers > 1:
        log(f"curate: {len(todo)} work shards on {executor.workers} {_workers_noun(executor)}")
    # Start the tasks (and so fork the pool) before the progress bar exists: no bar thread at fork time.
    results = executor.run(map_shard, [(shard,) for shard in todo], shared=(steps, str(map_dir)))
    with progress(total=sum(s.bytes for s in todo), desc="curate: map", unit="B", unit_scale=True) as bar:
        for index, ledger in results:
            total.merge_counts(ledger)
            bar.update(todo[index].bytes)
    return total


def _workers_noun(executor: TaskExecutor) -> str:
    return "Ray CPUs" if executor.name == "ray" else "processes"
