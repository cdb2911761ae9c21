"""A whole `smelt curate` at scale: every default step plus MinHash near-dedup, on synthetic web-like
documents with planted near-duplicates.

The documents are the dedup speed benchmark's (bench/dedup_speed.py: passages of the shared corpus,
~30% of them perturbed copies of recent ones), written as JSONL files of 20,000 records under a
temporary folder (never in the repository). `smelt curate` runs in a subprocess with the default steps
(normalize, language id, Gopher quality + repetition filters, length, PII, ids, exact dedup, split) and
`data.near_dedup.enabled = true` (optionally boilerplate lines and decontamination). Reported: wall
time, CPU time of the curate processes (on a shared machine wall time also counts the load of others),
documents/s, retention and drops per reason, the near-dedup report, the peak RSS of the largest
process (getrusage of the children) and the peak of the whole process tree's summed RSS (sampled every
half second from /proc; forked workers share pages, so the sum overstates a little).

    nice -n 5 python bench/curate_scale.py [--docs 1000000] [--workers 2] [--data /tmp/shards]
        [--line-dedup] [--decontam]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import write_result  # noqa: E402
from dedup_speed import PER_SHARD, generate  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EVALS = [
    ("hellaswag", "eval/hellaswag/olmes_hellaswag_val1000_rc_5shot", "olmes"),
    ("arc_easy", "eval/arc_easy/mosaic_arc_easy_test.jsonl", "mosaic"),
    ("mmlu", "eval/mmlu/test", "mmlu_csv"),
    ("gsm8k", "eval/gsm8k/test.jsonl", "gsm8k"),
]


def write_jsonl(shards: list[Path], out: Path) -> int:
    """One JSONL file per parquet shard (id, text); returns the bytes written."""
    out.mkdir(parents=True, exist_ok=True)
    total = 0
    for path in shards:
        table = pq.read_table(path, columns=["id", "text"]).to_pydict()
        target = out / (path.stem + ".jsonl")
        with target.open("w", encoding="utf-8") as handle:
            for doc_id, text in zip(table["id"], table["text"], strict=True):
                handle.write(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n")
        total += target.stat().st_size
    return total


def config_text(root: Path, run_dir: Path, workers: int, line_dedup: bool, decontam: bool) -> str:
    lines = [
        "[run]",
        'name = "curate_scale"',
        f'dir = "{run_dir}"',
        "[data]",
        f"workers = {workers}",
        "[data.near_dedup]",
        "enabled = true",
    ]
    if line_dedup:
        lines += ["[data.line_dedup]", "enabled = true"]
    if decontam:
        shared = REPO.parent / "shared" / "data"
        for name, path, fmt in EVALS:
            lines += ["[[data.decontam.evals]]", f'name = "{name}"', f'path = "{shared / path}"']
            lines.append(f'format = "{fmt}"')
    lines += [
        "[[data.sources]]",
        'name = "web"',
        'format = "jsonl"',
        f'root = "{root}"',
        'include = ["*.jsonl"]',
        'id_field = "id"',
    ]
    return "\n".join(lines) + "\n"


class TreeRss:
    """Samples the summed VmRSS of a process and its descendants, and the process's own VmRSS."""

    def __init__(self, pid: int, every: float = 0.5):
        self.pid, self.every, self.peak_mb = pid, every, 0.0
        self.start = time.time()
        self.samples: list[tuple[float, float]] = []  # (seconds since start, main process RSS MB)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _tree(self) -> list[int]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                except OSError:
                    continue
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            total = main = 0
            for pid in self._tree():
                try:
                    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1])
                            main = int(line.split()[1]) if pid == self.pid else main
                except OSError:
                    continue
            self.peak_mb = max(self.peak_mb, total / 1024)
            self.samples.append((time.time() - self.start, main / 1024))

    def main_peak(self, lo: float, hi: float) -> float:
        """The main process's largest sampled RSS between lo and hi seconds."""
        return max((mb for t, mb in self.samples if lo <= t <= hi), default=0.0)

    def close(self) -> float:
        self.stop.set()
        self.thread.join()
        return self.peak_mb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--data", default="", help="a folder of parquet shards from an earlier run (kept)")
    parser.add_argument("--line-dedup", action="store_true")
    parser.add_argument("--decontam", action="store_true", help="also decontaminate against 4 benchmarks")
    parser.add_argument("--name", default="curate_scale")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="smelt-curate-scale-") as tmp:
        data = Path(args.data) if args.data else Path(tmp) / "shards"
        data.mkdir(parents=True, exist_ok=True)
        have = len(list(data.glob("shard-*.parquet"))) * PER_SHARD
        if have == 0:
            generate(args.docs, data)
        elif have < args.docs:
            sys.exit(f"{data} holds {have} documents, fewer than --docs {args.docs}")
        shards = sorted(data.glob("shard-*.parquet"))[: -(-args.docs // PER_SHARD)]
        jsonl = Path(tmp) / "jsonl"
        raw_bytes = write_jsonl(shards, jsonl)
        config = Path(tmp) / "curate_scale.toml"
        config.write_text(
            config_text(jsonl, Path(tmp) / "runs", args.workers, args.line_dedup, args.decontam)
        )
        command = [sys.executable, "-m", "smelt.cli", "curate", str(config), "--force"]
        log = Path(tmp) / "curate.log"
        marks: list[tuple[float, str]] = []  # (seconds since start, near-dedup log line)
        start = time.time()
        with log.open("w") as handle:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=REPO, text=True
            )
            sampler = TreeRss(process.pid)
            assert process.stdout is not None
            for line in process.stdout:
                handle.write(line)
                if "near-dedup:" in line:
                    marks.append((time.time() - start, line[line.index("curate: near-dedup:") :].strip()))
            code = process.wait()
        seconds = time.time() - start
        tree_peak = sampler.close()
        if code != 0:
            sys.exit(f"smelt curate failed ({code}):\n{log.read_text()[-4000:]}")
        stats = json.loads((Path(tmp) / "runs" / "curate_scale" / "documents" / "stats.json").read_text())
    docs_in = stats["documents_in"]
    # CPU seconds of the curate processes: on a shared machine wall time also counts the others' load.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    figures: dict[str, object] = {
        "documents": docs_in,
        "raw_jsonl_mb": round(raw_bytes / 1e6, 1),
        "workers": args.workers,
        "wall_s": round(seconds, 1),
        "docs_per_s": round(docs_in / seconds),
        "mb_per_s": round(raw_bytes / 1e6 / seconds, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "peak_rss_mb_largest_process": round(usage.ru_maxrss / 1024, 1),
        "peak_rss_mb_process_tree": round(tree_peak, 1),
        "documents_kept": stats["documents_kept"],
        "retention": round(stats["documents_kept"] / max(1, docs_in), 4),
        "line_dedup": args.line_dedup,
        "decontam": args.decontam,
    }
    for reason, count in sorted(stats["dropped"].items()):
        figures[f"dropped_{reason}"] = count
    for key, value in stats.get("near_dedup", {}).items():
        figures[f"near_dedup_{key}"] = value
    if len(marks) >= 2:
        # The plan runs between its two log lines: after the map phase, before the reduce.
        figures["map_s"] = round(marks[0][0], 1)
        figures["near_dedup_plan_s"] = round(marks[-1][0] - marks[0][0], 1)
        figures["reduce_and_rest_s"] = round(seconds - marks[-1][0], 1)
        # Which phase the main process's memory peaks in (the workers run the map phase).
        figures["main_rss_mb_map"] = round(sampler.main_peak(0, marks[0][0]), 1)
        figures["main_rss_mb_near_dedup_plan"] = round(sampler.main_peak(marks[0][0], marks[-1][0]), 1)
        figures["main_rss_mb_reduce"] = round(sampler.main_peak(marks[-1][0], seconds), 1)
    for _, line in marks:
        print(line)
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
