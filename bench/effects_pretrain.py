"""The pretraining effects of bench/effects.py: anneal and checkpoint averaging (and EMA); MoE and Muon
are in bench/effects_moe.py, context extension in bench/effects_context.py.

Anneal and averaging share one stable run per seed: prose and code from the shared corpus (70/30), the
tiny-1m shape, 480 steps of 256 tokens at a constant LR of 2e-2 after warmup, a checkpoint every 20
steps. At this size and LR the constant LR's noise, not the token count, limits the loss, which is the
regime WSD's decay and weight averaging are for (240 steps at 1e-2 were not: docs/benchmarks.md).
Everything goes through the CLI: `smelt run`, `smelt anneal`, `smelt eval`, `smelt checkpoint average`.
$EFFECTS_STABLE_STEPS and $EFFECTS_STABLE_LR change the stable run (for trying other regimes).
"""

from __future__ import annotations

import os
from pathlib import Path

from effects_common import EVAL, MIXED_TINY, effect, read_json, sets, smelt

STABLE = (
    """\
[run]
name = "stable-{seed}"
dir = "{runs}"
seed = {seed}

"""
    + MIXED_TINY
    + """
[train]
seq_len = 128
micro_batch = 2
batch_tokens = 256
tokens = {tokens}
lr = {lr}
threads = 1
warmup_tokens = 5_120
schedule = "constant"
log_every = 10
eval_every = 0
eval_tokens = 8_192

[checkpoint]
every_steps = 20
keep_last = 20

"""
    + EVAL
)
BATCH = 256
STEPS = int(os.environ.get("EFFECTS_STABLE_STEPS", "480"))  # the stable run's last step
FORK = STEPS * 2 // 3  # the anneals fork here and decay over the last third
AVERAGE_LAST = 3  # checkpoints averaged: the last three, 20 steps apart
LR = float(os.environ.get("EFFECTS_STABLE_LR", "2e-2"))  # the stable run's constant LR
EMA_DECAY = 0.5


def stable_run(runs: Path, shared: Path, seed: int) -> tuple[Path, Path]:
    """The stable run of one seed (constant LR to STEPS) and its config."""
    config = runs / f"stable-{seed}.toml"
    run = runs / f"stable-{seed}"
    if not (run / "summary.json").is_file():
        runs.mkdir(parents=True, exist_ok=True)
        config.write_text(
            STABLE.format(runs=runs.resolve(), shared=shared, seed=seed, tokens=STEPS * BATCH, lr=LR)
        )
        smelt("run", str(config))
    return run, config


def heldout(run: Path, step: int) -> dict:
    """Held-out loss (nats) and bits per byte, overall and per source, of one evaluated checkpoint."""
    # A weights-only checkpoint (an average) is scored as eval/weights_only-step_N.json.
    (path,) = sorted((run / "eval").glob(f"*step_{step:07d}.json"))
    h = read_json(path)["heldout"]
    return {"loss": h["overall"]["loss"], "bits_per_byte": h["overall"]["bits_per_byte"],
            "loss_by_source": {s: f["loss"] for s, f in h["per_source"].items()}}  # fmt: skip


def evaluate(config: Path, run: Path, step: int) -> dict:
    if not list((run / "eval").glob(f"*step_{step:07d}.json")):
        smelt("eval", str(config), "--checkpoint", str(step), "--tasks", "",
              *sets(f"run.dir='{run.parent}'", f"run.name='{run.name}'"))  # fmt: skip
    return heldout(run, step)


