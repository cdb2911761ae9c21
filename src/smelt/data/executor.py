"""Read and map files, serially or on a local process pool, with identical results.

Workers run the reader plus the leading per-document steps on chunks of files and send back the
surviving documents and their ledger. The parent sorts the documents into canonical order (source
order, then id), so the result does not depend on scheduling. Memory: the surviving documents of the
whole run are held in the parent (acceptable for this first version; a streaming merge of sorted
worker spills is the path to corpora larger than RAM).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import sys
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from smelt.data.document import Doc, Ledger
from smelt.data.readers import ReadSpec, read_file
from smelt.data.steps import DocStep, run_steps
from smelt.progress import log, progress

PARALLEL_MIN_FILES = 64
MAX_CHUNK_FILES = 32

Task = tuple[ReadSpec, str]


def _count_out(docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
    for doc in docs:
        ledger.steps[("read", "out")] += 1
        yield doc


def process_chunk(tasks: list[Task], steps: list[DocStep]) -> tuple[list[Doc], Ledger]:
    """Read each file and run the per-document steps on its records (also the worker entry point)."""
    ledger = Ledger()
    docs: list[Doc] = []
    for spec, path in tasks:
        docs.extend(run_steps(steps, _count_out(read_file(spec, Path(path), ledger), ledger), ledger))
    ledger.steps[("read", "in")] += sum(ledger.records_in.values())
    return docs, ledger


def start_method() -> str:
    """fork on Linux: works from any script, no `if __name__ == "__main__"` guard needed, and workers
    touch no lock the parent may hold (no tqdm, no logging, no torch); spawn elsewhere."""
    return "fork" if sys.platform == "linux" else "spawn"


def resolve_workers(workers: int) -> int:
    return (os.cpu_count() or 1) if workers == 0 else workers


def read_all(tasks: list[Task], steps: list[DocStep], workers: int) -> tuple[list[Doc], Ledger]:
    """Documents of all tasks in canonical order, and the merged ledger."""
    workers = resolve_workers(workers)
    if workers == 1 or len(tasks) < PARALLEL_MIN_FILES:
        results = _serial(tasks, steps)
    else:
        results = _parallel(tasks, steps, workers)
    docs: list[Doc] = []
    ledger = Ledger()
    for chunk_docs, chunk_ledger in results:
        docs.extend(chunk_docs)
        ledger.merge(chunk_ledger)
    docs.sort(key=Doc.sort_key)
    return docs, ledger


def _serial(tasks: list[Task], steps: list[DocStep]) -> Iterator[tuple[list[Doc], Ledger]]:
    with progress(total=len(tasks), desc="curate: read", unit="file") as bar:
        for task in tasks:
            yield process_chunk([task], steps)
            bar.update(1)


def _parallel(tasks: list[Task], steps: list[DocStep], workers: int) -> Iterator[tuple[list[Doc], Ledger]]:
    size = max(1, min(MAX_CHUNK_FILES, math.ceil(len(tasks) / (workers * 4))))
    chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
    workers = min(workers, len(chunks))
    log(f"curate: reading {len(tasks)} files with {workers} processes")
    context = multiprocessing.get_context(start_method())
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        # Submit (and so fork) before the progress bar exists, so no bar thread is alive at fork time.
        futures = {pool.submit(process_chunk, chunk, steps): len(chunk) for chunk in chunks}
        try:
            with progress(total=len(tasks), desc="curate: read", unit="file") as bar:
                for future in as_completed(futures):
                    yield future.result()
                    bar.update(futures[future])
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
