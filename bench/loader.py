"""Training-loader throughput on one core, and the share of training step time spent waiting for data.

Usage: python bench/loader.py [STEPS]

1. Tokens/s the loader produces at seq_len 2048 (global batch 64 sequences = 131,072 tokens a step)
   from synthetic memory-mapped shards of three sources (web 60%, code 30%, math 10%, documents of
   log-normal length around 600 tokens), with torch limited to one thread and no prefetch thread:
   the raw cost of scheduling, shuffling, reading and packing with document boundaries. Measured
   without FIM and with FIM on the code source at rate 0.5. The goal is 2M tokens/s or more.
2. The trainer's loader wait: `loader_wait_share` (time blocked in `next_step` / step time) of a short
   CPU training run of small-5m at seq_len 256 on the same kind of shards, with the default prefetch
   (2 steps in a background thread) and with prefetch off.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import write_result

from smelt.config import TokensConfig, config_from_dict
from smelt.tokens.loader import TokenLoader
from smelt.tokens.shards import META_JSON, ShardWriter
from smelt.train.trainer import train

VOCAB = 4096
EOS = 1
FIM_IDS = (4093, 4094, 4095)
SOURCES = {"web": 24_000_000, "code": 12_000_000, "math": 4_000_000}  # tokens


def synthetic_shards(root: Path) -> Path:
    """Three sources of EOS-terminated documents with log-normal lengths, in 16M-token shards."""
    tokens = root / "tokens"
    tokens.mkdir(parents=True)
    rng = np.random.default_rng(0)
    meta = {"dtype": "uint16", "vocab_size": VOCAB, "eos_id": EOS, "bos_id": 0, "pad_id": 2}
    (tokens / META_JSON).write_text(json.dumps(meta))
    for split, scale in (("train", 1.0), ("val", 0.002)):
        for name, size in SOURCES.items():
            writer = ShardWriter(tokens / split / name, np.dtype("<u2"), 16_000_000)
            total = int(size * scale)
            lengths = np.clip(rng.lognormal(6.0, 1.0, total // 300), 8, 50_000).astype(np.int64)
            lengths = lengths[np.cumsum(lengths) <= total]
            flat = rng.integers(3, VOCAB - 3, int(lengths.sum())).astype("<u2")
            flat[np.cumsum(lengths) - 1] = EOS
            writer.write_batch(flat, lengths)
            writer.close()
    return tokens


def loader_rate(tokens: Path, fim_rate: float, steps: int) -> tuple[float, float, float]:
    """(tokens/s, mean documents per sequence, padding fraction) over `steps` synchronous steps."""
    cfg = TokensConfig(
        mixture={"web": 0.6, "code": 0.3, "math": 0.1}, fim_rate=fim_rate, fim_sources=["code"], prefetch=0
    )
    loader = TokenLoader(
        tokens, cfg, seq_len=2048, batch_size=64, steps=steps + 1, seed=0, fim_ids=FIM_IDS, verify="none"
    )
    loader.step_data(1)  # warm the page cache and the code paths
    documents, padded, total = 0, 0, 0
    start = time.perf_counter()
    for step in range(2, steps + 2):
        for batch in loader.step_data(step).micro:
            documents += len(batch.cu_seqlens) - 1
            padded += int((batch.targets < 0).sum())
            total += batch.targets.numel()
    elapsed = time.perf_counter() - start
    return total / elapsed, documents / (total / 2048), padded / total


def wait_share(tokens: Path, root: Path, prefetch: int, steps: int) -> tuple[float, float]:
    """(loader wait share of step time, tokens/s) of a short training run."""
    cfg = config_from_dict(
        {
            "model": {"preset": "small-5m", "max_seq_len": 256},
            "tokens": {"mixture": {"web": 0.6, "code": 0.3, "math": 0.1}, "prefetch": prefetch},
            "train": {
                "seq_len": 256,
                "micro_batch": 16,
                "batch_tokens": 4096,
                "tokens": 4096 * steps,
                "precision": "auto",
                "log_every": 5,
                "eval_every": 0,
                "eval_tokens": 0,
            },
        }
    )
    summary = train(cfg, tokens, root / "tok", root / f"run-prefetch-{prefetch}")
    return summary["loader_wait_share"], summary["tokens_per_s"]


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 40
    root = Path(tempfile.mkdtemp())
    tokens = synthetic_shards(root)
    (root / "tok").mkdir()
    (root / "tok" / "smelt.json").write_text(json.dumps({"vocab_size": VOCAB}))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    rate, docs, padding = loader_rate(tokens, 0.0, steps)
    fim_rate, _, _ = loader_rate(tokens, 0.5, steps)
    torch.set_num_threads(threads)
    share, tps = wait_share(tokens, root, prefetch=2, steps=30)
    share_sync, tps_sync = wait_share(tokens, root, prefetch=0, steps=30)
    write_result(
        "loader",
        {
            "seq_len": 2048,
            "global_batch_sequences": 64,
            "loader_steps": steps,
            "loader_tokens_per_s_one_core": round(rate),
            "loader_tokens_per_s_one_core_fim_0_5": round(fim_rate),
            "documents_per_sequence": round(docs, 2),
            "padding_fraction": padding,
            "train_model": "small-5m, seq_len 256, batch 4,096 tokens, 30 steps",
            "train_loader_wait_share_prefetch_2": round(share, 5),
            "train_tokens_per_s_prefetch_2": round(tps),
            "train_loader_wait_share_no_prefetch": round(share_sync, 5),
            "train_tokens_per_s_no_prefetch": round(tps_sync),
        },
    )


if __name__ == "__main__":
    main()
