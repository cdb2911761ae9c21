"""Trainer throughput: tokens/s and MFU of model presets through the real training loop.

Usage: python bench/train.py [--steps N] [--presets a,b] [--precisions bf16,fp32] [--compile]
Defaults: on CPU tiny-1m and small-5m, in fp32 and bf16, eager; with a CUDA GPU llama-124m and
llama-1b in bf16 with torch.compile, MFU against the device's dense bf16 peak (precision.py's table).
On CPU MFU is against $SMELT_PEAK_FLOPS when set, else a short matmul measurement at start-up.
Synthetic uniform tokens: throughput does not depend on the text. The first steps (warm-up, compile)
are left out of the rates. Writes bench/results/train.json (train_cuda.json on a GPU).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from common import write_result

from smelt.config import config_from_dict
from smelt.train.trainer import train

VOCAB = 8192


def synthetic_tokens(root: Path, n_train: int) -> Path:
    tokens = root / "tokens"
    for split, n in (("train", n_train), ("val", 20_000)):
        directory = tokens / split / "synth"
        directory.mkdir(parents=True)
        np.random.default_rng(0).integers(2, VOCAB - 128, n).astype("<u2").tofile(directory / "00000.bin")
        np.array([0], dtype="<i8").tofile(directory / "00000.idx")
    (tokens / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 1}))
    (root / "tok").mkdir()
    (root / "tok" / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    return tokens


def main() -> None:
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30 if cuda else 12)
    p.add_argument("--presets", default="llama-124m,llama-1b" if cuda else "tiny-1m,small-5m")
    p.add_argument("--precisions", default="bf16" if cuda else "fp32,bf16")
    p.add_argument("--compile", action="store_true", default=cuda)
    p.add_argument("--seq-len", type=int, default=2048 if cuda else 256)
    p.add_argument("--micro-batch", type=int, default=8 if cuda else 8)
    args = p.parse_args()
    warmup = max(2, args.steps // 4)
    batch_tokens = args.seq_len * args.micro_batch
    root = Path(tempfile.mkdtemp())
    tokens = synthetic_tokens(root, batch_tokens * (args.steps + 2) + 1000)
    figures: dict[str, object] = {"steps": args.steps, "seq_len": args.seq_len, "micro_batch": args.micro_batch,
                                  "compiled": args.compile}  # fmt: skip
    for preset in args.presets.split(","):
        for precision in args.precisions.split(","):
            cfg = config_from_dict({
                "model": {"preset": preset, "max_seq_len": max(args.seq_len, 512)},
                "train": {"seq_len": args.seq_len, "micro_batch": args.micro_batch,
                          "tokens": batch_tokens * args.steps, "precision": precision, "log_every": 1,
                          "eval_every": 0, "eval_tokens": 0, "compile": args.compile, "doc_masking": False},
            })  # fmt: skip
            run = root / f"run-{preset}-{precision}"
            summary = train(cfg, tokens, root / "tok", run)
            lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            steady = [r for r in lines if r["kind"] == "train" and r["step"] > warmup]
            rate = sum(r["tokens_per_s"] for r in steady) / len(steady)
            key = f"{preset}_{precision}"
            figures[f"{key}_tokens_per_s"] = round(rate, 1)
            peak = summary["peak_flops"]
            figures[f"{key}_mfu_pct"] = (
                round(100 * summary["flops_per_token"] * rate / peak, 2) if peak else None
            )
            figures[f"{key}_peak_tflops"] = round(peak / 1e12, 3) if peak else None
            figures[f"{key}_params_non_embedding"] = summary["params_non_embedding"]
            figures[f"{key}_memory_mb"] = round(max(r.get("memory_mb") or 0 for r in steady), 1)
    write_result("train_cuda" if cuda else "train", figures)


if __name__ == "__main__":
    main()
