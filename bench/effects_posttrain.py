"""The post-training effects of bench/effects.py: SFT, DPO and GRPO on synthetic addition, from base
models written here (the tiny-1m shape, prose from the shared corpus, about 20 s of CPU each): `base`
for SFT and DPO (1-digit problems), `base-digits` for GRPO (2-digit problems; its tokenizer writes
numbers a digit a token). Every stage goes through `smelt posttrain run` with every setting that the
effect depends on given explicitly (lr, steps, batch, schedule, beta, ...), so a change of the stage
defaults does not change these figures.

Held out means held out: addition holds out a quarter of its problems by a hash of {a, b} (smelt's own
split, `data.heldout` and `smelt posttrain eval --addition` draw from it; no training item is one of
them); the DPO pairs follow the same partition, the held-out ones in their own file
(bench/effects_data.py). Each effect records the counts that show it.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import REPO
from effects_common import DIGIT_PATTERN, EVAL, PROSE, TOKENIZER, effect, read_json, records, sets, smelt
from effects_data import write_addition_pairs

CONFIGS = REPO / "configs" / "posttrain"
HELDOUT = 25  # the held-out 1-digit addition problems: all 25 of them

BASE = (
    """\
[run]
name = "{name}"
dir = "{runs}"
seed = 7

"""
    + PROSE
    + TOKENIZER
    + """

[tokens]
workers = 1

[model]
preset = "tiny-1m"
max_seq_len = 256

[train]
seq_len = 128
micro_batch = 16
batch_tokens = 2_048
tokens = 100_000
lr = 3e-3
warmup_tokens = 10_000
log_every = 10
eval_every = 0

[checkpoint]
every_steps = 1000
keep_last = 1

