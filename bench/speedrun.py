"""Speedrun: seconds of training until held-out bits per byte beat xz -9e on the quickstart's validation split.

`python bench/speedrun.py` prepares the quickstart's data (curate, tokenizer, tokenize; each timed, as
they count toward the pipeline), trains configs/quickstart.toml with `smelt train` for 3 seeds, scoring
the whole validation split every --eval-every steps (evaluation time is excluded from the training time
and reported beside it), then trains a GPT-2-style model written in bench/speedrun_gpt2.py on the same
shards, tokens, batch and sequence: each of 3 LRs for smelt's tokens (the loss at equal tokens), then
the best LR per seed until it beats xz or has run --baseline-factor x smelt's tokens. It writes
bench/results/speedrun.json: time to target and loss at equal tokens, tokens/s and MFU, min / median /
max over the seeds, the machine, its precision and the load average while it ran.

Bits per byte from a validation loss: loss x tokens scored / ln 2 / UTF-8 bytes of the split's documents
(the tokens include each document's EOS, which the model pays for with no bytes in return, as
`smelt eval` counts it). xz -9e compresses exactly those bytes.

`--quick` is one seed, the baseline at the first LR and no longer than smelt's tokens: a timing rerun on a
quiet machine. `--threads` sets train.threads and OMP_NUM_THREADS (0: every core).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import REPO, smelt_env, write_result

sys.path.insert(0, str(REPO / "src"))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "quickstart.toml"))
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override the config for smelt's runs and the shared shapes (repeatable)",
    )
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds")
    p.add_argument("--eval-every", type=int, default=10, help="steps between validations of the whole split")
    p.add_argument(
        "--baseline-lrs", default="1.5e-3,3e-3,6e-3", help="the baseline's LRs to pick the best of"
    )
    p.add_argument(
        "--baseline-factor",
        type=float,
        default=4.0,
        help="the baseline runs until it beats xz or has seen this x smelt's tokens",
    )
    p.add_argument("--no-baseline", action="store_true")
    p.add_argument("--threads", type=int, default=0, help="train.threads and OMP_NUM_THREADS (0: every core)")
    p.add_argument("--quick", action="store_true", help="one seed, one baseline LR, baseline at 1x tokens")
    p.add_argument("--work", default="", help="working directory (default: a temporary one)")
    p.add_argument("--out", default="speedrun", help="result name under bench/results/")
    return p.parse_args(argv)  # fmt: skip


def run_stage(args: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "smelt.cli", *args], check=True, env=env, stdout=subprocess.DEVNULL)
    return round(time.perf_counter() - started, 2)


def prepare(config: str, sets: list[str], env: dict[str, str]) -> dict[str, float]:
    """Curate, tokenizer and tokenize in their own processes, each timed (process start-up included)."""
    flags = [a for s in sets for a in ("--set", s)]
    return {
        "curate_s": run_stage(["curate", config, *flags], env),
        "tokenizer_s": run_stage(["tokenizer", "train", config, *flags], env),
        "tokenize_s": run_stage(["tokenize", config, *flags], env),
    }


def split_figures(run_dir: Path) -> dict[str, float]:
    """Bytes, tokens and xz -9e / gzip -9 bits per byte of the validation split."""
    from smelt.documents import read_texts
    from smelt.eval.compress import gzip_bits_per_byte, xz_bits_per_byte
    from smelt.tokens.shards import ShardSet, list_sources

    data, tokens = b"", 0
    for source in list_sources(run_dir / "tokens", "val"):
        data += b"".join(t.encode("utf-8") for t in read_texts(run_dir / "documents", "val", source))
        tokens += ShardSet(run_dir / "tokens", "val", source).total_tokens
    return {"val_bytes": len(data), "val_tokens": tokens, "xz_bits_per_byte": xz_bits_per_byte(data),
            "gzip_bits_per_byte": gzip_bits_per_byte(data)}  # fmt: skip


def to_bpb(loss: float, split: dict[str, float]) -> float:
    return loss * split["val_tokens"] / math.log(2) / split["val_bytes"]


def smelt_curve(metrics: Path, split: dict[str, float]) -> tuple[list[tuple], dict]:
    """[(step, tokens, training seconds to that step, bits per byte)] from a run's metrics.jsonl (train
    records every step: their step_time_s summed), and the run's other figures."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    start = next(r for r in records if r.get("event") == "start")
    train_s, elapsed, curve, mfu, eval_s = 0.0, {}, [], [], 0.0
    for r in records:
        if r["kind"] == "train":
            train_s += r["step_time_s"]
            elapsed[r["step"]] = train_s
            if r.get("mfu") is not None:
                mfu.append(r["mfu"])
        elif r["kind"] == "eval" and "val_loss" in r and not r.get("inloop"):
            curve.append((r["step"], r["tokens"], round(elapsed[r["step"]], 3), to_bpb(r["val_loss"], split)))
            eval_s += r["eval_s"]
    return curve, {"train_s": train_s, "eval_s": eval_s, "mfu": statistics.median(mfu) if mfu else None,
                   "peak_flops": start.get("peak_flops"), "precision": start.get("precision"),
                   "params": start.get("params_total"), "flops_per_token": start.get("flops_per_token")}  # fmt: skip


def crossing(curve: list[tuple], target: float) -> dict | None:
    """The first evaluation below `target`: its training seconds and tokens (None: never)."""
    for step, tokens, seconds, bpb in curve:
        if bpb < target:
            return {"step": step, "tokens": tokens, "train_s": seconds, "bits_per_byte": round(bpb, 4)}
    return None


