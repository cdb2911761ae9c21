"""Dense vs mixture of experts at the same active FLOPs per token, on the shared corpus.

The data stages (curate prose and code from the shared corpus, a 4,096-token BPE, token shards) run
once through the smelt CLI; then two models train on the same tokens, to the same token count, with
the same optimizer settings: a dense model of d_ff F and an MoE model whose every layer has E experts
of d_ff F / k, top-k, so a token's MLP computes the same as the dense one (the router adds
6 d E FLOPs per layer). Figures: held-out bits per byte of each (validation split, documents kept
apart as in training), training tokens/s of each, the MoE's final max/mean expert load per layer,
total and active parameters. Writes bench/results/moe.json.

Usage: python bench/moe.py [--tokens N] [--d-model D] [--layers L] [--experts E] [--top-k K] [--runs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from common import REPO, shared_data, write_result

CONFIG = """\
[run]
name = "moe-data"
dir = "{runs}"
seed = 5

[data]
min_chars = 200
max_chars = 5_000_000
val_fraction = 0.05

[[data.sources]]
name = "prose"
format = "text"
root = "{shared}/corpus/prose"
include = ["tinyshakespeare/*.txt", "paulgraham/*.txt", "wikitext-2-raw/*.raw", "wikitext-2-raw/*.txt"]

[[data.sources]]
name = "code"
format = "jsonl"
root = "{shared}/corpus/code"
include = ["*.jsonl"]
id_field = "path"
split_unit = "field:path"
code = true

[tokenizer]
vocab_size = 4096
sample_bytes = 4_000_000

[tokens]
mixture = {{ prose = 0.7, code = 0.3 }}
workers = 1
"""


def smelt(*argv: str) -> None:
    from smelt.cli import main

    code = main(list(argv))
    if code != 0:
        raise SystemExit(f"smelt {' '.join(argv[:3])} ... exited {code}")


def train_one(config: Path, run: Path, name: str, model: dict, tokens: int, seq_len: int) -> dict:
    """Train one model on the data run's tokens; its summary, final moe record and held-out figures."""
    import torch

    from smelt.checkpoint.store import latest_checkpoint, load_model
    from smelt.config import config_from_dict, load_config
    from smelt.eval.heldout import heldout_bits_per_byte
    from smelt.train.trainer import train

    raw = json.loads(json.dumps(load_config(config).to_dict()))
    raw["model"] = {**raw["model"], **model}
    raw["train"] = {
        **raw["train"],
        "seq_len": seq_len, "micro_batch": 16, "batch_tokens": 16 * seq_len, "tokens": tokens, "lr": 3e-3,
        "warmup_tokens": tokens // 20, "log_every": 20, "eval_every": 0, "eval_tokens": 16_384,
        "precision": "fp32", "threads": 0,
    }  # fmt: skip
    raw["checkpoint"] = {**raw["checkpoint"], "every_steps": 10**9, "keep_last": 1}
    cfg = config_from_dict(raw)
    out = run / "bench" / name
    summary = train(cfg, run / "tokens", run / "tokenizer", out)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    moe = [r for r in lines if r["kind"] == "moe"]
    checkpoint, _ = load_model(latest_checkpoint(out / "checkpoints"))
    eos = json.loads((run / "tokens" / "meta.json").read_text())["eos_id"]
    torch.manual_seed(0)
    heldout = heldout_bits_per_byte(
        checkpoint.eval(), run / "tokens", run / "documents", eos, seq_len, 16, 400_000, doc_masking=True
    )
    return {"summary": summary, "moe": moe[-1] if moe else None, "heldout": heldout["overall"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000, help="training tokens of each model")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-ff", type=int, default=384, help="the dense model's SwiGLU width")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--runs", default=str(REPO / "runs" / "bench-moe"), help="where the runs go")
    args = parser.parse_args()
    if args.d_ff % args.top_k:
        raise SystemExit(f"--d-ff ({args.d_ff}) must be a multiple of --top-k ({args.top_k})")
    shared = shared_data("corpus/prose", "corpus/code")
    os.environ.setdefault("SMELT_SHARED_DATA", str(shared))
    runs = Path(args.runs).resolve()
    runs.mkdir(parents=True, exist_ok=True)
    config = runs / "moe-data.toml"
    config.write_text(CONFIG.format(runs=runs.as_posix(), shared=shared.resolve().as_posix()))
    started = time.time()
    for stage in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        smelt(*stage, str(config))
    run = runs / "moe-data"

    from smelt.model.flops import count_params, flops_per_token
    from smelt.model.sizing import preset_config

    shape = {
        "d_model": args.d_model, "n_layers": args.layers, "n_heads": max(1, args.d_model // 32),
        "n_kv_heads": max(1, args.d_model // 64), "max_seq_len": args.seq_len,
    }  # fmt: skip
    dense = {**shape, "d_ff": args.d_ff}
    sparse = {
        **dense, "moe_experts": args.experts, "moe_top_k": args.top_k, "moe_d_ff": args.d_ff // args.top_k,
        "moe_aux_loss": 0.01, "moe_z_loss": 0.001,
    }  # fmt: skip
    vocab = json.loads((run / "tokenizer" / "smelt.json").read_text())["vocab_size"]
    figures: dict[str, object] = {"train_tokens": args.tokens, "seq_len": args.seq_len}
    for name, model in (("dense", dense), ("moe", sparse)):
        cfg = preset_config("tiny-1m", **model)
        counts = count_params(cfg, vocab)
        result = train_one(config, run, name, model, args.tokens, args.seq_len)
        figures[f"{name}_params_total"] = counts["total"]
        figures[f"{name}_params_active"] = counts["active"]
        figures[f"{name}_flops_per_token"] = flops_per_token(cfg, vocab, args.seq_len)
        figures[f"{name}_heldout_bits_per_byte"] = round(result["heldout"]["bits_per_byte"], 4)
        figures[f"{name}_heldout_loss_nats"] = round(result["heldout"]["loss"], 4)
        figures[f"{name}_final_train_loss"] = round(result["summary"]["final_train_loss"], 4)
        figures[f"{name}_tokens_per_s"] = round(result["summary"]["tokens_per_s"], 1)
        if result["moe"]:
            ratios = result["moe"]["moe_max_mean"]
            figures["moe_final_max_mean_load_by_layer"] = ratios
            figures["moe_final_max_mean_load_worst"] = max(ratios)
            figures["moe_final_router_entropy_by_layer"] = result["moe"]["moe_entropy"]
    figures["moe_experts"], figures["moe_top_k"] = args.experts, args.top_k
    figures["wall_time_s"] = round(time.time() - started, 1)
    figures["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_result("moe", figures)


if __name__ == "__main__":
    main()
