"""Near-dedup speed and memory, against datasketch's MinHash + MinHashLSH on the same documents.

Documents are passages of the shared corpus with planted near-duplicates (bench/dedup_quality.py),
written to parquet shards once; each measured phase runs in a fresh subprocess on one core, so its peak
RSS (its own, or its largest worker's) is measured alone:
* `sig`: smelt MinHash signatures (word 5-grams, 128 permutations);
* `step`: the whole near-dup plan of `smelt curate` (signatures, partitioned bucket files, verification,
  union-find, decisions), workers = 1;
* `datasketch`: datasketch MinHash (same shingles, update_batch) + MinHashLSH insert and query, with the
  same bands x rows.
`--scale` repeats the step at fractions of the corpus to show memory per document stays flat.
Also, unless `--skip-lines-decontam`, on the same documents (whole shards of 20,000):
* `lines`: boilerplate line dedup (max_docs 100, min_chars 20): the counting pass over the shards
  (`count_lines`) and the step over the documents, documents/s each;
* `decontam`: the 13-gram index of HellaSwag (val), ARC-Easy, MMLU (test) and GSM8K (test) from the
  shared eval files (build time), then the step over the documents, documents/s.

    python bench/dedup_speed.py [--docs 100000]   # datasketch needed: pip install datasketch
    python bench/dedup_speed.py --docs 1000000 --skip-datasketch --workers 2 --name dedup_1m
    python bench/dedup_speed.py --docs 40000 --only-lines-decontam --name dedup_lines_decontam
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import shared_data, write_result  # noqa: E402
from dedup_quality import passages, perturb, real_lines  # noqa: E402

PER_SHARD = 20_000
# The benchmark files the decontamination phase indexes, under the shared data set.
EVAL_FILES = (
    "eval/hellaswag/olmes_hellaswag_val1000_rc_5shot",
    "eval/arc_easy/mosaic_arc_easy_test.jsonl",
    "eval/mmlu/test",
    "eval/gsm8k/test.jsonl",
)


def generate(n: int, directory: Path, seed: int = 0) -> list[Path]:
    """n documents: ~70% distinct passages, ~30% perturbed copies of earlier ones, in parquet shards."""
    rng = random.Random(seed)
    lines = real_lines()
    vocab = sorted({w for line in lines[:20000] for w in line.split()})
    n_base = int(n * 0.7)
    directory.mkdir(parents=True, exist_ok=True)
    paths, texts, made = [], [], 0
    base_pool: list[str] = []
    while made < n:
        if len(base_pool) < 1000 and made < n:
            base_pool = passages(lines, 2000, rng, (60, 300)) if made < n_base or not base_pool else base_pool
        if rng.random() < 0.3 and texts:
            texts.append(perturb(rng.choice(texts[-5000:]), rng, rng.uniform(0.005, 0.1), vocab))
        else:
            texts.append(perturb(base_pool.pop(), rng, 0.25, vocab))  # distinct: heavy edits
        made += 1
        if len(texts) == PER_SHARD or made == n:
            path = directory / f"shard-{len(paths):05d}.parquet"
            ids = [f"{made - len(texts) + i:09d}" for i in range(len(texts))]
            pq.write_table(pa.table({"id": ids, "text": texts}), path)
            paths.append(path)
            texts = []
    return paths


def phase(name: str, data: Path, limit: int, workers: int) -> dict:
    """Run in a subprocess: time one phase over the first `limit` documents."""
    paths = sorted(data.glob("shard-*.parquet"))
    from smelt.config import DataConfig, NearDedupConfig
    from smelt.data.dedup.minhash import MinHasher, words
    from smelt.data.dedup.near import params_of, plan_near_dedup

    nd = NearDedupConfig(enabled=True)
    params = params_of(nd)
    if name in ("lines", "decontam"):
        return text_steps(name, paths[: -(-limit // PER_SHARD)])
    if name == "step":
        with tempfile.TemporaryDirectory(dir=data) as tmp:
            shards, left = [], limit
            for path in paths:
                if left <= 0:
                    break
                table = pq.read_table(path).slice(0, left)
                left -= table.num_rows
                out = Path(tmp) / path.name
                pq.write_table(table, out)
                shards.append(("bench", out))
            start = time.perf_counter()
            plan = plan_near_dedup(
                DataConfig(near_dedup=nd, workers=workers), shards, Path(tmp), workers, "fork"
            )
            seconds = time.perf_counter() - start
        return {"seconds": seconds, "docs": limit, "removed": sum(1 for d in plan.members.values() if d[2])}
    texts: list[str] = []
    for path in paths:
        texts.extend(pq.read_table(path, columns=["text"]).column("text").to_pylist())
        if len(texts) >= limit:
            break
    texts = texts[:limit]
    if name == "sig":
        hasher = MinHasher(nd.num_perm, nd.ngram)
        start = time.perf_counter()
        for lo in range(0, len(texts), 4096):
            hasher.signatures(texts[lo : lo + 4096])
        return {"seconds": time.perf_counter() - start, "docs": len(texts)}
    from datasketch import MinHash, MinHashLSH

    start = time.perf_counter()
    lsh = MinHashLSH(num_perm=nd.num_perm, params=(params.bands, params.rows))
    sig_seconds = 0.0
    removed = 0
    for i, text in enumerate(texts):
        t0 = time.perf_counter()
        ws = words(text)
        grams = {b" ".join(ws[j : j + nd.ngram]) for j in range(max(1, len(ws) - nd.ngram + 1))}
        m = MinHash(num_perm=nd.num_perm)
        m.update_batch(list(grams))
        sig_seconds += time.perf_counter() - t0
        if lsh.query(m):
            removed += 1
            continue
        lsh.insert(str(i), m)
    return {
        "seconds": time.perf_counter() - start,
        "sig_seconds": sig_seconds,
        "docs": len(texts),
        "removed": removed,
    }


def text_steps(name: str, paths: list[Path]) -> dict:
    """Line dedup or decontamination over the documents of `paths`, timed apart from reading them."""
    from smelt.config import DecontamConfig, EvalSetConfig
    from smelt.data.dedup.decontam import Decontaminate
    from smelt.data.dedup.lines import LineDedup, count_lines
    from smelt.data.ledger import Doc, Ledger

    docs = []
    for path in paths:
        table = pq.read_table(path, columns=["id", "text"]).to_pydict()
        docs += [Doc("bench", 0, i, t, path.name) for i, t in zip(table["id"], table["text"], strict=True)]
    out: dict[str, object] = {
        "docs": len(docs),
        "mb": round(sum(len(d.text.encode()) for d in docs) / 1e6, 1),
    }
    ledger = Ledger()
    if name == "lines":
        step = LineDedup(100, 20)
        start, cpu = time.perf_counter(), time.process_time()
        step.set_counts(*count_lines(paths, step.min_chars))
        out["count_seconds"] = time.perf_counter() - start
        out["count_cpu_seconds"] = time.process_time() - cpu
        out["boilerplate_lines"] = len(step.boilerplate)
    else:
        shared = shared_data(*EVAL_FILES) / "eval"
        evals = [
            EvalSetConfig("hellaswag", str(shared / "hellaswag/olmes_hellaswag_val1000_rc_5shot"), "olmes"),
            EvalSetConfig("arc_easy", str(shared / "arc_easy/mosaic_arc_easy_test.jsonl"), "mosaic"),
            EvalSetConfig("mmlu", str(shared / "mmlu/test"), "mmlu_csv"),
            EvalSetConfig("gsm8k", str(shared / "gsm8k/test.jsonl"), "gsm8k"),
        ]
        start = time.perf_counter()
        step = Decontaminate.from_config(DecontamConfig(evals=evals))
        out["index_seconds"] = time.perf_counter() - start
        out["index_ngrams"] = len(step.index.hashes)
    start, cpu = time.perf_counter(), time.process_time()
    kept = list(step.run(docs, ledger))
    out["seconds"] = time.perf_counter() - start
    out["cpu_seconds"] = time.process_time() - cpu
    out["changed_or_dropped"] = (
        len(docs)
        - len(kept)
        + sum(1 for d in kept if "boilerplate_lines_removed" in d.meta or "contamination" in d.meta)
    )
    return out


def run_phase(name: str, data: Path, limit: int, workers: int = 1) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--phase",
            name,
            "--data",
            str(data),
            "--docs",
            str(limit),
            "--workers",
            str(workers),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--phase", default="")
    parser.add_argument("--data", default="")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--skip-datasketch", action="store_true")
    parser.add_argument("--skip-lines-decontam", action="store_true")
    parser.add_argument("--only-lines-decontam", action="store_true", help="skip the near-dup phases")
    parser.add_argument("--shards", default="", help="a folder of shards from an earlier run (kept)")
    parser.add_argument("--scale", action="store_true", help="also run the step at 1/4 and 1/2 of --docs")
    parser.add_argument("--name", default="dedup_speed")
    args = parser.parse_args()
    if args.phase:
        result = phase(args.phase, Path(args.data), args.docs, args.workers)
        rss = max(
            resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        result["peak_rss_mb"] = round(rss / 1024, 1)
        print(json.dumps(result))
        return
    # Before any work: say where the shared data was looked for when it is not there.
    shared_data(*([] if args.shards else ["corpus/prose"]), *([] if args.skip_lines_decontam else EVAL_FILES))
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(args.shards or tmp)
        start = time.perf_counter()
        if not args.shards:
            generate(args.docs, data)
        mb = sum(p.stat().st_size for p in sorted(data.glob("shard-*.parquet"))[: -(-args.docs // PER_SHARD)])
        mb /= 1e6
        figures: dict[str, object] = {
            "documents": args.docs,
            "generate_s": round(time.perf_counter() - start, 1),
        }
        figures["parquet_mb"] = round(mb, 1)
        w = args.workers
        if args.only_lines_decontam:
            args.skip_datasketch = True
        elif not args.skip_datasketch or args.workers == 1:
            sig = run_phase("sig", data, args.docs)
            figures["signatures_docs_per_s_per_core"] = round(sig["docs"] / sig["seconds"])
        if not args.only_lines_decontam:
            step = run_phase("step", data, args.docs, w)
            figures["step_workers"] = w
            figures["step_s"] = round(step["seconds"], 1)
            figures["step_docs_per_s_per_core"] = round(step["docs"] / step["seconds"] / w)
            figures["step_peak_rss_mb"] = step["peak_rss_mb"]
            figures["step_removed"] = step["removed"]
        if args.scale and not args.only_lines_decontam:
            for share in (4, 2):
                small = run_phase("step", data, args.docs // share, w)
                figures[f"step_peak_rss_mb_at_{args.docs // share}_docs"] = small["peak_rss_mb"]
        if not args.skip_lines_decontam:
            lines = run_phase("lines", data, args.docs)
            figures["line_dedup_docs"] = lines["docs"]
            figures["line_dedup_count_docs_per_s"] = round(lines["docs"] / lines["count_seconds"])
            figures["line_dedup_step_docs_per_s"] = round(lines["docs"] / lines["seconds"])
            figures["line_dedup_step_mb_per_s"] = round(lines["mb"] / lines["seconds"], 1)
            # Per CPU second of the process: the rate on an idle core, whatever else the machine runs.
            figures["line_dedup_count_docs_per_cpu_s"] = round(lines["docs"] / lines["count_cpu_seconds"])
            figures["line_dedup_step_docs_per_cpu_s"] = round(lines["docs"] / lines["cpu_seconds"])
            figures["line_dedup_boilerplate_lines"] = lines["boilerplate_lines"]
            figures["line_dedup_docs_changed"] = lines["changed_or_dropped"]
            figures["line_dedup_peak_rss_mb"] = lines["peak_rss_mb"]
            dec = run_phase("decontam", data, args.docs)
            figures["decontam_index_s"] = round(dec["index_seconds"], 1)
            figures["decontam_index_ngrams"] = dec["index_ngrams"]
            figures["decontam_docs_per_s"] = round(dec["docs"] / dec["seconds"])
            figures["decontam_mb_per_s"] = round(dec["mb"] / dec["seconds"], 1)
            figures["decontam_docs_per_cpu_s"] = round(dec["docs"] / dec["cpu_seconds"])
            figures["decontam_docs_matched"] = dec["changed_or_dropped"]
            figures["decontam_peak_rss_mb"] = dec["peak_rss_mb"]
        if not args.skip_datasketch:
            ds = run_phase("datasketch", data, args.docs)
            figures["datasketch_signatures_docs_per_s_per_core"] = round(ds["docs"] / ds["sig_seconds"])
            figures["datasketch_step_docs_per_s_per_core"] = round(ds["docs"] / ds["seconds"])
            figures["datasketch_peak_rss_mb"] = ds["peak_rss_mb"]
            figures["datasketch_removed"] = ds["removed"]
            figures["ratio_vs_datasketch_signatures"] = round(
                figures["signatures_docs_per_s_per_core"]
                / figures["datasketch_signatures_docs_per_s_per_core"],
                2,
            )
            figures["ratio_vs_datasketch_step"] = round(
                figures["step_docs_per_s_per_core"] / figures["datasketch_step_docs_per_s_per_core"], 2
            )
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