def train_smelt(
    a: argparse.Namespace, seed: int, sets: list[str], run_dir: Path, split: dict, env: dict
) -> dict:
    sets = [*sets, f"train.eval_every={a.eval_every}", "train.eval_tokens=0", "train.eval_budget=0",
            "train.log_every=1", f"train.threads={a.threads}", "checkpoint.every_steps=0"]  # fmt: skip
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "smelt.cli", "train", a.config, "--force",
                    *[x for s in sets for x in ("--set", s)]], check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    wall = time.perf_counter() - started
    curve, figures = smelt_curve(run_dir / "train" / "metrics.jsonl", split)
    tokens = curve[-1][1]
    return {"seed": seed, "curve": curve, "to_target": crossing(curve, split["xz_bits_per_byte"]),
            "final_bits_per_byte": round(curve[-1][3], 4), "tokens": tokens, "process_wall_s": round(wall, 1),
            "tokens_per_s": round(tokens / figures["train_s"], 1), **figures}  # fmt: skip


def validator(tokens_dir: Path, seq_len: int, batch: int, precision_name: str, split: dict):
    """validate(model) -> bits per byte on the whole validation split, with smelt's own windows and
    scoring (no document masking; sources weighted by their tokens, so the loss is per token)."""
    import torch

    from smelt.tokens.shards import ShardSet, list_sources
    from smelt.train.evaluation import Validation
    from smelt.train.precision import resolve_precision

    precision = resolve_precision(precision_name, torch.device("cpu"))
    sources = list_sources(tokens_dir, "val")
    weights = {s: float(ShardSet(tokens_dir, "val", s).total_tokens) for s in sources}
    validation = Validation(
        tokens_dir, sources, seq_len, 0, batch, precision, torch.device("cpu"), None, weights
    )

    def validate(model) -> float:
        with torch.no_grad():
            return to_bpb(validation.run(model, show=False).loss, split)

    return validate, precision.name


def train_baselines(a: argparse.Namespace, cfg, split: dict, smelt_runs: list[dict]) -> dict:
    """Each LR for smelt's tokens (seed 1), then the best LR per seed until xz or factor x the tokens."""
    import torch
    from speedrun_gpt2 import GPT2Shape, run_baseline

    torch.set_num_threads(a.threads or os.cpu_count() or 1)
    m, tc = cfg.model, cfg.train
    vocab = json.loads((a.run_dir / "tokenizer" / "smelt.json").read_text())["padded_vocab_size"]
    shape = GPT2Shape(vocab, m.d_model, m.n_layers, m.n_heads, tc.seq_len)
    validate, precision = validator(a.run_dir / "tokens", tc.seq_len, tc.micro_batch, tc.precision, split)
    tokens = smelt_runs[0]["tokens"]
    common = {"shape": shape, "batch_tokens": tc.batch_tokens, "warmup_tokens": tc.warmup_tokens or tokens // 50,
              "eval_every": a.eval_every, "validate": validate, "precision": precision}  # fmt: skip
    lrs = [float(x) for x in a.baseline_lrs.split(",")]
    sweep = {
        lr: run_baseline(a.run_dir / "tokens", lr=lr, seed=a.seeds[0], tokens=tokens, **common) for lr in lrs
    }
    best = min(lrs, key=lambda lr: sweep[lr]["curve"][-1][3])
    runs = []
    for seed in a.seeds:
        r = run_baseline(a.run_dir / "tokens", lr=best, seed=seed, tokens=int(tokens * a.baseline_factor),
                         stop_below=split["xz_bits_per_byte"], **common)  # fmt: skip
        r["to_target"] = crossing(r["curve"], split["xz_bits_per_byte"])
        r["best_bits_per_byte"] = round(min(row[3] for row in r["curve"]), 4)
        r["tokens_per_s"] = round(r["tokens_run"] / r["train_s"], 1)
        runs.append({"seed": seed, **r})
    return {"shape": vars(shape), "lr_sweep": {str(lr): round(sweep[lr]["curve"][-1][3], 4) for lr in lrs},
            "lr_sweep_tokens": tokens, "best_lr": best, "runs": runs}  # fmt: skip


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> dict:
    a = parse_args(argv)
    a.seeds = [int(s) for s in a.seeds.split(",")][: 1 if a.quick else None]
    if a.quick:
        a.baseline_lrs, a.baseline_factor = a.baseline_lrs.split(",")[0], 1.0
    threads = str(a.threads) if a.threads else ""
    env = smelt_env(**({"OMP_NUM_THREADS": threads} if threads else {}), SMELT_QUIET="1")
    from smelt.config import load_config

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(a.work or tmp)
        load_before, preps, smelt_runs = load_average(), [], []
        for seed in a.seeds:  # the seed draws the tokenizer's sample too: each seed prepares its own data
            sets = [f"run.dir={work / f'seed{seed}'}", f"run.seed={seed}", *a.set]
            cfg = load_config(a.config, sets)
            run_dir = work / f"seed{seed}" / cfg.run.name
            preps.append(prepare(a.config, sets, env))
            split = split_figures(run_dir)
            smelt_runs.append(train_smelt(a, seed, sets, run_dir, split, env))
        a.run_dir = work / f"seed{a.seeds[0]}" / cfg.run.name
        split = split_figures(a.run_dir)
        baseline = None if a.no_baseline else train_baselines(a, cfg, split, smelt_runs)
        load_after = load_average()
    prep = {key: [p[key] for p in preps] for key in preps[0]}
    return report(a, cfg, prep, split, smelt_runs, baseline, load_before, load_after)


def report(a, cfg, prep, split, smelt_runs, baseline, load_before, load_after) -> dict:
    """The result file's figures (and print them)."""
    from speedrun_report import summarize

    figures = summarize(a, cfg, prep, split, smelt_runs, baseline, load_before, load_after)
    write_result(a.out, figures)
    return figures


if __name__ == "__main__":
    main()
