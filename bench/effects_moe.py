"""The MoE and Muon effects of bench/effects.py (issue 36, items 6 and 8).

Both train tiny-1m-shaped models on prose and code from the shared corpus (70/30, a 2,048-token BPE)
and score held-out loss on the validation split with `smelt eval`. The data stages run once per seed
(`smelt curate`, `smelt tokenizer train`, `smelt tokenize` in RUNS/data-SEED); every model of that seed
trains on the same token shards (its run directory links them) with `smelt train`, to the same token
count, so that the models of one seed differ only in what is compared.

MoE: a dense tiny-1m (d_ff 384) against the same shape whose every MLP is EXPERTS experts of d_ff
384 / TOP_K, top-TOP_K, so a token's MLP costs the dense one's FLOPs (the router adds 2 d E per token
and layer). The MoE that counts balances with both the per-expert bias of auxiliary-loss-free balancing
(DeepSeek-V3, `moe_bias_rate`) and the auxiliary load-balancing loss (`moe_aux_loss`); each alone is
reported beside it (aux-loss-free against the auxiliary loss), on the first seed. After balancing:
the worst layer's max/mean expert load over the last log window.

Both arms train with the quickstart's recipe (configs/quickstart.toml): 375 steps of 2,048 tokens
(768,000 tokens), Muon at 0.02 for every matrix inside the blocks (attention, the dense MLP, the router
and each expert's matrices, orthogonalised expert by expert) and AdamW at 3e-3 for the embedding, norms
and head, 10 warmup steps, WSD with the last half of the steps decaying to 0. It leaves the loss
plateau near 6.4 nats within about 80 steps, so the comparison is between trained models, not between
the times the runs left the plateau. The MoE trails dense by up to 0.16 nats of training loss around
step 60 and overtakes it at step 130-220, so the gap grows with the steps: at 250 steps (512,000
tokens; bench/effects.py's run, 2026-11-28) dense 4.662, 4.672 and 4.631 held-out nats against the
MoE's 4.636, 4.586 and 4.612, +0.026, +0.086 and +0.019 (mean 0.044, spread 0.037), positive on every
seed but not shown; worst load 1.08-1.10; the auxiliary loss alone 4.631 with a worst load of 1.32
(the target missed), the bias alone 4.637 with 1.07. At 375 steps (the same code, through train_and_score, two
models at a time while the machine was loaded): dense 4.333, 4.366 and 4.304 against
4.262, 4.221 and 4.234, +0.071, +0.145 and +0.070 (mean 0.095, spread 0.043: shown, narrowly), worst
load 1.04-1.07; on seed 0 the auxiliary loss alone 4.275 (worst load 1.30), the bias alone 4.277
(1.13). bench/results/effects.json holds the 250-step run until bench/effects.py runs this design.

Designs that failed (dense minus MoE, held-out nats): 300 steps of 512 tokens with AdamW and a cosine
schedule ended near 5.9 nats, barely off the plateau, and the sign followed when each run left it:
+0.04, +0.27 and -0.05 at lr 1e-2, -0.23, +0.12 and +0.15 at 1e-2 with 1,024-token steps, +0.15,
-0.12 and +0.09 at 3e-3. At 250 steps of this recipe on seed 0: AdamW (3e-3) for both arms ended
at 5.497 (dense) and 5.514 (MoE), -0.017; Muon while the 3-D expert weights still fell to AdamW at
3e-3 (before smelt.train.optim gave them Muon) 4.662 and 4.922, -0.260, a comparison of optimizers,
not of MLPs.

Muon (report only): AdamW and Muon (Muon for the 2-D hidden matrices, AdamW for the rest at train.lr
1e-2) at equal tokens, 300 steps of 512 tokens, each at the best of three LRs on the first seed, then
all seeds at each one's best.

$EFFECTS_MOE_STEPS, $EFFECTS_MOE_BATCH, $EFFECTS_MOE_LR, $EFFECTS_MOE_OPTIMIZER (muon or adamw),
$EFFECTS_MOE_MUON_LR, $EFFECTS_MOE_EXPERTS, $EFFECTS_MOE_TOP_K, $EFFECTS_MOE_BIAS_RATE and
$EFFECTS_MOE_VARIANT_SEEDS change the MoE design (for trying others).
"""

from __future__ import annotations

import os
from pathlib import Path

from effects_common import EVAL, MIXED_TINY, effect, read_json, records, smelt, stats

