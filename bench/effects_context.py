"""The context-extension effect of bench/effects.py, as issue 36 sets it: a base trained at 256 tokens
retrieves a pass key at 256 (at least 0.9), fails at 1024 (4x) without an extension, and reaches at least
0.8 at 1024 after a YaRN x4 extension that keeps a share of short data, while its loss within the first
256 positions rises by at most 0.02 nats.

The data. A tiny model learns retrieval only from data that asks for it, and with the loss on every
token (as pretraining has it) only when the answers are a large share of what is left to learn. The
training documents are synthetic, in the words of smelt's passkey task (smelt.eval.passkey): its
introduction, filler with the key's sentence at a random depth, then 1-8 times the question and its
answer (a filler sentence between). Two choices make retrieval learnable: the filler runs through the
task's five sentences in order (from a random one), so that it is all but predictable and adds next to
no gradient noise, and the several answers per document make the keys' digits most of the remaining
loss (the first answer copies from the needle, the later ones from the answer before). The scored
items keep the task's own random filler (evaluate_passkey, its fixed seed): the model is scored on a
filler order it never trained on, and none of the items' keys or distractors occurs in any training
document (checked, and recorded in the result); the training documents draw keys, depths, counts and
filler from their own seeded stream. Two JSONL sources that smelt curates, tokenizes (one digit per
piece) and mixes like any other: `passkey`, documents within 256 tokens (45-247; their lengths skewed
to the longest, since a key far from the question is what is hard to learn), the base's whole mixture;
and `passkey_long` (243-984 tokens), which the extension trains on beside the short ones (0.7 and 0.3).

The model: d_model 64, 2 layers of 2 heads of 32 dims (the shape of tests/train/test_context_extension.py's
toy), rope_theta 1,000: its three slowest RoPE pairs turn 0.4-0.9 rad over 256 tokens and 1.5-3.7 rad
over 1024, as Llama's theta 10,000 does for 128-dim heads at 4x its 4,096 tokens.

Per seed: `smelt run` (the base: 1,400 steps of 4,096 tokens at 256, lr 1e-2, cosine), `smelt train
--from` (the extension: 80 steps of 8,192 tokens at 1024, YaRN x4, fork_data = restart), `smelt eval`
(held-out loss in windows of 256 tokens for both, so positions 0-255 of the same documents). The seeds'
pipelines run side by side (EFFECTS_CONTEXT_PARALLEL, default 3). Passkey accuracy at 256 and 1024
tokens, and held-out loss by position in windows of 1024, come from the Python API (the CLI scores a
checkpoint at its own context only; the base at 1024 needs its RoPE table widened under its own
frequencies, smelt.model.rope.extend_context, which is how an unextended model extrapolates).

What shows (bench/results/effects.json; 16 min for the three seeds at load 6-7 on two cores): the
effect when retrieval is learned, but it is learned in one seed of three. Seed 2's base finds the key
in 0.96 of the items at 256, in 0.38 at 1024 unextended (1.0 with the key next to the question,
0.1-0.4 elsewhere) and in 0.98 at 1024 after the extension. Seeds 0 and 1 stay near chance at 256
(0.18, 0.24): their loss fell at step ~650 (seed 1) as the later answers began to be copied from the
answer before, but copying from the needle 50-200 tokens back had not formed by step 1,400 (seed 2 had
it by step 1,200, 0.8 at 256). So the mean difference over seeds (0.19, spread 0.36) is not shown. The
held-out loss of the short documents rose 0.013-0.047 nats after the extension (goal 0.02). The held-
out loss at positions 256-1023 fell from 0.26 to 0.11 (mean). Ranking the key against 9 random ones needs only two of
its digits: per digit (given the digits before it), seed 2's base is right in 1.00, 0.28, 0.76, 0.28
and 0.46 of the items at 256 (exact match 0.02); what a tiny model learns at long range is the digits
next to an anchor (after "is", before the full stop). Wider models, copy documents and several named
keys a document did no better (docs/benchmarks.md, the pilots of 2026-11-28).

What failed before: the base mixed prose (0.3-0.5) with passkey documents in the task's random filler
and one answer each, on tiny-1m (d 128, 4 layers) at theta 10,000: accuracy 0.047 at 256 after 400
steps, and 1,000 steps of passkey documents alone left the answer's digits at 11.5 nats (5 ln 10).
Outside the pipeline (tiny-1m and the toy's shape, 300-600 steps): with the task's random filler the
loss on every token learned nothing at 64 or 256 tokens, with one answer or eight; with the loss on the
answer alone it did at 64 (0.43); ordered filler with eight answers per document learned it with the
loss on every token (0.53 at 64 after 500 steps, 0.43 at 256 after 600). Then in the pipeline, theta
300 with 16-dim heads (1,200 steps): 0.32-0.52 at 256, the key found only near the question, since
every RoPE pair turns more than 1.3 rad within 200 tokens.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from pathlib import Path
from typing import Any

from effects_common import DIGIT_PATTERN, effect, read_json, sets, smelt, stats

TRAINED, EXTENDED = 256, 1024
BASE_STEPS = int(os.environ.get("EFFECTS_CONTEXT_BASE_STEPS", "1400"))
EXTEND_STEPS = int(os.environ.get("EFFECTS_CONTEXT_EXTEND_STEPS", "80"))
BASE_BATCH, EXTEND_BATCH = 4096, 8192  # tokens per step
# With 32-dim heads at theta 1,000 the three slowest RoPE pairs turn 0.4-0.9 rad over the trained 256
# tokens (so a key 200 tokens back is still matched by content) and 1.5-3.7 rad over 1024: angles
# training never showed, which is what an extension has to repair (as for Llama's theta 10,000 and
# 128-dim heads at 4x 4,096 tokens). At theta 300 every pair turns over 1.3 rad within 200 tokens and
# the base found a key only near the question.
ROPE_THETA = float(os.environ.get("EFFECTS_CONTEXT_ROPE_THETA", "1000"))
DATA_SEED = 20261128  # the training documents' stream; the scored items use smelt's PASSKEY_SEED
# Enough short documents for the base's tokens once (they average about 190 tokens; 30,000 up to 1,464 steps).
SHORT_DOCS, LONG_DOCS = max(30_000, BASE_STEPS * BASE_BATCH // 200), 4_000
MAX_QUERIES = 8  # questions (each with its answer) per training document: 1 to this many
# Tokens of a document besides its filler (EOS, introduction, needle, the first question and answer)
# and of each further question with its answer and a filler sentence; a filler sentence is 4-5 tokens.
FIXED_TOKENS, QUERY_TOKENS, SENTENCE_TOKENS = 45, 23, 5
PER_CELL = 10  # scored items per (length, depth) cell: 50 per length
BASE_LR = float(os.environ.get("EFFECTS_CONTEXT_BASE_LR", "1e-2"))
# One digit a token (effects_common.DIGIT_PATTERN): every key is five tokens of the same kind, so copying
# it is one operation five times.
PATTERN = DIGIT_PATTERN

BASE = """\
[run]
name = "base-{seed}"
dir = "{runs}"
seed = {seed}

