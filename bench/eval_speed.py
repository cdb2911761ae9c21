"""Cloze scoring speed on CPU: items/s of the task harness for a small model, by batch size.

Usage: python bench/eval_speed.py [--tokenizer DIR] [--items N] [--preset small-5m] [--tasks a,b]
Scores the first N items (seeded subset) of each task with a randomly initialized model of the preset
(the speed does not depend on the weights) at batch sizes 1, 8 and 32; requests are length-sorted, so
larger batches pad little. Without --tokenizer a byte-level stand-in is used (one token per UTF-8
byte: about 4x the tokens of a trained BPE, so a pessimistic figure); pass a run's tokenizer
directory (e.g. runs/quickstart/tokenizer) for realistic lengths. Writes bench/results/eval_speed.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from common import write_result

from smelt.eval.harness import prepare, score_pairs
from smelt.eval.tasks import get_spec, load_task, resolve_tasks_dir
from smelt.model.sizing import preset_config
from smelt.model.transformer import Transformer


class ByteTokenizer:
    eos_id = 256
    vocab_size = 384

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(t.encode()) for t in texts]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", default=None)
    parser.add_argument("--items", type=int, default=100)
    parser.add_argument("--preset", default="small-5m")
    parser.add_argument("--tasks", default="hellaswag,arc_easy")
    parser.add_argument("--batches", default="1,8,32")
    args = parser.parse_args(argv)
    if args.tokenizer:
        from smelt.tokenizer.load import Tokenizer

        tokenizer = Tokenizer.load(Path(args.tokenizer))
        tok_name = str(args.tokenizer)
    else:
        tokenizer, tok_name = ByteTokenizer(), "bytes"
    cfg = preset_config(args.preset)
    cfg.max_seq_len = 2048
    torch.manual_seed(0)
    model = Transformer(cfg, tokenizer.vocab_size).eval()
    tasks_dir = resolve_tasks_dir()
    figures: dict[str, object] = {
        "preset": args.preset,
        "tokenizer": tok_name,
        "threads": torch.get_num_threads(),
    }
    for name in args.tasks.split(","):
        prep = prepare(
            load_task(get_spec(name), tasks_dir, args.items, 0), tokenizer, cfg.max_seq_len, "skip"
        )
        tokens = sum(len(c) + len(k) - 1 for c, k in prep.pairs)
        figures[f"{name}_items"] = len(prep.items)
        figures[f"{name}_requests"] = len(prep.pairs)
        figures[f"{name}_mean_request_tokens"] = round(tokens / len(prep.pairs), 1)
        reference = None
        for batch in (int(b) for b in args.batches.split(",")):
            score_pairs(model, prep.pairs[: 2 * batch], batch, torch.device("cpu"))  # warm-up
            started = time.perf_counter()
            scores = score_pairs(model, prep.pairs, batch, torch.device("cpu"))
            elapsed = time.perf_counter() - started
            figures[f"{name}_items_per_s_batch{batch}"] = round(len(prep.items) / elapsed, 2)
            figures[f"{name}_tokens_per_s_batch{batch}"] = round(tokens / elapsed)
            if reference is None:
                reference = scores
            drift = max(
                abs(a[0] - b[0]) / max(1.0, abs(a[0])) for a, b in zip(scores, reference, strict=True)
            )
            figures[f"{name}_max_rel_diff_vs_batch1_batch{batch}"] = float(f"{drift:.2e}")
    write_result("eval_speed", figures)


if __name__ == "__main__":
    main(sys.argv[1:])
