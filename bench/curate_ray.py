"""`smelt curate` on the process pool and on Ray, on this machine: throughput, memory, task overhead.

The documents are bench/curate_scale.py's (passages of the shared corpus with ~30% planted
near-duplicates, as JSONL files of 20,000 records in a temporary folder). The same config runs twice
in a subprocess, `data.executor = "pool"` and then `"ray"` (a local Ray started by the run with
`data.workers` CPUs), every default step plus MinHash near-dedup. Reported per executor: wall time,
documents/s, CPU seconds and peak summed RSS of the whole process tree (sampled every half second
from /proc: for Ray that includes its GCS, raylet and worker processes), the driver's own peak RSS,
and whether the two runs' documents directories are byte-identical. Then the scheduling overhead:
the wall time per no-op task when 2,000 of them go through each executor with `--workers` workers
at once, and the time to start a local Ray.

The machine is shared: the load average before and after each run is recorded beside the figures.

    nice -n 10 python bench/curate_ray.py [--docs 100000] [--workers 2] [--data /tmp/shards]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402
from curate_scale import TreeRss, write_jsonl  # noqa: E402
from dedup_speed import PER_SHARD, generate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOOP_TASKS = 2000
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class TreeUsage(TreeRss):
    """TreeRss plus CPU seconds of the tree: the last utime + stime seen of every process in it."""

    def __init__(self, pid: int, every: float = 0.5):
        self.cpu_ticks: dict[int, int] = {}
        super().__init__(pid, every)

    def _tree(self) -> list[int]:
        pids = super()._tree()
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self.cpu_ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime
        return pids

    def cpu_s(self) -> float:
        return sum(self.cpu_ticks.values()) / CLOCK_TICKS


def config_text(root: Path, run_dir: Path, workers: int, executor: str) -> str:
    return f"""[run]
name = "curate_ray"
dir = "{run_dir}"

[data]
workers = {workers}
executor = "{executor}"

[data.near_dedup]
enabled = true

[[data.sources]]
name = "web"
format = "jsonl"
root = "{root}"
include = ["*.jsonl"]
id_field = "id"
"""


def tree_digest(directory: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != "manifest.json"):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_curate(executor: str, jsonl: Path, tmp: Path, workers: int) -> dict[str, object]:
    run_dir = tmp / f"runs-{executor}"
    config = tmp / f"curate_{executor}.toml"
    config.write_text(config_text(jsonl, run_dir, workers, executor))
    command = [sys.executable, "-m", "smelt.cli", "curate", str(config), "--force"]
    load_before = os.getloadavg()[0]
    start = time.time()
    log = tmp / f"curate_{executor}.log"
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
        sampler = TreeUsage(process.pid)
        code = process.wait()
    seconds = time.time() - start
    tree_peak = sampler.close()
    if code != 0:
        sys.exit(f"smelt curate ({executor}) failed ({code}):\n{log.read_text()[-4000:]}")
    documents = run_dir / "curate_ray" / "documents"
    stats = json.loads((documents / "stats.json").read_text())
    tasks = next((line.split()[1] for line in log.read_text().splitlines() if "work shards on" in line), "1")
    docs = stats["documents_in"]
    return {
        f"{executor}_wall_s": round(seconds, 1),
        f"{executor}_docs_per_s": round(docs / seconds, 1),
        f"{executor}_cpu_s": round(sampler.cpu_s(), 1),
        f"{executor}_peak_rss_mb_process_tree": round(tree_peak, 1),
        f"{executor}_peak_rss_mb_driver": round(sampler.main_peak(0, seconds), 1),
        f"{executor}_map_tasks": int(tasks),
        f"{executor}_load_average_before": round(load_before, 2),
        f"{executor}_load_average_after": round(os.getloadavg()[0], 2),
        "documents": docs,
        "documents_kept": stats["documents_kept"],
        f"{executor}_documents_sha256": tree_digest(documents),
    }


def noop(value: int) -> int:
    return value


def task_overhead(workers: int) -> dict[str, object]:
    """Wall time per no-op task with `workers` running at once, after the workers have started."""
    import ray

    from smelt.executors import ProcessPool, RayExecutor

    figures: dict[str, object] = {}
    pool = ProcessPool(workers)
    list(pool.run(noop, [(i,) for i in range(workers)]))  # start the processes
    start = time.perf_counter()
    assert len(list(pool.run(noop, [(i,) for i in range(NOOP_TASKS)]))) == NOOP_TASKS
    figures["pool_noop_task_ms"] = round((time.perf_counter() - start) / NOOP_TASKS * 1e3, 3)
    pool.close()
    start = time.perf_counter()
    ray_executor = RayExecutor(workers)
    figures["ray_start_s"] = round(time.perf_counter() - start, 1)
    list(ray_executor.run(noop, [(i,) for i in range(4 * workers)]))  # start the workers
    start = time.perf_counter()
    assert len(list(ray_executor.run(noop, [(i,) for i in range(NOOP_TASKS)]))) == NOOP_TASKS
    figures["ray_noop_task_ms"] = round((time.perf_counter() - start) / NOOP_TASKS * 1e3, 3)
    ray_executor.close()
    assert not ray.is_initialized()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", default="", help="a folder of parquet shards from an earlier run (kept)")
    parser.add_argument("--name", default="curate_ray")
    args = parser.parse_args()
    figures: dict[str, object] = {"workers": args.workers}
    with tempfile.TemporaryDirectory(prefix="smelt-curate-ray-") as tmp_name:
        tmp = Path(tmp_name)
        data = Path(args.data) if args.data else tmp / "shards"
        data.mkdir(parents=True, exist_ok=True)
        have = len(list(data.glob("shard-*.parquet"))) * PER_SHARD
        if have == 0:
            generate(args.docs, data)
        elif have < args.docs:
            sys.exit(f"{data} holds {have} documents, fewer than --docs {args.docs}")
        shards = sorted(data.glob("shard-*.parquet"))[: -(-args.docs // PER_SHARD)]
        jsonl = tmp / "jsonl"
        figures["raw_jsonl_mb"] = round(write_jsonl(shards, jsonl) / 1e6, 1)
        for executor in ("pool", "ray"):
            figures.update(run_curate(executor, jsonl, tmp, args.workers))
    figures["outputs_identical"] = figures.pop("pool_documents_sha256") == figures.pop("ray_documents_sha256")
    figures["ray_vs_pool_docs_per_s"] = round(figures["ray_docs_per_s"] / figures["pool_docs_per_s"], 3)
    figures.update(task_overhead(args.workers))
    figures["machine_shared"] = "yes: other engineers' jobs ran on the same 2 cores (see load_average_*)"
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