[data]
min_chars = 20
max_chars = 2_000_000
val_fraction = 0.02

[[data.sources]]
name = "passkey"
format = "jsonl"
root = "{data}"
include = ["passkey-short.jsonl"]
id_field = "id"
filters = []

[[data.sources]]
name = "passkey_long"
format = "jsonl"
root = "{data}"
include = ["passkey-long.jsonl"]
id_field = "id"
filters = []

[tokenizer]
vocab_size = 384
sample_bytes = 1_000_000
pattern = {pattern}

[tokens]
mixture = {{ passkey = 1, passkey_long = 0 }}
workers = 1

# The toy's shape (tests/train/test_context_extension.py): two layers of two heads hold the induction
# circuit retrieval needs, and at this size 1,400 steps take minutes on a core.
[model]
d_model = 64
n_layers = 2
n_heads = 2
max_seq_len = {trained}
rope_theta = {theta}

[train]
seq_len = {trained}
micro_batch = 16
batch_tokens = {batch}
tokens = {tokens}
lr = {lr}
warmup_tokens = 81_920
schedule = "cosine"
threads = 1
# Retrieval arrives as a phase change (the induction heads form) whose steps have gradient norms 5-10x
# the trailing median; skipping them, the default, keeps the model from ever learning it.
on_grad_spike = "log"
spike_triage = "off"
log_every = 50
eval_every = 0
eval_tokens = 32_768