"""
    + EVAL
)

# SFT on 1-digit addition: 400 steps of 8 rows of 64 tokens (about 50 problems a row-batch), cosine, weight
# decay 1.0. With weight decay 0.1 one seed in three memorised the 75 training problems without
# generalising (held-out exact match 0.64, 0.24, 0.80: not beyond twice the spread); 1.0 generalises on all three.
SFT = ["optim.lr=1e-3", "optim.steps=400", "optim.batch_size=8", "optim.seq_len=64", "optim.schedule='cosine'",
       "optim.warmup_steps=20", "optim.weight_decay=1.0", "data.addition_digits=1", "data.addition_items=4000",
       f"data.heldout={HELDOUT}"]  # fmt: skip
# GRPO works on 2-digit addition (7,500 training problems: too many for a 1M-parameter model to memorise,
# so what it learns on training prompts is arithmetic, and it shows on the held-out quarter) from its own
# base: the same prose and shape, with a tokenizer that splits numbers into digits (DIGIT_PATTERN; with
# GPT-4's 1-3 digit pieces a 2-digit sum is a lookup in a table of 10,000, and SFT reached 1-5% after 400
# steps). Its parent is a checkpoint of a 2-digit SFT (3,000 steps, lr 3e-3 cosine) taken while the SFT is
# learning the task: the model learns it in a jump whose timing varies by seed (held-out exact match at
# step 1,000 of a 2,000-step cosine: 0.52, 0.07, 0.13 on seeds 0-2; a full SFT of 1,000 steps ended at
# 0.18, 0.07, 0.11, and one at constant lr at 0.10), so no fixed step lands every seed in the issue's
# 20-70%; from the last checkpoint of the 2,000-step SFT (0.37 on seed 2) GRPO gained little. The parent is the first
# checkpoint whose exact match on 200 problems of the *training* partition (PROBE_SEED; never the held-out
# problems, so the choice does not peek at what is scored) reaches PROBE_TARGET. GRPO then trains on
# prompts of the training partition: 100 steps of 32 prompts x 16 samples, lr 3e-4 cosine, KL 0.01. Each
# doubling of the samples a step has mattered: with 8 prompts x 8 (64 samples) the training reward did
# not rise at lr 1e-4 and fell to 0 at 1e-3 (Adam gives every weight a step of about lr whatever the
# gradient's noise, so 64 binary rewards walk the weights at random); with 32 x 8 the held-out gains were
# +0.235, +0.165 and +0.025 (seed 2's parent gained +0.08 under another GRPO seed: the noise of the
# update, not the parent); 32 x 16 gives +0.225, +0.195 and +0.09. On 1-digit problems (the design
# before) the training reward rose (0.37 -> 0.57) but held-out greedy exact match did not (0.28 ->
# 0.25): the 75 training problems were nearly memorised, and GRPO sharpened answers to them, not the
# arithmetic.
GRPO_HELDOUT = 200  # held-out 2-digit problems scored (of the partition's 2,500)
PROBE_SEED, PROBE_ITEMS, PROBE_TARGET = 2026, 200, 0.3
SFT_GRPO_PARENT = ["optim.lr=3e-3", "optim.steps=3000", "optim.batch_size=8", "optim.seq_len=64",
                   "optim.schedule='cosine'", "optim.warmup_steps=20", "optim.weight_decay=0.1",
                   "data.addition_digits=2", "data.addition_items=20000", f"data.heldout={GRPO_HELDOUT}",
                   "optim.checkpoint_every=250", "optim.keep_last=20", "optim.log_every=100"]  # fmt: skip
GRPO = ["optim.lr=3e-4", "optim.steps=100", "optim.batch_size=32", "optim.schedule='cosine'",
        "optim.warmup_steps=10", "grpo.group_size=16", "grpo.max_new_tokens=4", "grpo.temperature=1.0",
        "grpo.kl_coef=0.01", "grpo.reward='exact_number'", "data.addition_digits=2", "data.addition_items=20000",
        f"data.heldout={GRPO_HELDOUT}", f"eval.items={GRPO_HELDOUT}", "optim.log_every=10"]  # fmt: skip
# DPO follows the SFT of the sft effect (its model per seed): 1-digit problems, the correct sum against
# 6 wrong sums each (bench/effects_data.py), 450 training pairs from the training partition and 150
# held-out pairs from the held-out one (data.heldout_path). From the prose base instead, DPO memorised its
# training pairs and moved held-out ones the wrong way (0.50 -> 0.43, one seed): the base has no arithmetic
# to sharpen. At lr 3e-4 from the SFT the implicit reward rose as far (0.76) but the policy's own
# preference (log-prob accuracy) fell 0.91 -> 0.83 as both replies lost probability; 1e-4 keeps it.
DPO = ["data.format='preferences'", "data.heldout=0", "data.limit=0", "optim.lr=1e-4", "optim.steps=100",
       "optim.batch_size=16", "optim.seq_len=32", "optim.schedule='cosine'", "optim.warmup_steps=5",
       "dpo.loss='dpo'", "dpo.beta=0.1"]  # fmt: skip


def base_run(runs: Path, shared: Path, name: str = "base", pattern: str = "") -> Path:
    """A base the post-training effects start from (beside their runs; the seeds vary the stages): `base`
    for SFT and DPO, `base-digits` (the tokenizer's pre-tokenization `pattern`) for GRPO."""
    runs = runs.parent
    base = runs / name
    if not (base / "summary.json").is_file():
        config = runs / f"{name}.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        text = BASE.format(name=name, runs=runs.resolve(), shared=shared)
        if pattern:
            text = text.replace("[tokenizer]\n", f"[tokenizer]\npattern = {json.dumps(pattern)}\n")
        config.write_text(text)
        smelt("run", str(config))
    return base


STAGE_SECONDS: dict[str, float] = {}  # each stage's own wall time (its summary.json), kept when reused


def stage(config: str, parent: Path, out: Path, seed: int, overrides: list[str]) -> dict:
    if not (out / "summary.json").is_file():
        smelt("posttrain", "run", str(CONFIGS / config), "--force",
              *sets(f"run.init_from='{parent}'", f"run.out='{out}'", f"run.seed={seed}", *overrides))  # fmt: skip
    summary = read_json(out / "summary.json")
    STAGE_SECONDS[out.name] = summary.get("wall_time_s")
    return summary


def addition_exact_match(run: Path) -> dict:
    """Greedy exact match on the held-out 1-digit problems, as `smelt posttrain eval` scores it."""
    smelt("posttrain", "eval", str(run), "--addition", str(HELDOUT), "--addition-digits", "1")
    (result,) = sorted((run / "posttrain_eval").glob("step_*.json"))[-1:]
    return read_json(result)["addition_chat"]


def sft_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    STAGE_SECONDS.clear()
    base = base_run(runs, shared)
    before = addition_exact_match(base)
    after, val = [], []
    for seed in seeds:
        summary = stage("sft_addition.toml", base, runs / f"sft-{seed}", seed, SFT)
        after.append(addition_exact_match(runs / f"sft-{seed}")["exact_match"])
        val.append((summary["val_loss_before"], summary["val_loss"]))
    return effect("held-out exact match, 1-digit addition, chat, greedy", seeds,
                  [before["exact_match"]] * len(seeds), after, 0.5,
                  heldout_problems=before["items"], heldout_contaminated_dropped=before["contaminated_dropped"],
                  val_loss_before_after=val, settings=SFT,
                  disjoint="held-out problems are smelt's held-out quarter of {a, b}; training items come "
                           "only from the other three quarters (and decontamination dropped none)",
                  note="one base model (seed 7); the seed varies the SFT stage", stage_wall_time_s=dict(STAGE_SECONDS))  # fmt: skip


def training_problem_accuracy(checkpoint: Path, tokenizer: Path) -> float:
    """Greedy exact match on PROBE_ITEMS 2-digit problems of the training partition (not the held-out)."""
    import torch

    from smelt.chat_template import ChatFormat
    from smelt.checkpoint.store import load_model
    from smelt.posttrain.chat import addition_items
    from smelt.posttrain.evaluate import chat_exact_match
    from smelt.tokenizer.load import Tokenizer

    model, _ = load_model(checkpoint)
    model.eval()
    with torch.no_grad():
        scored = chat_exact_match(model, ChatFormat(Tokenizer.load(tokenizer)),
                                  addition_items(PROBE_ITEMS, PROBE_SEED, 2), max_new_tokens=16)  # fmt: skip
    return scored["exact_match"]


def mid_task_checkpoint(run: Path) -> tuple[str, dict[int, float]]:
    """RUN:STEP of the first checkpoint whose training-problem accuracy reaches PROBE_TARGET (the last one
    if none does), and the accuracy of every checkpoint looked at."""
    from smelt.layout import checkpoints_dir, list_checkpoints, step_of

    probed: dict[int, float] = {}
    for checkpoint in list_checkpoints(checkpoints_dir(run)):
        probed[step_of(checkpoint)] = training_problem_accuracy(checkpoint, run / "tokenizer")
        if probed[step_of(checkpoint)] >= PROBE_TARGET:
            break
    return f"{run}:{max(probed)}", probed


def grpo_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    STAGE_SECONDS.clear()
    base = base_run(runs, shared, "base-digits", DIGIT_PATTERN)
    before, after, sampled, length, kl, train_reward, contaminated, parents = [], [], [], [], [], [], [], {}
    for seed in seeds:
        sft = runs / f"sft-2digit-{seed}"
        stage("sft_addition.toml", base, sft, seed, SFT_GRPO_PARENT)
        parent, probed = mid_task_checkpoint(sft)
        parents[seed] = {"parent": parent, "training_problem_accuracy_by_step": probed}
        out = runs / f"grpo-{seed}"
        summary = stage("grpo_addition.toml", parent, out, seed, GRPO)
        before.append(summary["heldout_reward_before"])
        after.append(summary["heldout_reward_after"])
        sampled.append((summary["heldout_sampled_reward_before"], summary["heldout_sampled_reward_after"]))
        train_reward.append((summary["train_reward_first_quarter"], summary["train_reward_last_quarter"]))
        train = records(out, "train")
        length.append((train[0]["reply_tokens"], train[-1]["reply_tokens"]))
        kl.append(train[-1]["kl"])
        contaminated.append(summary["heldout_contaminated"])
    return effect(f"held-out greedy exact match (reward) on {GRPO_HELDOUT} 2-digit addition problems: the SFT "
                  "checkpoint GRPO starts from (before) against GRPO (after)", seeds, before, after, 0.10,
                  sampled_reward_before_after=sampled, train_reward_first_last_quarter=train_reward,
                  reply_tokens_first_last_step=length, kl_last_step=kl, heldout_contaminated_dropped=contaminated,
                  parents=parents, parent_rule=f"the first SFT checkpoint (every 250 steps) whose greedy exact "
                  f"match on {PROBE_ITEMS} training-partition problems reaches {PROBE_TARGET}",
                  parent_in_range=all(0.2 <= b <= 0.7 for b in before), sft_settings=SFT_GRPO_PARENT,
                  settings=GRPO, tokenizer="GPT-4 pre-tokenization with one digit a piece",
                  disjoint="SFT and GRPO train on problems of smelt's training partition of {a, b} (three quarters "
                           "of the 10,000 2-digit problems); the 200 scored problems are of the held-out quarter "
                           "(decontamination dropped none); the parent is chosen on training problems",
                  note="one base model (seed 7); the seed varies the SFT parent and GRPO",
                  stage_wall_time_s=dict(STAGE_SECONDS))  # fmt: skip


def dpo_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    STAGE_SECONDS.clear()
    base = base_run(runs, shared)
    before, after, logp, counts = [], [], [], {}
    for seed in seeds:
        train, held = (
            runs / "data" / f"pairs-train-{seed}.jsonl",
            runs / "data" / f"pairs-heldout-{seed}.jsonl",
        )
        train.parent.mkdir(parents=True, exist_ok=True)
        counts[seed] = write_addition_pairs(train, held, seed)
        parent = runs.parent / "sft" / f"sft-{seed}"  # the sft effect's model of this seed
        stage("sft_addition.toml", base, parent, seed, SFT)
        summary = stage("dpo_hh.toml", parent, runs / f"dpo-{seed}", seed,
                        [f"data.path='{train}'", f"data.heldout_path='{held}'", *DPO])  # fmt: skip
        before.append(summary["heldout_before"]["reward_accuracy"])
        after.append(summary["heldout_after"]["reward_accuracy"])
        logp.append((summary["heldout_before"]["logp_accuracy"], summary["heldout_after"]["logp_accuracy"]))
        counts[seed].update(heldout_pairs=summary["heldout_after"]["pairs"],
                            heldout_contaminated=summary["heldout_contaminated"])  # fmt: skip
    return effect("held-out preference accuracy (DPO implicit reward: the chosen sum's log-ratio to the "
                  "reference above the rejected one's; a tie, as at the start, counts half), 1-digit addition, "
                  "correct sum against a wrong one", seeds, before, after, 0.20,
                  logp_accuracy_before_after=logp, pairs=counts, sft_settings=SFT, settings=DPO,
                  disjoint="training pairs are problems of smelt's training partition of {a, b}, held-out pairs "
                           "of its held-out partition (checked when written; the stage's decontamination dropped "
                           "none); the SFT parent trained on the training partition only",
                  note="one base model (seed 7); the seed varies the SFT parent, the wrong answers and the stage",
                  hh_rlhf=hh_rlhf_report(), stage_wall_time_s=dict(STAGE_SECONDS))  # fmt: skip


def hh_rlhf_report() -> dict:
    """DPO on hh-rlhf, reported without a goal: the figures of bench/results/posttrain.json (not rerun here)."""
    path = REPO / "bench" / "results" / "posttrain.json"
    if not path.is_file():
        return {"status": "not run"}
    chain = read_json(path)
    keys = ("dpo_heldout_pairs", "dpo_reward_accuracy_before", "dpo_reward_accuracy_after",
            "dpo_logp_accuracy_before", "dpo_logp_accuracy_after", "dpo_steps")  # fmt: skip
    return {"source": "bench/results/posttrain.json (one seed, small-5m base, not rerun by this benchmark)",
            "command": chain.get("kept_from") or chain.get("command"), **{k: chain.get(k) for k in keys}}  # fmt: skip