CONFIG = (
    """\
[run]
name = "{name}"
dir = "{runs}"
seed = {seed}

"""
    + MIXED_TINY
    + """{model}

[train]
seq_len = 128
micro_batch = {micro_batch}
batch_tokens = {batch}
tokens = {tokens}
lr = {lr}
{optimizer}
threads = 1
warmup_tokens = {warmup}
{schedule}
log_every = {log_every}
eval_every = 0
eval_tokens = 8_192
spike_triage = "off"

[checkpoint]
every_steps = 0
keep_last = 1

"""
    + EVAL
)
# The MoE effect's design: the quickstart's recipe (configs/quickstart.toml) at this corpus.
BATCH = int(os.environ.get("EFFECTS_MOE_BATCH", "2048"))  # tokens per step
MICRO_BATCH = BATCH // 128  # sequences of 128 per forward: one micro step per optimizer step
STEPS = int(os.environ.get("EFFECTS_MOE_STEPS", "375"))  # every model's steps: 768,000 tokens at 375
LR = float(os.environ.get("EFFECTS_MOE_LR", "3e-3"))  # AdamW's peak LR (the embeddings and norms with Muon)
OPTIMIZER = os.environ.get("EFFECTS_MOE_OPTIMIZER", "muon")
MUON_LR = float(os.environ.get("EFFECTS_MOE_MUON_LR", "0.02"))
WARMUP = 20_480  # tokens: 10 steps of 2,048
SCHEDULE = 'schedule = "wsd"\ndecay_fraction = 0.5\nmin_lr_ratio = 0.0'
D_FF = 384  # tiny-1m's dense SwiGLU width (8/3 x 128, rounded up to a multiple of 64)
EXPERTS = int(os.environ.get("EFFECTS_MOE_EXPERTS", "8"))
TOP_K = int(os.environ.get("EFFECTS_MOE_TOP_K", "2"))
BIAS_RATE = float(os.environ.get("EFFECTS_MOE_BIAS_RATE", "1e-2"))
AUX_LOSS = 0.01
LOAD_TARGET = 1.3  # the worst layer's max/mean expert load after balancing, at most
LOG_EVERY = 20  # the load is measured over the last log window: 20 steps, 81,920 token copies a layer
MOE = f"moe_experts = {EXPERTS}\nmoe_top_k = {TOP_K}\nmoe_d_ff = {D_FF // TOP_K}\nmoe_z_loss = 0.001\n"
# The MoE that counts balances with both the bias and the auxiliary loss; each alone is reported.
VARIANTS = {
    "moe": MOE + f"moe_aux_loss = {AUX_LOSS}\nmoe_bias_rate = {BIAS_RATE}",
    "moe-aux": MOE + f"moe_aux_loss = {AUX_LOSS}\nmoe_bias_rate = 0.0",
    "moe-bias": MOE + f"moe_aux_loss = 0.0\nmoe_bias_rate = {BIAS_RATE}",
}
ADAMW_LRS = (3e-3, 1e-2, 3e-2)  # train.lr
MUON_LRS = (1e-2, 3e-2, 1e-1)  # train.muon_lr
VARIANT_SEEDS = int(os.environ.get("EFFECTS_MOE_VARIANT_SEEDS", "1"))  # seeds of each balancing alone
MUON_BATCH = 512
MUON_STEPS = 300  # the Muon effect's steps: 153,600 tokens
MUON_MICRO_BATCH = 4
MUON_REST_LR = 1e-2  # train.lr of the Muon runs: AdamW's for the embeddings, norms and head
COSINE = 'schedule = "cosine"'  # the Muon effect's schedule, after a warmup of 10% of the steps


def data_run(runs: Path, shared: Path, seed: int) -> Path:
    """The data stages of one seed (documents, tokenizer, token shards), run once."""
    run = runs / f"data-{seed}"
    if not (run / "tokens" / "meta.json").is_file():
        config = write_config(runs, shared, f"data-{seed}", seed)
        for stage in (["curate"], ["tokenizer", "train"], ["tokenize"]):
            smelt(*stage, str(config))
    return run


def moe_optimizer() -> str:
    """The MoE effect's [train] optimizer lines (both arms)."""
    return f'optimizer = "muon"\nmuon_lr = {MUON_LR}' if OPTIMIZER == "muon" else ""