[checkpoint]
every_steps = 400
keep_last = 10

[eval]
max_bytes = 200_000
tasks = []
prompts = []
max_new_tokens = 8
"""
EXTEND = [
    f"train.seq_len={EXTENDED}", f"model.max_seq_len={EXTENDED}", "model.rope_scaling='yarn'",
    f"model.rope_factor={EXTENDED / TRAINED}", f"model.rope_original_max_seq_len={TRAINED}",
    "train.micro_batch=4", f"train.batch_tokens={EXTEND_BATCH}", f"train.tokens={EXTEND_STEPS * EXTEND_BATCH}",
    "train.lr=3e-3", f"train.warmup_tokens={8 * EXTEND_BATCH}", "train.schedule='cosine'",
    "train.fork_data='restart'", "tokens.mixture={passkey=0.3, passkey_long=0.7}",
]  # fmt: skip


def scored_items() -> tuple[list[dict], set[str]]:
    """The passkey items every model is scored on (smelt's seed, lengths 256 and 1024) and every key
    they use, true or distractor."""
    from smelt.eval.passkey import DEPTHS, PASSKEY_SEED, passkey_records

    fractions = (TRAINED / EXTENDED, 1.0)
    records = passkey_records(PER_CELL * len(fractions) * len(DEPTHS), fractions, DEPTHS, PASSKEY_SEED)
    return records, {k for r in records for k in (r["key"], *r["distractors"])}


def passkey_document(rng: random.Random, key: str, sentences: int, queries: int) -> str:
    """One training document: the task's introduction, filler with the needle at a random depth, then
    `queries` times the question and its answer (a filler sentence between them). The filler runs through
    smelt's five sentences in order from a random one, so that it is all but predictable and the loss on
    it adds next to no gradient noise: the key's digits are what is left to learn."""
    from smelt.eval.passkey import ANSWER, FILLER, INTRO, NEEDLE, QUESTION

    start = rng.randrange(len(FILLER))
    filler = [" " + FILLER[(start + i) % len(FILLER)] for i in range(sentences + queries)]
    at = round(rng.random() * sentences)
    body = "".join(filler[:at]) + NEEDLE.format(key=key) + "".join(filler[at:sentences])
    answers = [QUESTION + ANSWER.format(key=key) + "." + filler[sentences + i] for i in range(queries - 1)]
    return INTRO + body + "".join(answers) + QUESTION + ANSWER.format(key=key) + "."


def max_sentences(tokens: int, queries: int) -> int:
    """Filler sentences that keep a document of `queries` questions within `tokens` tokens."""
    return max(0, (tokens - FIXED_TOKENS - QUERY_TOKENS * (queries - 1)) // SENTENCE_TOKENS)


def write_passkey_docs(out: Path) -> dict:
    """passkey-short.jsonl (documents within TRAINED tokens) and passkey-long.jsonl (from TRAINED to
    EXTENDED) under `out`, keys disjoint from the scored items'; returns the disjointness figures."""
    _, held = scored_items()
    rng = random.Random(f"{DATA_SEED}:passkey-train")
    used: set[str] = set()
    counts = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, n, (lo, hi) in (("short", SHORT_DOCS, (0, TRAINED)), ("long", LONG_DOCS, (TRAINED, EXTENDED))):
        path = out / f"passkey-{name}.jsonl"
        lines = []

        def fresh() -> str:
            while True:
                key = str(rng.randrange(10_000, 100_000))
                if key not in held and key not in used:  # never a scored key or distractor; each once
                    used.add(key)
                    return key

        while len(lines) < n:
            queries = rng.randint(1, MAX_QUERIES)
            # Skewed to the longest: the key far from the first question is what is hard to learn.
            low, high = max_sentences(lo, queries), max_sentences(hi, queries)
            sentences = low + round((high - low) * rng.random() ** 0.5)
            text = passkey_document(rng, fresh(), sentences, queries)
            lines.append(json.dumps({"id": f"{name}-{len(lines)}", "text": text}))
        if not path.is_file() or path.read_text() != "\n".join(lines) + "\n":
            path.write_text("\n".join(lines) + "\n")
        counts[name] = n
    # The check that matters: no scored key or distractor occurs anywhere in the training text.
    text = "\n".join(json.loads(line)["text"] for n in ("short", "long")
                      for line in (out / f"passkey-{n}.jsonl").read_text().splitlines())  # fmt: skip
    leaked = sorted(k for k in held if k in text)
    assert not leaked, leaked
    return {
        "training_documents": counts,
        "training_keys": len(used),
        "scored_keys_and_distractors": len(held),
        "scored_keys_found_in_training_text": len(leaked),
        "rule": "training keys are drawn from their own seeded stream and never equal a scored key or "
        "distractor; the training text contains none of them as a substring (checked); the filler "
        "and depths are drawn from that stream too",
    }


def passkey_accuracy(checkpoint: Path, tokenizer_dir: Path) -> dict[str, Any]:
    """Accuracy at 256 and 1024 tokens on the scored items (true key against 9 others; chance 0.1), exact
    match (every token of the key the greedy choice) and, per digit of the key, the share of items whose
    digit is the greedy choice given the digits before it: a key can outrank 9 random others on two
    digits, so this says how much of it is retrieved. A model built for 256 has its RoPE table widened
    under its own frequencies first."""
    import torch

    from smelt.checkpoint.store import load_model
    from smelt.eval.passkey import prepare_passkey, score_passkey
    from smelt.model.rope import extend_context
    from smelt.tokenizer.load import Tokenizer

    model, _ = load_model(checkpoint)
    if model.cfg.max_seq_len < EXTENDED:
        extend_context(model, EXTENDED)
    records, _ = scored_items()
    prep = prepare_passkey(records, Tokenizer.load(tokenizer_dir), EXTENDED)
    torch.manual_seed(0)
    result = score_passkey(model, prep, next(model.parameters()).device)
    by_length = {int(n): cell for n, cell in result["by_length"].items()}
    digits: dict[int, list[list[bool]]] = {TRAINED: [], EXTENDED: []}
    model.eval()
    with torch.no_grad():
        for context, candidates, length in zip(prep.contexts, prep.candidates, prep.lengths, strict=True):
            key = candidates[0]  # the true key's tokens: a space, then one digit a token (PATTERN)
            if len(key) < 6:
                raise ValueError(
                    f"the key's tokens {key} are not one digit a token: train the tokenizer with PATTERN"
                )
            logits, _ = model(torch.tensor([context + key[:-1]]))
            greedy = logits[0, len(context) - 1 :].argmax(-1).tolist()
            digits[length].append([g == t for g, t in zip(greedy[-5:], key[-5:], strict=True)])
    per_digit = {n: [round(sum(row[i] for row in rows) / len(rows), 2) for i in range(5)]
                 for n, rows in digits.items()}  # fmt: skip
    return {
        "at_256": by_length[TRAINED]["acc"], "at_1024": by_length[EXTENDED]["acc"],
        "exact_at_256": by_length[TRAINED]["exact_match"], "exact_at_1024": by_length[EXTENDED]["exact_match"],
        "digits_at_256": per_digit[TRAINED], "digits_at_1024": per_digit[EXTENDED],
        "items_per_length": by_length[EXTENDED]["items"],
        "by_depth_at_1024": {d: round(c, 2) for d, c in result["by_cell"][str(EXTENDED)].items()},
    }  # fmt: skip


def loss_by_position(run: Path, data_run: Path, trained: int = TRAINED, extended: int = EXTENDED) -> dict:
    """Held-out loss (nats, all sources by their tokens) at positions below `trained` and from it to
    `extended`, of the run's last checkpoint scored in windows of `extended` tokens on the validation
    documents of `data_run`; a model built for less has its RoPE table widened under its own frequencies
    first (the same call as bench/lifecycle.py)."""
    from smelt.checkpoint.store import load_model
    from smelt.eval.heldout import heldout_bits_per_byte
    from smelt.layout import latest_checkpoint
    from smelt.model.rope import extend_context
    from smelt.tokenizer.load import Tokenizer

    model, _ = load_model(latest_checkpoint(run / "train" / "checkpoints"))
    if model.cfg.max_seq_len < extended:
        extend_context(model, extended)
    eos = Tokenizer.load(data_run / "tokenizer").eos_id
    heldout = heldout_bits_per_byte(model, data_run / "tokens", data_run / "documents", eos, extended, 4,
                                    200_000, doc_masking=True, trained_at=(trained,))  # fmt: skip
    inside, beyond = f"0-{trained - 1}", f"{trained}-{extended - 1}"
    sums = {inside: [0.0, 0], beyond: [0.0, 0]}
    for name, figures in heldout["overall"]["loss_by_position"].items():
        part = sums[inside if int(name.split("-")[0].rstrip("+")) < trained else beyond]
        part[0] += figures["loss"] * figures["tokens"]
        part[1] += figures["tokens"]
    return {name: loss / tokens for name, (loss, tokens) in sums.items()} | {
        f"tokens_{trained}_{extended - 1}": sums[beyond][1]
    }


def heldout_at_256(config: Path, run: Path) -> dict[str, float]:
    """Held-out loss (nats) per source of the run's last checkpoint in windows of 256 tokens."""
    from smelt.layout import latest_checkpoint

    step = int(latest_checkpoint(run / "train" / "checkpoints").name.split("_")[1])
    path = run / "eval" / f"step_{step:07d}.json"
    if not path.is_file():
        smelt("eval", str(config), "--checkpoint", str(step), "--tasks", "",
              *sets(f"run.dir='{run.parent}'", f"run.name='{run.name}'", f"train.seq_len={TRAINED}"))  # fmt: skip
    per_source = read_json(path)["heldout"]["per_source"]
    return {source: figures["loss"] for source, figures in per_source.items()}


def pipeline(runs: Path, seed: int) -> None:
    """One seed's runs: the base (`smelt run`, 256 tokens) and its extension (`smelt train --from`,
    1024 tokens, YaRN x4), each skipped when done."""
    config = runs / f"base-{seed}.toml"
    base, ext = runs / f"base-{seed}", runs / f"extended-{seed}"
    config.write_text(BASE.format(runs=runs, data=runs / "data", seed=seed, trained=TRAINED, theta=ROPE_THETA,
                                  batch=BASE_BATCH, pattern=json.dumps(PATTERN), lr=BASE_LR,
                                  tokens=BASE_STEPS * BASE_BATCH))  # fmt: skip
    if not (base / "summary.json").is_file():
        smelt("run", str(config))
    if not (ext / "train" / "manifest.json").is_file():
        smelt("train", str(config), "--from", str(base), *sets(*EXTEND, f"run.name='{ext.name}'"))


def context_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from smelt.layout import latest_checkpoint

    runs = runs.resolve()
    disjoint = write_passkey_docs(runs / "data")
    # The seeds' pipelines are independent single-threaded processes: run them side by side.
    with ThreadPoolExecutor(int(os.environ.get("EFFECTS_CONTEXT_PARALLEL", "3"))) as pool:
        list(pool.map(lambda seed: pipeline(runs, seed), seeds))
    base_acc, ext_acc, base_loss, ext_loss, base_pos, ext_pos = [], [], [], [], [], []
    for seed in seeds:
        config = runs / f"base-{seed}.toml"
        base, ext = runs / f"base-{seed}", runs / f"extended-{seed}"
        base_acc.append(
            passkey_accuracy(latest_checkpoint(base / "train" / "checkpoints"), base / "tokenizer")
        )
        ext_acc.append(passkey_accuracy(latest_checkpoint(ext / "train" / "checkpoints"), base / "tokenizer"))
        base_loss.append(heldout_at_256(config, base))
        ext_loss.append(heldout_at_256(config, ext))
        base_pos.append(loss_by_position(base, base))
        ext_pos.append(loss_by_position(ext, base))
        print(f"[context] seed {seed}: base {base_acc[-1]} extended {ext_acc[-1]} "
              f"loss {base_loss[-1]} -> {ext_loss[-1]}; by position {base_pos[-1]} -> {ext_pos[-1]}", flush=True)  # fmt: skip
    result = effect(
        f"passkey accuracy at {EXTENDED} tokens (4x the trained length; true key against 9 others, chance "
        f"0.1): the base with its RoPE table merely widened (before) against the base after a YaRN x4 "
        f"extension of {EXTEND_STEPS * EXTEND_BATCH:,} tokens at {EXTENDED} (after)", seeds,
        [a["at_1024"] for a in base_acc], [a["at_1024"] for a in ext_acc], 0.5,
        goals={"base_at_256_min": 0.9, "unextended_at_1024": "chance or near (0.1)", "extended_at_1024_min": 0.8,
               "loss_0_255_max_rise_nats": 0.02},
        base_passkey=base_acc, extended_passkey=ext_acc, disjoint=disjoint,
        base={"tokens": BASE_STEPS * BASE_BATCH, "seq_len": TRAINED, "rope_theta": ROPE_THETA, "lr": BASE_LR,
              "model": "d_model 64, 2 layers, 2 heads of 32", "mixture": "passkey documents (45-247 tokens) only"},
        extension={"tokens": EXTEND_STEPS * EXTEND_BATCH, "seq_len": EXTENDED, "rope": "yarn x4, original 256",
                   "mixture": "passkey (within 256 tokens) 0.3, passkey_long (243-984 tokens) 0.7",
                   "fork_data": "restart"},
    )  # fmt: skip
    result["at_trained_length"] = {
        "metric": f"passkey accuracy at {TRAINED} tokens, the base's trained length",
        "base": [round(a["at_256"], 4) for a in base_acc], "extended": [round(a["at_256"], 4) for a in ext_acc],
    }  # fmt: skip
    rise = [e["passkey"] - b["passkey"] for b, e in zip(base_loss, ext_loss, strict=True)]
    result["loss_0_255"] = {
        "metric": f"held-out loss (nats) of the passkey documents within {TRAINED} tokens, in windows of "
        f"{TRAINED} (positions 0-255), the extended model minus the base: the goal is a rise of at most 0.02",
        "base": stats([x["passkey"] for x in base_loss]), "extended": stats([x["passkey"] for x in ext_loss]),
        "rise": stats(rise), "within_0_02": statistics.fmean(rise) <= 0.02,
    }  # fmt: skip
    result["loss_256_1023"] = effect(
        f"held-out loss (nats, all sources) at positions 256-1023, scored in windows of {EXTENDED}: the base "
        "with its RoPE table merely widened (before) against the extended model (after)", seeds,
        [x["256-1023"] for x in base_pos], [x["256-1023"] for x in ext_pos], 0.0, better="lower",
        tokens=[x["tokens_256_1023"] for x in base_pos],
        loss_0_255_in_1024_windows={"base": [round(x["0-255"], 4) for x in base_pos],
                                    "extended": [round(x["0-255"], 4) for x in ext_pos]},
    )  # fmt: skip
    return result
