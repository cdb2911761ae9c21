"""Peak memory of the near-dedup step against the corpus size, under one fixed memory budget.

The documents are the speed benchmark's (bench/dedup_speed.py: passages of the shared corpus, ~30%
perturbed copies), generated once into parquet shards of 20,000 documents; each size runs the whole
near-dup plan of `smelt curate` (signatures, partitioned bucket files, verification, union-find,
decisions) over the first shards, in a fresh subprocess with one worker, so the process's VmHWM
(/proc/self/status) is the step's own peak. The process's resident memory after its imports, before the
step, is reported too: the step's share is the peak minus that. Memory that grows with the corpus is
expected only from per-document arrays (union-find, cluster sizes: tens of bytes per document) and the
decisions kept for documents in clusters; the bucket partitions follow the budget.

    nice -n 5 python bench/dedup_memory.py [--sizes 100000,300000,1000000] [--memory-mb 128]
        [--verify signature] [--data /tmp/dir-with-shards]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402
from dedup_speed import PER_SHARD, generate  # noqa: E402


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def step(data: Path, docs: int, memory_mb: int, verify: str) -> dict:
    """In the subprocess: the near-dup plan over the first `docs` documents (whole shards)."""
    from smelt.config import DataConfig, NearDedupConfig
    from smelt.data.dedup.near import plan_near_dedup

    baseline = status_mb("VmRSS")
    shards = sorted(data.glob("shard-*.parquet"))[: -(-docs // PER_SHARD)]
    with tempfile.TemporaryDirectory(dir=data) as tmp:
        # Links in a fresh folder: the signature files written next to them are this run's own.
        links = []
        for path in shards:
            link = Path(tmp) / path.name
            link.symlink_to(path)
            links.append(("bench", link))
        nd = NearDedupConfig(enabled=True, memory_mb=memory_mb, verify=verify)
        start, cpu = time.perf_counter(), time.process_time()
        plan = plan_near_dedup(DataConfig(near_dedup=nd, workers=1), links, Path(tmp), 1, "fork")
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
    return {
        "docs": len(shards) * PER_SHARD,
        "seconds": round(seconds, 1),
        "cpu_seconds": round(cpu, 1),  # on a shared machine, wall time also counts the others' load
        "baseline_rss_mb": round(baseline, 1),
        "peak_rss_mb": round(status_mb("VmHWM"), 1),
        "partitions": plan.report["partitions"],
        "candidate_pairs": plan.report["candidate_pairs"],
        "removed": sum(1 for d in plan.members.values() if d[2]),
        "documents_in_clusters": plan.report["documents_in_clusters"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="100000,300000,1000000")
    parser.add_argument("--memory-mb", type=int, default=128, help="data.near_dedup.memory_mb")
    parser.add_argument("--verify", default="signature", choices=("signature", "jaccard", "none"))
    parser.add_argument("--data", default="", help="a folder of shards from an earlier run (kept)")
    parser.add_argument("--name", default="dedup_memory")
    parser.add_argument("--step", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.step:
        print(json.dumps(step(Path(args.data), args.step, args.memory_mb, args.verify)))
        return
    sizes = sorted(int(s) for s in args.sizes.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.data) if args.data else Path(tmp)
        have = len(list(data.glob("shard-*.parquet"))) * PER_SHARD
        if have == 0:
            start = time.perf_counter()
            generate(sizes[-1], data)
            print(f"generated {sizes[-1]} documents in {time.perf_counter() - start:.0f} s", flush=True)
        elif have < sizes[-1]:
            sys.exit(f"{data} holds {have} documents, fewer than the largest size {sizes[-1]}")
        figures: dict[str, object] = {"memory_mb": args.memory_mb, "verify": args.verify}
        for docs in sizes:
            command = [sys.executable, __file__, "--data", str(data), "--step", str(docs)]
            command += ["--memory-mb", str(args.memory_mb), "--verify", args.verify]
            out = subprocess.run(command, check=True, capture_output=True, text=True)
            result = json.loads(out.stdout.strip().splitlines()[-1])
            print(json.dumps(result), flush=True)
            n = result["docs"]
            for key, value in result.items():
                if key != "docs":
                    figures[f"{key}_at_{n}"] = value
            step_mb = result["peak_rss_mb"] - result["baseline_rss_mb"]
            figures[f"step_mb_at_{n}"] = round(step_mb, 1)
            figures[f"step_bytes_per_doc_at_{n}"] = round(step_mb * 2**20 / n)
            figures[f"docs_per_s_at_{n}"] = round(n / result["seconds"])
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