def anneal_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    stable, same, code_same, code_mix, seconds = [], [], [], [], {}
    for seed in seeds:
        run, config = stable_run(runs, shared, seed)
        if not (runs / f"stable-{seed}-anneal-code" / "summary.json").is_file():
            smelt("anneal", str(config), "--from", f"{run}:{FORK}", "--decay-tokens", str((STEPS - FORK) * BATCH),
                  "--variant", "same", "tokens.mixture={prose=0.7, code=0.3}",
                  "--variant", "code", "tokens.mixture={prose=0.3, code=0.7}")  # fmt: skip
        stable.append(evaluate(config, run, STEPS))
        for name, out in (("same", same), ("code", code_mix)):
            fork = runs / f"stable-{seed}-anneal-{name}"
            (last,) = sorted((fork / "eval").glob("step_*.json"))[-1:]
            out.append(heldout(fork, int(last.stem.split("_")[1])))
        code_same.append(same[-1]["loss_by_source"]["code"])
        for name in (run.name, f"{run.name}-anneal-same", f"{run.name}-anneal-code"):
            seconds[name] = read_json(runs / name / "summary.json").get("wall_time_s")
    result = effect("held-out loss (nats) at equal tokens: stable run continued at constant LR (before) "
                    f"against a WSD decay from its step {FORK} on the same mixture (after)", seeds,
                    [s["loss"] for s in stable], [s["loss"] for s in same], 0.03, better="lower",
                    run_wall_time_s=seconds, tokens=STEPS * BATCH, lr=LR, batch_tokens=BATCH, fork_step=FORK, decay_tokens=(STEPS - FORK) * BATCH,
                    bits_per_byte_stable=[round(s["bits_per_byte"], 4) for s in stable],
                    bits_per_byte_anneal=[round(s["bits_per_byte"], 4) for s in same])  # fmt: skip
    result["mixture_anneal"] = effect(
        "held-out code loss (nats): the same-mixture anneal (before) against the code-upweighted anneal "
        "(prose 0.3, code 0.7; after)", seeds, code_same, [c["loss_by_source"]["code"] for c in code_mix],
        0.0, better="lower",
        prose_loss_same_vs_code_anneal=[(round(s["loss_by_source"]["prose"], 4), round(c["loss_by_source"]["prose"], 4))
                                        for s, c in zip(same, code_mix, strict=True)])  # fmt: skip
    result["disjoint"] = (
        "held-out loss is on the validation split (documents no run trains on); the anneals "
        f"continue the stable run's data from step {FORK} (train.fork_data = 'continue')"
    )
    return result


def average_run(runs: Path, run: Path, config: Path, label: str, extra: list[str]) -> dict:
    """Average checkpoints of `run` into a run-shaped directory beside it and score it like the run."""
    out = runs / f"{run.name}-{label}"
    target = out / "train" / "checkpoints" / f"step_{STEPS:07d}"
    if not list((out / "eval").glob(f"*step_{STEPS:07d}.json")):
        for stage in ("documents", "tokenizer", "tokens"):
            link = out / stage
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to((run / stage).resolve(), target_is_directory=True)
        smelt("checkpoint", "average", str(run), *extra, "--out", str(target), "--force")
        evaluate(config, out, STEPS)
    return heldout(out, STEPS)


def averaging_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    last, avg, ema = [], [], []
    stables = runs.parent / "anneal"  # the anneal effect's stable runs, when it ran first
    for seed in seeds:
        run, config = stable_run(stables, shared, seed)
        last.append(evaluate(config, run, STEPS)["loss"])
        avg.append(
            average_run(stables, run, config, f"avg{AVERAGE_LAST}", ["--last", str(AVERAGE_LAST)])["loss"]
        )
        ema.append(average_run(stables, run, config, f"ema{EMA_DECAY}", ["--last", str(AVERAGE_LAST),
                                                                          "--ema", str(EMA_DECAY)])["loss"])  # fmt: skip
    result = effect(f"held-out loss (nats): last checkpoint (step {STEPS}) of the constant-LR run (before) "
                    f"against the uniform average of its last {AVERAGE_LAST} checkpoints, 20 steps apart "
                    "(after)", seeds, last, avg, 0.0, better="lower", lr=LR, batch_tokens=BATCH,
                    steps=STEPS)  # fmt: skip
    result["ema"] = effect(f"the same, EMA (decay {EMA_DECAY}) of the last {AVERAGE_LAST} checkpoints", seeds,
                           last, ema, 0.0, better="lower")  # fmt: skip
    result["disjoint"] = "held-out loss on the validation split, which no run trains on"
    return result
