"""Trainer throughput on this machine: tokens/s and MFU in both conventions, per precision and setting.

Usage: python bench/train_throughput.py [STEPS] [compile] [--preset small-5m] [--micro-batch 16]
           [--seq-len 256] [--precision bf16,fp32] [--loss-chunk-tokens 0,1024] [--repeats 3]
           [--cold-cache] [--name train_throughput]

Each (precision, loss chunk) setting trains `--repeats` times through smelt's Trainer on synthetic
tokens (vocabulary 8192); a run's rate is its mean tokens/s after step 5 (the first windows include
start-up and compilation), and the result gives min / median / max over the runs. MFU is reported
as smelt computes it (model/flops.py): "mfu" in PaLM's 6N + 12 L d s with the LM head counted, and
"mfu_model" in the matmuls' own FLOPs (causal attention at half the score matrix). The peak is
$SMELT_PEAK_FLOPS when set (e.g. 0.86e12, the bf16 matmul peak of a 2-core AVX-512 BF16 machine),
else a short matmul measurement at start-up. The load average before and after is recorded: on a
shared machine the figures are only comparable within one result file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
from common import write_result

from smelt.config import config_from_dict
from smelt.train.trainer import train

VOCAB = 8192
WARMUP_STEPS = 5


def synthetic_tokens(root: Path) -> Path:
    tokens = root / "tokens"
    for split, n in (("train", 2_000_000), ("val", 20_000)):
        directory = tokens / split / "synth"
        directory.mkdir(parents=True)
        np.random.default_rng(0).integers(0, VOCAB - 128, n).astype("<u2").tofile(directory / "00000.bin")
        np.array([0], dtype="<i8").tofile(directory / "00000.idx")
    (tokens / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 1}))
    return tokens


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("steps", nargs="?", type=int, default=20, help="optimizer steps per run (default 20)")
    p.add_argument("compile", nargs="?", choices=["compile"], help="train with torch.compile")
    p.add_argument("--preset", default="small-5m")
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--precision", default="bf16,fp32", help="comma-separated: bf16, fp32")
    p.add_argument("--loss-chunk-tokens", default="0", help="comma-separated train.loss_chunk_tokens values")
    p.add_argument("--repeats", type=int, default=1, help="runs per setting (min / median / max)")
    p.add_argument(
        "--cold-cache",
        action="store_true",
        help="compile into a new, empty inductor cache (the first run pays)",
    )
    p.add_argument("--name", default="", help="result file name (default train_throughput[_compiled])")
    return p.parse_args()


def one_run(args: argparse.Namespace, root: Path, tokens: Path, precision: str, chunk: int, i: int) -> dict:
    batch = args.micro_batch * args.seq_len
    cfg = config_from_dict(
        {
            "model": {"preset": args.preset},
            "train": {
                "seq_len": args.seq_len,
                "micro_batch": args.micro_batch,
                "tokens": batch * args.steps,
                "precision": precision,
                "log_every": 5,
                "eval_every": 0,
                "eval_tokens": 4096,
                "compile": bool(args.compile),
                "loss_chunk_tokens": chunk,
            },
        }
    )
    out = root / f"run-{precision}-{chunk}-{i}"
    started = time.perf_counter()
    summary = train(cfg, tokens, root / "tok", out)
    run_s = time.perf_counter() - started
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steady = [r for r in lines if r["kind"] == "train" and r["step"] > WARMUP_STEPS]
    rate = sum(r["tokens_per_s"] for r in steady) / len(steady)
    peak = summary.get("peak_flops")
    return {
        "tokens_per_s": rate,
        "run_s": run_s,
        "mfu": summary["flops_per_token"] * rate / peak if peak else None,
        "mfu_model": summary["model_flops_per_token"] * rate / peak if peak else None,
        "peak_flops": peak,
        "summary": summary,
    }


def spread(values: list[float], scale: float = 1.0, digits: int = 1) -> dict[str, float]:
    return {
        "min": round(scale * min(values), digits),
        "median": round(scale * statistics.median(values), digits),
        "max": round(scale * max(values), digits),
    }


def main() -> None:
    args = parse_args()
    root = Path(tempfile.mkdtemp())
    if args.cold_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    tokens = synthetic_tokens(root)
    (root / "tok").mkdir()
    (root / "tok" / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    figures: dict[str, object] = {
        "steps": args.steps,
        "compiled": bool(args.compile),
        "preset": args.preset,
        "batch_tokens": args.micro_batch * args.seq_len,
        "seq_len": args.seq_len,
        "repeats": args.repeats,
        "cold_cache": args.cold_cache,
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "mfu_conventions": "mfu: 6N + 12 L d s, N = non-embedding parameters + the LM head (PaLM); "
        "mfu_model: matmul FLOPs, causal attention at (s + 1) / 2 keys",
    }
    medians: dict[str, float] = {}
    for precision in args.precision.split(","):
        for chunk in (int(c) for c in args.loss_chunk_tokens.split(",")):
            runs = [one_run(args, root, tokens, precision, chunk, i) for i in range(args.repeats)]
            key = precision if chunk == 0 else f"{precision}_chunk{chunk}"
            rates = [r["tokens_per_s"] for r in runs]
            medians[key] = statistics.median(rates)
            figures[f"{key}_tokens_per_s"] = spread(rates)
            # Whole train() calls: set-up, every step, validation; compiled, the first run includes
            # the compile (with the inductor cache as this machine has it: see --cold-cache).
            figures[f"{key}_run_s"] = [round(r["run_s"], 1) for r in runs]
            if runs[0]["peak_flops"]:
                figures[f"{key}_mfu_pct"] = spread([r["mfu"] for r in runs], 100, 2)
                figures[f"{key}_mfu_model_pct"] = spread([r["mfu_model"] for r in runs], 100, 2)
                figures[f"{key}_peak_tflops"] = round(runs[0]["peak_flops"] / 1e12, 3)
            summary = runs[0]["summary"]
            figures["params_total"] = summary["params_total"]
            figures["params_non_embedding"] = summary["params_non_embedding"]
            figures["flops_per_token"] = summary["flops_per_token"]
            figures["model_flops_per_token"] = summary["model_flops_per_token"]
    if "bf16" in medians and "fp32" in medians:
        figures["bf16_speedup_vs_fp32"] = round(medians["bf16"] / medians["fp32"], 2)
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    write_result(args.name or ("train_throughput_compiled" if args.compile else "train_throughput"), figures)


if __name__ == "__main__":
    main()
