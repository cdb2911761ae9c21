"""Trainer throughput on this machine: tokens/s and MFU of small-5m (d=256, 6 layers), bf16 vs fp32.

Usage: python bench/train_throughput.py [STEPS] [compile]
MFU is against $SMELT_PEAK_FLOPS when set (e.g. 0.86e12, the bf16 matmul peak measured on a 2-core
AVX-512 BF16 machine), else against a short matmul measurement at start-up.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from common import write_result

from smelt.config import config_from_dict
from smelt.train.trainer import train

VOCAB = 8192


def synthetic_tokens(root: Path) -> Path:
    tokens = root / "tokens"
    for split, n in (("train", 2_000_000), ("val", 20_000)):
        directory = tokens / split / "synth"
        directory.mkdir(parents=True)
        np.random.default_rng(0).integers(0, VOCAB - 128, n).astype("<u2").tofile(directory / "00000.bin")
        np.array([0], dtype="<i8").tofile(directory / "00000.idx")
    (tokens / "meta.json").write_text(json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": 1}))
    return tokens


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
    compiled = "compile" in sys.argv
    root = Path(tempfile.mkdtemp())
    tokens = synthetic_tokens(root)
    (root / "tok").mkdir()
    (root / "tok" / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    figures: dict[str, object] = {"steps": steps, "compiled": compiled}
    rates = {}
    for precision in ("bf16", "fp32"):
        cfg = config_from_dict(
            {
                "model": {"preset": "small-5m"},
                "train": {
                    "seq_len": 256,
                    "micro_batch": 16,
                    "tokens": 4096 * steps,
                    "precision": precision,
                    "log_every": 5,
                    "eval_every": 0,
                    "eval_tokens": 4096,
                    "compile": compiled,
                },
            }
        )
        summary = train(cfg, tokens, root / "tok", root / f"run-{precision}")
        lines = [
            json.loads(line)
            for line in (root / f"run-{precision}" / "metrics.jsonl").read_text().splitlines()
        ]
        steady = [line for line in lines if line["kind"] == "train" and line["step"] > 5]  # skip warm-up
        rate = sum(line["tokens_per_s"] for line in steady) / len(steady)
        rates[precision] = rate
        figures[f"{precision}_tokens_per_s"] = round(rate, 1)
        figures[f"{precision}_mfu_pct"] = (
            round(100 * summary["flops_per_token"] * rate / summary["peak_flops"], 2)
            if summary.get("flops_per_token") and summary.get("peak_flops")
            else None
        )
        figures[f"{precision}_peak_tflops"] = (
            round(summary["peak_flops"] / 1e12, 3) if summary["peak_flops"] else None
        )
        figures["params_total"] = summary["params_total"]
        figures["params_non_embedding"] = summary["params_non_embedding"]
    figures["bf16_speedup_vs_fp32"] = round(rates["bf16"] / rates["fp32"], 2)
    write_result("train_throughput_compiled" if compiled else "train_throughput", figures)


if __name__ == "__main__":
    main()