def write_config(runs: Path, shared: Path, name: str, seed: int, model: str = "", optimizer: str | None = None,
                 steps: int = STEPS, lr: float = LR, batch: int = BATCH, micro_batch: int = MICRO_BATCH,
                 warmup: int | None = WARMUP, schedule: str = SCHEDULE) -> Path:  # fmt: skip
    """A run's config; warmup None is 10% of the steps."""
    runs.mkdir(parents=True, exist_ok=True)
    config = runs / f"{name}.toml"
    config.write_text(CONFIG.format(
        name=name, runs=runs.resolve(), shared=shared, seed=seed, model=model,
        optimizer=moe_optimizer() if optimizer is None else optimizer, batch=batch, micro_batch=micro_batch,
        tokens=steps * batch, warmup=steps * batch // 10 if warmup is None else warmup, schedule=schedule, lr=lr,
        log_every=LOG_EVERY,
    ))  # fmt: skip
    return config


def train_and_score(runs: Path, shared: Path, name: str, seed: int, model: str = "", **design) -> dict:
    """Train one model of `seed` on the seed's token shards (`design`: write_config's keywords) and score
    its last checkpoint held out: loss (nats), bits per byte, the last `moe` record of metrics.jsonl
    (None for a dense model), the training's wall time."""
    data = data_run(runs, shared, seed)
    config = write_config(runs, shared, name, seed, model, **design)
    steps = design.get("steps", STEPS)
    run = runs / name
    scored = run / "eval" / f"step_{steps:07d}.json"
    if not scored.is_file():
        for stage in ("documents", "tokenizer", "tokens"):
            link = run / stage
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to((data / stage).resolve(), target_is_directory=True)
        smelt("train", str(config), "--force")
        smelt("eval", str(config), "--checkpoint", str(steps), "--tasks", "")
    h = read_json(scored)["heldout"]["overall"]
    moe = records(run, "moe")
    summary = read_json(run / "train" / "summary.json") if (run / "train" / "summary.json").is_file() else {}
    return {"loss": h["loss"], "bits_per_byte": h["bits_per_byte"], "moe": moe[-1] if moe else None,
            "wall_time_s": summary.get("wall_time_s")}  # fmt: skip


def worst_load(scored: dict) -> float:
    """The worst layer's max/mean expert load over the run's last log window."""
    return max(scored["moe"]["moe_max_mean"])


