"""Train a short run on an existing run's token shards, or compare two metrics.jsonl files without
their timing fields: the check that a change to the trainer's code leaves its records unchanged.

    python bench/trainer_identity.py train RUN OUT [--tokens N] [--set KEY=VALUE ...]  # RUN: tokens/, tokenizer/
    python bench/trainer_identity.py compare A/metrics.jsonl B/metrics.jsonl [--ignore KEY]

`train` uses the quickstart config (with validation every 20 steps and a checkpoint every 20 steps so
that every kind of record appears) on RUN's shards; `compare` exits 1 and prints the first differing
record when the files differ in anything but wall-clock figures.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Wall-clock figures: they differ between any two runs of the same code (peak_flops is measured on CPU).
TIMING_KEYS = frozenset(
    {"elapsed_s", "tokens_per_s", "mfu", "loader_wait_s", "loader_wait_share", "memory_mb", "wall_time_s",
     "eval_s", "eval_share", "predicted_s", "train_s", "seconds", "time", "save_s", "blocked_s", "write_s",
     "peak_flops", "peak_flops_source", "stall_s", "mfu_model", "step_time_s", "step_time_p50_s", "step_time_p99_s",
     "checkpoint_wait_s", "rank_step_time_p50_s", "rank_step_time_p99_s", "rank_own_time_p50_s"}
)  # fmt: skip


def without_timing(record: dict, ignore: frozenset[str] = frozenset()) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING_KEYS | ignore and not k.endswith("_seconds")}


def compare(a: Path, b: Path, ignore: frozenset[str] = frozenset()) -> int:
    left = [without_timing(json.loads(line), ignore) for line in a.read_text().splitlines() if line.strip()]
    right = [without_timing(json.loads(line), ignore) for line in b.read_text().splitlines() if line.strip()]
    for i, (x, y) in enumerate(zip(left, right, strict=False)):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            print(f"record {i} differs in {keys}:\n  {x}\n  {y}")
            return 1
    if len(left) != len(right):
        print(f"{a} has {len(left)} records, {b} has {len(right)}")
        return 1
    print(f"identical without timing fields: {len(left)} records")
    return 0


def train(run: Path, out: Path, tokens: int, extra: list[str]) -> int:
    from smelt.cli.pipeline import QUICKSTART_CONFIG
    from smelt.config import load_config
    from smelt.run.training import with_goodput
    from smelt.train.trainer import train as train_model

    overrides = [f"train.tokens={tokens}", "train.eval_every=20", "train.eval_tokens=8192",
                 "checkpoint.every_steps=20", f"run.dir={json.dumps(str(out.parent))}",
                 f"run.name={json.dumps(out.name)}", *extra]  # fmt: skip
    cfg = load_config(QUICKSTART_CONFIG, overrides)
    summary = with_goodput(
        cfg, out / "train", train_model(cfg, run / "tokens", run / "tokenizer", out / "train")
    )
    print(json.dumps({k: summary[k] for k in ("steps", "final_train_loss", "final_val_loss")}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("train")
    p.add_argument("run", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--tokens", type=int, default=4096 * 45)
    p.add_argument("--set", dest="overrides", action="append", default=[], help="e.g. model.preset=tiny-1m")
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument(
        "--ignore", action="append", default=[], metavar="KEY",
        help="also leave out KEY, e.g. config_hash when the config schema gained keys in between",
    )  # fmt: skip
    args = parser.parse_args()
    if args.action == "compare":
        return compare(args.a, args.b, frozenset(args.ignore))
    return train(args.run, args.out, args.tokens, args.overrides)


if __name__ == "__main__":
    sys.exit(main())
