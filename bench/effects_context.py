"""The context-extension effect of bench/effects.py, as issue 36 sets it: a base trained at 256 tokens
retrieves a pass key at 256 (at least 0.9), fails at 1024 (4x) without an extension, and reaches at least
0.8 at 1024 after a YaRN x4 extension that keeps a share of short data, while its loss within the first
256 positions rises by at most 0.02 nats.

A tiny model learns retrieval only from data that asks for it, so the base mixes prose from the shared
corpus with synthetic passkey documents: the prompt of smelt's passkey task (smelt.eval.passkey: the
introduction, filler sentences with the key at a random depth, the question) followed by the answer. They
are a JSONL source that smelt curates, tokenizes and mixes like any other (filters off: the filler is
repetitive by design). Two sources: `passkey` (documents of 40-240 tokens, for the base) and
`passkey_long` (256-1000 tokens), which the base gives weight 0 and the extension trains on beside prose
and the short documents. The scored items are smelt's own (evaluate_passkey, its fixed seed): none of
their keys or distractors occurs in any training document (checked, and recorded in the result), and
the training documents draw keys, depths and filler from their own seeded stream.

Per seed: `smelt run` (the base, 256 tokens), `smelt train --from` (the extension: 1024 tokens, YaRN
x4, fork_data = restart), `smelt eval` (held-out loss in windows of 256 tokens for both, so positions
0-255 of the same documents). Passkey accuracy at 256 and 1024 tokens, and held-out loss by position in
windows of 1024, come from the Python API (the CLI scores a checkpoint at its own context only; the base
at 1024 needs its RoPE table widened under its own frequencies, smelt.model.rope.extend_context, which is
how an unextended model extrapolates).

What shows at this budget (bench/results/effects.json): the base does not learn retrieval at 256 tokens,
so neither the failure at 4x nor the recovery after the extension can show; every passkey figure is at
chance. Retrieval needs a content-addressed copy (an induction head) at a varying distance, and with the
loss on every token of the document (as pretraining has it) the 1M-parameter shape did not form one in
the steps tried: 400 steps of 2,048 tokens in this mixture, and, outside the pipeline, 1,000 steps of
1,024 tokens of passkey documents alone (the answer's five digits stayed at 11.5 nats, 5 ln 10) and
400 steps of documents that repeat a list of numbers or words. The same model copies a sequence repeated
at a fixed offset within 100 steps, and tests/train/test_context_extension.py learns retrieval when the
loss is on the answer alone. The held-out loss at positions 256-1023 falls after the extension, but no
more than after the same tokens at 256 without RoPE scaling (the control, `continued-SEED`): at this size
that loss is not limited by the positions the model has seen, and the fall is the extra training's.
"""

from __future__ import annotations

import json
import os
import random
import statistics
from pathlib import Path

from effects_common import effect, read_json, sets, smelt, stats

from smelt.tokenizer.patterns import GPT4_PATTERN

TRAINED, EXTENDED = 256, 1024
BASE_STEPS = int(os.environ.get("EFFECTS_CONTEXT_BASE_STEPS", "400"))
EXTEND_STEPS = int(os.environ.get("EFFECTS_CONTEXT_EXTEND_STEPS", "100"))
BASE_BATCH, EXTEND_BATCH = 2048, 4096  # tokens per step
ROPE_THETA = float(os.environ.get("EFFECTS_CONTEXT_ROPE_THETA", "10000"))
DATA_SEED = 20261128  # the training documents' stream; the scored items use smelt's PASSKEY_SEED
SHORT_DOCS, LONG_DOCS = 6000, 1500
SHORT_SENTENCES, LONG_SENTENCES = (4, 44), (46, 190)  # filler sentences: ~5 tokens each
PER_CELL = 10  # scored items per (length, depth) cell: 50 per length
BASE_LR = float(os.environ.get("EFFECTS_CONTEXT_BASE_LR", "5e-3"))
SHARE = float(os.environ.get("EFFECTS_CONTEXT_SHARE", "0.7"))  # of passkey documents in the base's mixture
# GPT-4's pre-tokenization with one digit per piece (as Llama's tokenizer splits numbers): every key is
# five tokens of the same kind, so copying it is one operation five times.
PATTERN = GPT4_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}")

