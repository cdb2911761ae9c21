"""The speedrun's lever sweep: held-out bits per byte at equal tokens (or equal FLOPs, for the shapes).

Each lever is one `smelt train` of the quickstart's data with the overrides below, one process at a time,
scored once at the end on the whole validation split; the GPT-2-style baseline (bench/speedrun_gpt2.py)
runs at 3 LRs on the same shards, tokens, batch and sequence. Bits per byte at equal tokens do not depend
on how busy the machine is; the tokens/s beside them do, and the result file records the load average.

    python bench/speedrun_levers.py --work DIR [--only NAME,NAME] [--threads 1] [--seed N]
    python bench/speedrun_levers.py --work DIR --only baseline --baseline-lr 1.5e-3 --long-tokens 4005888

`--seed N` trains the levers at run.seed = N, which the prepared data must share (curate, tokenizer and
tokenize with --set run.seed=N). `--baseline-lr` skips the baseline's LR sweep and runs that LR for
--long-tokens, stopping below xz.

DIR must hold the quickstart's prepared data (`smelt curate/tokenizer train/tokenize
configs/quickstart.toml --set run.dir=DIR`, or a bench/speedrun.py --work DIR run). It writes
bench/results/speedrun_levers.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, smelt_env, write_result

sys.path.insert(0, str(REPO / "src"))

TOKENS = 307_200  # 75 steps of 4,096 tokens
# The reference the levers move from, pinned whatever configs/quickstart.toml now says: AdamW at 3e-3,
# cosine to 10%, sequence 256, batch 16 x 256, tied head, no QK-norm; the shape comes with each lever.
SHAPE = ["model.preset=", "model.n_kv_heads=0", "model.max_seq_len=256", "model.qk_norm=false",
         "model.tie_embeddings=true", "train.optimizer=adamw", "train.lr=3e-3", "train.schedule=cosine",
         "train.min_lr_ratio=0.1", "train.seq_len=256", "train.micro_batch=16", "train.batch_tokens=4096",
         "train.warmup_tokens=20480", "train.on_grad_spike=log"]  # fmt: skip
D128 = ["model.d_model=128", "model.n_layers=4", "model.n_heads=4"]
MUON = ["train.optimizer=muon"]
B2048 = ["train.batch_tokens=2048", "train.micro_batch=8"]
WSD = ["train.schedule=wsd", "train.decay_fraction=0.3", "train.min_lr_ratio=0.0"]
# name: (overrides, what it tests). The shapes get the tokens that give the reference's FLOPs
# (smelt.model.flops.flops_per_token at vocabulary 4,096 and sequence 256).
LEVERS: dict[str, tuple[list[str], str]] = {
    "base": ([*D128, f"train.tokens={TOKENS}"], "AdamW, lr 3e-3, cosine to 10%"),
    "lr6e3": ([*D128, f"train.tokens={TOKENS}", "train.lr=6e-3"], "AdamW at twice the LR"),
    "muon": ([*D128, f"train.tokens={TOKENS}", *MUON], "Muon (0.02) for the hidden matrices"),
    "m_d192L4": (["model.d_model=192", "model.n_layers=4", "model.n_heads=6", "train.tokens=167936", *MUON],
                 "Muon, wider (d 192) at the reference's FLOPs"),
    "m_d96L4": (["model.d_model=96", "model.n_layers=4", "model.n_heads=3", "train.tokens=487424", *MUON],
                "Muon, narrower (d 96) at the reference's FLOPs"),
    "m_wsd": ([*D128, f"train.tokens={TOKENS}", *MUON, *WSD], "Muon, WSD: the last 30% of steps decay to 0 (1-sqrt)"),
    "m_b2048": ([*D128, f"train.tokens={TOKENS}", *MUON, *B2048],
                "Muon, half the batch (twice the steps)"),
    "m_qknorm": ([*D128, f"train.tokens={TOKENS}", *MUON, "model.qk_norm=true"], "Muon, QK-norm"),
    "m_untied": ([*D128, f"train.tokens={TOKENS}", *MUON, "model.tie_embeddings=false"], "Muon, untied head"),
    "m_b2048_wsd": ([*D128, f"train.tokens={TOKENS}", *MUON, *B2048, *WSD], "Muon, half the batch and WSD"),
    "m_b1024_wsd": ([*D128, f"train.tokens={TOKENS}", *MUON, "train.batch_tokens=1024", "train.micro_batch=4", *WSD],
                    "Muon, a quarter of the batch and WSD"),
    "m_b2048_wsd_qk": ([*D128, f"train.tokens={TOKENS}", *MUON, *B2048, *WSD, "model.qk_norm=true"],
                       "Muon, half the batch, WSD and QK-norm"),
    "m_b2048_wsd_s128": ([*D128, f"train.tokens={TOKENS}", *MUON, *B2048, *WSD, "train.seq_len=128",
                          "train.micro_batch=16"], "Muon, half the batch, WSD, sequence 128 (16 x 128)"),
}  # fmt: skip
# The recipe as configs/quickstart.toml has it (tiny-1m's 2 key/value heads, Muon 0.02, WSD over the last
# 30%, 16 x 128 per step) at the levers' tokens: the reference of the levers below.
RECIPE = [*D128, "model.n_kv_heads=2", *MUON, *WSD, "train.batch_tokens=2048", "train.seq_len=128",
          "train.micro_batch=16"]  # fmt: skip
# Tokens that give the recipe's FLOPs at TOKENS (flops_per_token at sequence 128): a shape or vocabulary
# at fixed FLOPs, rounded down to whole steps of 2,048 tokens.
LEVERS.update({
    "q": ([*RECIPE, f"train.tokens={TOKENS}"], "the quickstart's recipe (2 KV heads)"),
    "q_relu2": ([*RECIPE, f"train.tokens={TOKENS}", "model.mlp=relu2"], "recipe, ReLU² MLP (4d)"),
    "q_ve": ([*RECIPE, f"train.tokens={TOKENS}", "model.value_embeddings=true"],
             "recipe, value embeddings (layers 2 and 4)"),
    "q_mlr01": ([*RECIPE, f"train.tokens={TOKENS}", "train.muon_lr=0.01"], "recipe, Muon LR 0.01"),
    "q_mlr03": ([*RECIPE, f"train.tokens={TOKENS}", "train.muon_lr=0.03"], "recipe, Muon LR 0.03"),
    "q_mlr04": ([*RECIPE, f"train.tokens={TOKENS}", "train.muon_lr=0.04"], "recipe, Muon LR 0.04"),
    "q_wu4k": ([*RECIPE, f"train.tokens={TOKENS}", "train.warmup_tokens=4096"], "recipe, warmup 2 steps (4,096 tokens)"),
    "q_wu10k": ([*RECIPE, f"train.tokens={TOKENS}", "train.warmup_tokens=10240"],
                "recipe, warmup 5 steps (10,240 tokens)"),
    "q_dec20": ([*RECIPE, f"train.tokens={TOKENS}", "train.decay_fraction=0.2"], "recipe, WSD decay over the last 20%"),
    "q_dec50": ([*RECIPE, f"train.tokens={TOKENS}", "train.decay_fraction=0.5"], "recipe, WSD decay over the last 50%"),
    "q_d96": ([*RECIPE, "model.d_model=96", "model.n_heads=4", "model.n_kv_heads=2", "train.tokens=493568"],
              "recipe, d 96 (4 heads of 24) at the recipe's FLOPs"),
    # At the recipe's time rather than FLOPs: d 96's step costs 0.82 of d 128's CPU seconds on one core
    # (bench/speedrun_step_cost.py), not FLOPs' 0.62.
    "q_d96t": ([*RECIPE, "model.d_model=96", "model.n_heads=4", "model.n_kv_heads=2", "train.tokens=376832"],
               "recipe, d 96 (4 heads of 24) at the recipe's CPU time"),
    # The vocabularies need their own prepared data: --work DIR prepared with --set tokenizer.vocab_size=N.
    "q_v2048": ([*RECIPE, "tokenizer.vocab_size=2048", "train.tokens=374784"],
                "recipe, vocabulary 2,048 at the recipe's FLOPs"),
    "q_v8192": ([*RECIPE, "tokenizer.vocab_size=8192", "train.tokens=225280"],
                "recipe, vocabulary 8,192 at the recipe's FLOPs"),
})  # fmt: skip
OWN_DATA = ("q_v2048", "q_v8192")  # left out of a run without --only: their --work is another DIR
BASELINE_LRS = (1.5e-3, 3e-3, 6e-3)


def lever_figures(metrics: Path, split: dict) -> dict:
    """Final bits per byte, tokens, parameters, FLOPs per token and median tokens/s of one run."""
    from speedrun import to_bpb

    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    start = next(r for r in records if r.get("event") == "start")
    final = [r for r in records if r["kind"] == "eval" and "val_loss" in r][-1]
    rates = [r["tokens_per_s"] for r in records if r["kind"] == "train" and r.get("tokens_per_s")]
    return {"tokens": final["tokens"], "val_loss": round(final["val_loss"], 4),
            "bits_per_byte": round(to_bpb(final["val_loss"], split), 4), "params": start["params_total"],
            "flops_per_token": start["flops_per_token"], "tokens_per_s_under_load": round(statistics.median(rates)),
            "eval_s": final["eval_s"]}  # fmt: skip


def run_lever(work: Path, name: str, threads: int, split: dict, seed: int = 0) -> dict:
    """One lever's run; `seed` (0: the config's run.seed) sets the run's seed for a second draw."""
    overrides = [f"run.dir={work}", f"train.threads={threads}", "train.eval_budget=0", "train.eval_every=0",
                 "train.eval_tokens=0", "train.log_every=5", *SHAPE, *LEVERS[name][0],
                 *([f"run.seed={seed}"] if seed else [])]  # fmt: skip
    shutil.rmtree(work / "quickstart" / "train", ignore_errors=True)
    env = smelt_env(OMP_NUM_THREADS=str(threads), SMELT_QUIET="1")
    config = str(REPO / "configs" / "quickstart.toml")
    subprocess.run([sys.executable, "-m", "smelt.cli", "train", config, *[x for o in overrides for x in ("--set", o)]],
                   check=True, env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    return {**lever_figures(work / "quickstart" / "train" / "metrics.jsonl", split), "what": LEVERS[name][1],
            "overrides": LEVERS[name][0], **({"seed": seed} if seed else {})}  # fmt: skip


def run_baseline_sweep(
    work: Path, threads: int, split: dict, long_tokens: int, lr: float = 0.0, eval_every: int = 40
) -> dict:
    """The baseline at each LR for TOKENS, then its best LR (or `lr`, skipping the sweep) for
    `long_tokens`, scored every `eval_every` steps and stopped at the first evaluation below xz."""
    import torch
    from speedrun import crossing, validator
    from speedrun_gpt2 import GPT2Shape, run_baseline

    torch.set_num_threads(threads)
    tokens = work / "quickstart" / "tokens"
    # The recipe's shape, sequence (128) and batch (2,048 tokens); its own LRs.
    validate, precision = validator(tokens, 128, 16, "bf16", split)
    shape = GPT2Shape(4096, 128, 4, 4, 128)
    common = {
        "seed": 1,
        "batch_tokens": 2048,
        "warmup_tokens": 20480,
        "validate": validate,
        "precision": precision,
    }
    out = {}
    for lr_ in () if lr else BASELINE_LRS:
        r = run_baseline(tokens, shape, lr=lr_, tokens=TOKENS, eval_every=10**9, **common)
        out[f"gpt2_lr{lr_:g}"] = {"tokens": r["tokens_run"], "bits_per_byte": round(r["curve"][-1][3], 4),
                                 "params": r["params"], "flops_per_token": r["flops_per_token"],
                                 "tokens_per_s_under_load": round(r["tokens_run"] / r["train_s"]),
                                 "what": f"GPT-2-style baseline, AdamW lr {lr_:g}"}  # fmt: skip
    best = lr or min(BASELINE_LRS, key=lambda x: out[f"gpt2_lr{x:g}"]["bits_per_byte"])
    r = run_baseline(tokens, shape, lr=best, tokens=long_tokens, eval_every=eval_every,
                     stop_below=split["xz_bits_per_byte"], **common)  # fmt: skip
    out["gpt2_to_target"] = {"lr": best, "tokens_budget": long_tokens, "to_target": crossing(r["curve"], split["xz_bits_per_byte"]),
                             "best_bits_per_byte": round(min(c[3] for c in r["curve"]), 4), "tokens_run": r["tokens_run"],
                             "train_s_under_load": round(r["train_s"], 1), "eval_s_under_load": round(r["eval_s"], 1),
                             "curve": [(c[0], c[1], c[2], round(c[3], 4)) for c in r["curve"]],
                             "what": f"GPT-2-style baseline at lr {best:g} for {long_tokens:,} tokens"}  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="directory whose quickstart/ holds the prepared data")
    p.add_argument("--only", default="", help="comma-separated lever names (and/or 'baseline'); default all")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="run.seed for the levers (0: the config's, 1337)")
    p.add_argument("--out", default="speedrun_levers", help="result name under bench/results/")
    p.add_argument("--long-tokens", type=int, default=1_000_000, help="the baseline's run to the target")
    p.add_argument("--baseline-lr", type=float, default=0.0, help="skip the LR sweep: this LR to the target")
    p.add_argument(
        "--baseline-eval-every", type=int, default=40, help="steps between the long run's evaluations"
    )
    a = p.parse_args()
    from speedrun import split_figures

    work = Path(a.work)
    split = split_figures(work / "quickstart")
    names = a.only.split(",") if a.only else [*(n for n in LEVERS if n not in OWN_DATA), "baseline"]
    load_before, started = os.getloadavg(), time.time()
    results = {}
    for name in names:
        if name == "baseline":
            results.update(
                run_baseline_sweep(
                    work, a.threads, split, a.long_tokens, a.baseline_lr, a.baseline_eval_every
                )
            )
        else:
            results[name + (f"@seed{a.seed}" if a.seed else "")] = run_lever(
                work, name, a.threads, split, a.seed
            )
    write_result(a.out, {
        "levers": results, "xz_bits_per_byte": round(split["xz_bits_per_byte"], 4), "threads": a.threads,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()], "wall_s": round(time.time() - started),
    })  # fmt: skip


if __name__ == "__main__":
    main()
