"""Curation throughput on the shared corpus: per step (one core) and end to end (N workers), peak memory.

    python bench/curate.py [--config configs/shared_corpus.toml] [--workers 2]

Per step: the documents of every source are read once, then each step runs alone over the survivors of
the step before it, timed in this process (one core); MB/s counts the characters entering the step as
UTF-8 bytes (of the sources the step applies to). The heuristic chain figure is the extracted text's
bytes over the summed time of the per-document steps but language id and the quality classifier. End to end: `smelt curate` in a subprocess with N workers (documents/s and MB/s of raw
input per worker, and the peak RSS of the largest process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_result

from smelt.config import load_config
from smelt.data.curate import build_steps
from smelt.data.executor import read_shard
from smelt.data.ingest.readers import ReadSpec
from smelt.data.ledger import Ledger
from smelt.data.sources import resolve_all
from smelt.data.split import Split, forced_units
from smelt.data.steps import DocStep
from smelt.data.work_units import plan_shards

REPO = Path(__file__).resolve().parent.parent


def per_step(cfg) -> dict[str, float]:
    resolved = resolve_all(cfg.data)
    specs = [
        (ReadSpec.of(s, i, resolved[s.name][0]), resolved[s.name][1]) for i, s in enumerate(cfg.data.sources)
    ]
    figures: dict[str, float] = {}
    docs = []
    raw_bytes = {}
    for spec, files in specs:
        started = time.perf_counter()
        for shard in plan_shards([(spec, files)], 1 << 40):
            docs += read_shard(shard, [])[0]
        seconds = time.perf_counter() - started
        raw_bytes[spec.name] = sum(f.stat().st_size for f in files)
        figures[f"read_{spec.name}_mb_per_s"] = round(raw_bytes[spec.name] / 1e6 / max(seconds, 1e-9), 2)
    figures["documents_read"] = len(docs)
    corpus_bytes = sum(len(d.text.encode("utf-8")) for d in docs)
    heuristic_s = 0.0
    ledger = Ledger()
    for step in build_steps(cfg.data):
        scope = getattr(step, "sources", None)  # a step scoped to some sources passes the others by
        size = sum(len(d.text.encode("utf-8")) for d in docs if scope is None or d.source in scope)
        if isinstance(step, Split):
            step.forced = forced_units({}, cfg.data.val_fraction, cfg.data.test_fraction, 0)
        started = time.perf_counter()
        docs = list(step.run(docs, ledger))
        seconds = time.perf_counter() - started
        figures[f"step_{step.name}_mb_per_s"] = round(size / 1e6 / max(seconds, 1e-9), 2)
        if isinstance(step, DocStep) and step.name not in ("quality", "language_id"):
            heuristic_s += seconds
    # The chain's rate: the corpus's text through every heuristic step, one core.
    figures["heuristic_chain_mb_per_s_per_core"] = round(corpus_bytes / 1e6 / max(heuristic_s, 1e-9), 2)
    return figures


def end_to_end(config: Path, workers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable, "-m", "smelt.cli", "curate", str(config),
            "--set", f"data.workers={workers}", "--set", f'run.dir="{tmp}"', "--force",
        ]  # fmt: skip
        started = time.time()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env={**os.environ, "SMELT_QUIET": "1"})
        seconds = time.time() - started
        cfg = load_config(config, [f'run.dir="{tmp}"'])
        stats = json.loads((cfg.run_dir / "documents" / "stats.json").read_text())
    raw = sum(f.stat().st_size for _, files in resolve_all(cfg.data).values() for f in files)
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {
        "workers": workers,
        "end_to_end_s": round(seconds, 1),
        "raw_mb": round(raw / 1e6, 1),
        "documents_in": stats["documents_in"],
        "documents_kept": stats["documents_kept"],
        "end_to_end_docs_per_s": round(stats["documents_in"] / seconds, 1),
        "end_to_end_mb_per_s_per_worker": round(raw / 1e6 / seconds / workers, 2),
        "peak_rss_mb": round(peak_mb, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default=str(REPO / "configs" / "shared_corpus.toml"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("SMELT_QUIET", "1")
    os.chdir(REPO)  # the config's roots are relative to the repository
    cfg = load_config(args.config)
    figures = {**end_to_end(Path(args.config), args.workers), **per_step(cfg)}
    write_result("curate", figures)


if __name__ == "__main__":
    main()