BASE = """\
[run]
name = "base-{seed}"
dir = "{runs}"
seed = {seed}

[data]
min_chars = 100
max_chars = 2_000_000
val_fraction = 0.05

[[data.sources]]
name = "prose"
format = "text"
root = "{shared}/corpus/prose"
include = ["tinyshakespeare/*.txt", "wikitext-2-raw/wikitext2_train_5k.txt"]
part_chars = 20_000
split_unit = "document"

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
vocab_size = 1024
sample_bytes = 2_000_000
pattern = {pattern}

[tokens]
mixture = {{ prose = {prose}, passkey = {share}, passkey_long = 0 }}
workers = 1

[model]
preset = "tiny-1m"
max_seq_len = {trained}
rope_theta = {theta}

[train]
seq_len = {trained}
micro_batch = 8
batch_tokens = {batch}
tokens = {tokens}
lr = {lr}
warmup_tokens = 40_960
schedule = "cosine"
threads = 1
# Retrieval arrives as a phase change (the induction heads form) whose steps have gradient norms 5-10x
# the trailing median; skipping them, the default, keeps the model from ever learning it.
on_grad_spike = "log"
spike_triage = "off"
log_every = 20
eval_every = 0
eval_tokens = 16_384

[checkpoint]
every_steps = 100
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
    "train.lr=3e-3", f"train.warmup_tokens={10 * EXTEND_BATCH}", "train.schedule='cosine'",
    "train.fork_data='restart'", "tokens.mixture={prose=0.4, passkey=0.2, passkey_long=0.4}",
]  # fmt: skip
# The control: the same tokens, mixture and schedule as the extension, at 256 and without RoPE scaling,
# so that what the extension's extra training alone does to the loss past 256 is known.
CONTINUE = [
    "train.micro_batch=8", f"train.batch_tokens={EXTEND_BATCH}", f"train.tokens={EXTEND_STEPS * EXTEND_BATCH}",
    "train.lr=3e-3", f"train.warmup_tokens={10 * EXTEND_BATCH}", "train.schedule='cosine'",
    "train.fork_data='restart'", "tokens.mixture={prose=0.4, passkey=0.2, passkey_long=0.4}",
]  # fmt: skip


def scored_items() -> tuple[list[dict], set[str]]:
    """The passkey items every model is scored on (smelt's seed, lengths 256 and 1024) and every key
    they use, true or distractor."""
    from smelt.eval.passkey import DEPTHS, PASSKEY_SEED, passkey_records

    fractions = (TRAINED / EXTENDED, 1.0)
    records = passkey_records(PER_CELL * len(fractions) * len(DEPTHS), fractions, DEPTHS, PASSKEY_SEED)
    return records, {k for r in records for k in (r["key"], *r["distractors"])}


def passkey_document(rng: random.Random, key: str, sentences: int) -> str:
    """One training document: the task's prompt with the key at a random depth, then the answer."""
    from smelt.eval.passkey import ANSWER, FILLER, INTRO, NEEDLE, QUESTION

    filler = [" " + rng.choice(FILLER) for _ in range(sentences)]
    at = round(rng.random() * sentences)
    body = "".join(filler[:at]) + NEEDLE.format(key=key) + "".join(filler[at:])
    return INTRO + body + QUESTION + ANSWER.format(key=key) + "."


def write_passkey_docs(out: Path) -> dict:
    """passkey-short.jsonl and passkey-long.jsonl under `out` (once), keys disjoint from the scored
    items'; returns the disjointness figures."""
    _, held = scored_items()
    rng = random.Random(f"{DATA_SEED}:passkey-train")
    used: set[str] = set()
    counts = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, n, (lo, hi) in (("short", SHORT_DOCS, SHORT_SENTENCES), ("long", LONG_DOCS, LONG_SENTENCES)):
        path = out / f"passkey-{name}.jsonl"
        lines = []

        def fresh() -> str:
            while True:
                key = str(rng.randrange(10_000, 100_000))
                if key not in held and key not in used:  # never a scored key or distractor; each once
                    used.add(key)
                    return key

        while len(lines) < n:
            text = passkey_document(rng, fresh(), rng.randint(lo, hi))
            lines.append(json.dumps({"id": f"{name}-{len(lines)}", "text": text}))
        if not path.is_file() or path.read_text() != "\n".join(lines) + "\n":
            path.write_text("\n".join(lines) + "\n")
        counts[name] = n
    # The check that matters: no scored key or distractor occurs anywhere in the training text.
    text = "".join((out / f"passkey-{n}.jsonl").read_text() for n in ("short", "long"))
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


def passkey_accuracy(checkpoint: Path, tokenizer_dir: Path) -> dict[str, float]:
    """Accuracy at 256 and 1024 tokens on the scored items (true key against 9 others; chance 0.1). A
    model built for 256 has its RoPE table widened under its own frequencies first."""
    import torch

    from smelt.checkpoint.store import load_model
    from smelt.eval.passkey import evaluate_passkey
    from smelt.model.rope import extend_context
    from smelt.tokenizer.load import Tokenizer

    model, _ = load_model(checkpoint)
    if model.cfg.max_seq_len < EXTENDED:
        extend_context(model, EXTENDED)
    torch.manual_seed(0)
    result = evaluate_passkey(model, Tokenizer.load(tokenizer_dir), (TRAINED, EXTENDED), per_cell=PER_CELL)
    by_length = {int(n): cell for n, cell in result["by_length"].items()}
    return {
        "at_256": by_length[TRAINED]["acc"], "at_1024": by_length[EXTENDED]["acc"],
        "exact_at_256": by_length[TRAINED]["exact_match"], "exact_at_1024": by_length[EXTENDED]["exact_match"],
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


def context_effect(runs: Path, shared: Path, seeds: list[int]) -> dict:
    from smelt.layout import latest_checkpoint

    runs = runs.resolve()
    disjoint = write_passkey_docs(runs / "data")
    base_acc, ext_acc, base_loss, ext_loss, base_pos, ext_pos, cont_pos = [], [], [], [], [], [], []
    for seed in seeds:
        config = runs / f"base-{seed}.toml"
        base, ext = runs / f"base-{seed}", runs / f"extended-{seed}"
        config.write_text(BASE.format(runs=runs, shared=shared, data=runs / "data", seed=seed, trained=TRAINED,
                                      theta=ROPE_THETA, batch=BASE_BATCH, pattern=json.dumps(PATTERN), lr=BASE_LR,
                                      share=SHARE, prose=round(1 - SHARE, 4), tokens=BASE_STEPS * BASE_BATCH))  # fmt: skip
        if not (base / "summary.json").is_file():
            smelt("run", str(config))
        if not (ext / "train" / "manifest.json").is_file():
            smelt("train", str(config), "--from", str(base), *sets(*EXTEND, f"run.name='{ext.name}'"))
        cont = runs / f"continued-{seed}"
        if not (cont / "train" / "manifest.json").is_file():
            smelt("train", str(config), "--from", str(base), *sets(*CONTINUE, f"run.name='{cont.name}'"))
        base_acc.append(
            passkey_accuracy(latest_checkpoint(base / "train" / "checkpoints"), base / "tokenizer")
        )
        ext_acc.append(passkey_accuracy(latest_checkpoint(ext / "train" / "checkpoints"), base / "tokenizer"))
        base_loss.append(heldout_at_256(config, base))
        ext_loss.append(heldout_at_256(config, ext))
        base_pos.append(loss_by_position(base, base))
        ext_pos.append(loss_by_position(ext, base))
        cont_pos.append(loss_by_position(cont, base))
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
        base={"tokens": BASE_STEPS * BASE_BATCH, "seq_len": TRAINED, "rope_theta": ROPE_THETA,
              "mixture": "prose 0.5, passkey (40-240 tokens) 0.5"},
        extension={"tokens": EXTEND_STEPS * EXTEND_BATCH, "seq_len": EXTENDED, "rope": "yarn x4, original 256",
                   "mixture": "prose 0.4, passkey (short) 0.2, passkey_long (256-1000 tokens) 0.4",
                   "fork_data": "restart"},
    )  # fmt: skip
    result["at_trained_length"] = {
        "metric": f"passkey accuracy at {TRAINED} tokens, the base's trained length",
        "base": [round(a["at_256"], 4) for a in base_acc], "extended": [round(a["at_256"], 4) for a in ext_acc],
    }  # fmt: skip
    rise = [e["prose"] - b["prose"] for b, e in zip(base_loss, ext_loss, strict=True)]
    result["loss_0_255"] = {
        "metric": f"held-out prose loss (nats) in windows of {TRAINED} tokens (positions 0-255), the extended "
        "model minus the base: the goal is a rise of at most 0.02",
        "base": stats([x["prose"] for x in base_loss]), "extended": stats([x["prose"] for x in ext_loss]),
        "rise": stats(rise), "within_0_02": statistics.fmean(rise) <= 0.02,
        "passkey_documents_base": [round(x["passkey"], 4) for x in base_loss],
        "passkey_documents_extended": [round(x["passkey"], 4) for x in ext_loss],
    }  # fmt: skip
    result["loss_256_1023"] = effect(
        f"held-out loss (nats, all sources) at positions 256-1023, scored in windows of {EXTENDED}: the base "
        "with its RoPE table merely widened (before) against the extended model (after)", seeds,
        [x["256-1023"] for x in base_pos], [x["256-1023"] for x in ext_pos], 0.0, better="lower",
        tokens=[x["tokens_256_1023"] for x in base_pos],
        loss_0_255_in_1024_windows={"base": [round(x["0-255"], 4) for x in base_pos],
                                    "extended": [round(x["0-255"], 4) for x in ext_pos]},
    )  # fmt: skip
    result["loss_256_1023"]["against_continued_at_256"] = effect(
        "the same loss: the base continued at 256 without RoPE scaling on the extension's tokens, mixture "
        "and schedule (before) against the extended model (after): the part that is the extension's own",
        seeds, [x["256-1023"] for x in cont_pos], [x["256-1023"] for x in ext_pos], 0.0, better="lower",
        loss_0_255_in_1024_windows_continued=[round(x["0-255"], 4) for x in cont_pos],
    )  # fmt: skip
    return result