def sizes(runs: Path, seed: int) -> dict:
    """Total and active parameters and FLOPs per token of the dense model and the MoE."""
    from smelt.model.flops import count_params, flops_per_token
    from smelt.model.sizing import preset_config

    vocab = read_json(runs / f"data-{seed}" / "tokenizer" / "smelt.json")["vocab_size"]
    moe = {"moe_experts": EXPERTS, "moe_top_k": TOP_K, "moe_d_ff": D_FF // TOP_K}
    out = {}
    for name, extra in (("dense", {}), ("moe", moe)):
        cfg = preset_config("tiny-1m", max_seq_len=128, **extra)
        counts = count_params(cfg, vocab)
        out[name] = {"params_total": counts["total"], "params_active": counts["active"],
                     "flops_per_token": flops_per_token(cfg, vocab, 128)}  # fmt: skip
    return out


def moe_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    dense = {seed: train_and_score(runs, shared, f"dense-{seed}", seed) for seed in seeds}
    sparse = {seed: train_and_score(runs, shared, f"moe-{seed}", seed, VARIANTS["moe"]) for seed in seeds}
    # Each balancing alone, for the report, on the first seeds only (the MoE runs are the costly ones).
    alone = seeds[:VARIANT_SEEDS]
    variants = {name: {seed: train_and_score(runs, shared, f"{name}-{seed}", seed, VARIANTS[name]) for seed in alone}
                for name in ("moe-aux", "moe-bias")}  # fmt: skip

    def against_dense(scored: dict[int, dict], what: str) -> dict:
        on = list(scored)
        loads = [worst_load(s) for s in scored.values()]
        result = effect(f"held-out loss (nats) at equal tokens and active FLOPs: dense (before) against {what} "
                        "(after)", on, [dense[s]["loss"] for s in on], [s["loss"] for s in scored.values()],
                        0.0, better="lower",
                        bits_per_byte_dense=[round(dense[s]["bits_per_byte"], 4) for s in on],
                        bits_per_byte_moe=[round(s["bits_per_byte"], 4) for s in scored.values()])  # fmt: skip
        if len(on) < 2:  # no spread to exceed: a figure to report, not an effect shown
            result["shown"] = None
        result["load"] = {
            "figure": f"worst layer's max/mean expert load over the last {LOG_EVERY} steps (1: perfect balance)",
            "worst_layer": stats(loads), "by_layer": [s["moe"]["moe_max_mean"] for s in scored.values()],
            "target": LOAD_TARGET, "met": max(loads) <= LOAD_TARGET,
        }  # fmt: skip
        return result

    result = against_dense(sparse, f"the MoE balanced by the bias (rate {BIAS_RATE}) and the auxiliary loss "
                                   f"({AUX_LOSS})")  # fmt: skip
    result["loss_shown"] = result["shown"]
    result["shown"] = bool(result["shown"] and result["load"]["met"])
    result["rule_load"] = f"and the worst layer's max/mean load <= {LOAD_TARGET} on every seed"
    result["config"] = VARIANTS["moe"]
    result["aux_loss_only"] = against_dense(variants["moe-aux"], f"the auxiliary loss ({AUX_LOSS}) alone")
    result["aux_loss_free_only"] = against_dense(variants["moe-bias"], f"the bias (rate {BIAS_RATE}) alone")
    result["aux_loss_free_vs_aux_loss"] = effect(
        "held-out loss (nats): the MoE balanced by the auxiliary loss alone (before) against the bias alone "
        "(after); report", alone, [variants["moe-aux"][s]["loss"] for s in alone],
        [variants["moe-bias"][s]["loss"] for s in alone], 0.0, better="lower")  # fmt: skip
    if len(alone) < 2:
        result["aux_loss_free_vs_aux_loss"]["shown"] = None
    result.update({"sizes": sizes(runs, seeds[0]), "experts": EXPERTS, "top_k": TOP_K, "expert_d_ff": D_FF // TOP_K,
                   "dense_d_ff": D_FF, "steps": STEPS, "batch_tokens": BATCH, "tokens": STEPS * BATCH, "lr": LR,
                   "optimizer": (f"Muon at {MUON_LR:g} for every matrix in the blocks (attention, dense MLP, "
                                 f"router, each expert's matrices), AdamW at {LR:g} for the rest"
                                 if OPTIMIZER == "muon" else f"AdamW at {LR:g}"),
                   "schedule": f"{WARMUP:,} warmup tokens, WSD with the last half of the steps decaying to 0",
                   "variants": VARIANTS,
                   "run_wall_time_s": {"dense": [d["wall_time_s"] for d in dense.values()],
                                       "moe": [s["wall_time_s"] for s in sparse.values()],
                                       **{n: [s["wall_time_s"] for s in v.values()] for n, v in variants.items()}},
                   "disjoint": "held-out loss on the validation split (documents no run trains on), the first "
                               "50,000 bytes"})  # fmt: skip
    return result


def muon_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    """Report only: Muon against AdamW, each at the best of its three LRs on the first seed."""

    design = {"steps": MUON_STEPS, "batch": MUON_BATCH, "micro_batch": MUON_MICRO_BATCH, "warmup": None,
              "schedule": COSINE}  # fmt: skip

    def adamw(lr: float, seed: int) -> dict:
        return train_and_score(runs, shared, f"adamw-{lr:g}-{seed}", seed, lr=lr, optimizer="", **design)

    def muon(lr: float, seed: int) -> dict:
        return train_and_score(runs, shared, f"muon-{lr:g}-{seed}", seed, lr=MUON_REST_LR,
                               optimizer=f'optimizer = "muon"\nmuon_lr = {lr}', **design)  # fmt: skip

    first = seeds[0]
    sweep = {"adamw": {f"{lr:g}": round(adamw(lr, first)["loss"], 4) for lr in ADAMW_LRS},
             "muon": {f"{lr:g}": round(muon(lr, first)["loss"], 4) for lr in MUON_LRS}}  # fmt: skip
    best = {name: float(min(losses, key=losses.get)) for name, losses in sweep.items()}
    before = [adamw(best["adamw"], seed)["loss"] for seed in seeds]
    after = [muon(best["muon"], seed)["loss"] for seed in seeds]
    result = effect(f"held-out loss (nats) at equal tokens: AdamW at lr {best['adamw']:g} (before) against Muon at "
                    f"muon_lr {best['muon']:g} (after), each the best of its 3-point sweep on seed {first}", seeds,
                    before, after, 0.0, better="lower", sweep_seed=first, sweep=sweep, best_lr=best,
                    steps=MUON_STEPS, batch_tokens=MUON_BATCH, tokens=MUON_STEPS * MUON_BATCH,
                    muon_rest=f"Muon takes the 2-D hidden matrices; the embeddings, norms and head keep AdamW "
                              f"at lr {MUON_REST_LR:g} (train.lr) in the Muon runs")  # fmt: skip
    result["sweep_shown"] = result["shown"]
    result["shown"] = None  # report only (issue 36, item 8)
    result["disjoint"] = "held-out loss on the validation split, which no run trains on"
    return result
