"""Passkey retrieval: a synthetic long-context task, deterministic from a seed.

Each item hides a 5-digit pass key in filler text and asks for it at the end (the prompt of
Mohtashami & Jaggi 2023, used since for every context-extension method, with a shorter introduction
so that a few filler sentences fit even in 64 tokens):

    There is a pass key hidden in this text. Remember it. The grass is green. The sky is blue. ...
    The pass key is 71432. Remember it. ... Here we go. What is the pass key? The pass key is

The filler sentences are drawn from five with a seeded generator, and filled up to a target length in
tokens of the model's own tokenizer; the key sits at a depth (0: right after the introduction, 1: right
before the question) measured in filler sentences. Items span every (length, depth) cell: by default
lengths of 1/8, 1/4, 1/2 and all of the model's context (L/2, L, 2L and 4L for a model trained at a
quarter of it, as a context-extended one is) and depths 0, 0.25, 0.5, 0.75 and 1.

Scoring is a ranking by log-likelihood: the true key as a continuation against nine other 5-digit
keys (chance 0.1). Even a small model that cannot yet generate the key exactly puts more probability
on the one it has read, so the task gives signal early; `exact_match` (every token of the true key is
the greedy choice, i.e. greedy decoding writes the key) is reported next to it. The context is run
once per item and its KV cache shared by the candidates. Results come per length, per depth and per
cell, and overall.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from smelt.errors import UserError

PASSKEY_VERSION = "passkey-v1"  # part of the task's fingerprint: change it when the prompts change
PASSKEY_SEED = 4321  # fixed, not the run seed: every run is scored on the same items
FRACTIONS = (0.125, 0.25, 0.5, 1.0)  # of the model's context
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
DISTRACTORS = 9
PER_CELL = 10  # items per (length, depth) cell when no limit is set

INTRO = "There is a pass key hidden in this text. Remember it."
FILLER = (
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
)
NEEDLE = " The pass key is {key}. Remember it."
QUESTION = " What is the pass key? The pass key is"
ANSWER = " {key}"

Record = dict[str, Any]


def passkey_records(
    limit: int = 0,
    fractions: tuple[float, ...] = FRACTIONS,
    depths: tuple[float, ...] = DEPTHS,
    seed: int = PASSKEY_SEED,
) -> list[Record]:
    """The items: every (fraction of the context, depth) cell the same number of times, round-robin,
    so that a `limit` (rounded up to whole rounds of cells) keeps every cell. Each record holds its
    key, its distractors and the seed of its filler."""
    cells = [(f, d) for f in fractions for d in depths]
    rounds = math.ceil(limit / len(cells)) if limit else PER_CELL
    rng = random.Random(f"{seed}:passkey")
    records = []
    for _ in range(rounds):
        for fraction, depth in cells:
            key = rng.randrange(10_000, 100_000)
            others = set()
            while len(others) < DISTRACTORS:
                other = rng.randrange(10_000, 100_000)
                if other != key:
                    others.add(other)
            records.append(
                {
                    "id": len(records),
                    "fraction": fraction,
                    "depth": depth,
                    "key": str(key),
                    "distractors": [str(o) for o in sorted(others)],
                    "filler_seed": rng.getrandbits(32),
                }
            )
    return records


@dataclass
class PasskeyPrepared:
    """Passkey items as token ids: one context per item and its candidate keys (the true one first)."""

    items: list[Record]
    contexts: list[list[int]] = field(default_factory=list)
    candidates: list[list[list[int]]] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # the cell's target length in tokens
    skipped: int = 0
    convention: str = "eos"


class _Pieces:
    """Token ids of the prompt's pieces, each encoded once (pieces start at a word boundary, so their
    ids joined are the ids of the joined text for a pre-tokenizing BPE)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[str, list[int]] = {}

    def __call__(self, text: str) -> list[int]:
        if text not in self.cache:
            self.cache[text] = list(self.tokenizer.encode(text))
        return self.cache[text]


def build_prompt(
    pieces: Any, key: str, depth: float, target: int, filler_seed: int, prefix: list[int], answer_len: int
) -> list[int] | None:
    """Context ids of one item: introduction, filler with the needle at `depth`, question; as long as
    whole filler sentences allow with context + answer within `target` tokens. None when even no filler
    does not fit."""
    head = [*prefix, *pieces(INTRO)]
    needle = pieces(NEEDLE.format(key=key))
    question = pieces(QUESTION)
    budget = target - answer_len - len(head) - len(needle) - len(question)
    if budget < 0:
        return None
    rng = random.Random(filler_seed)
    filler: list[list[int]] = []
    used = 0
    while True:
        ids = pieces(" " + rng.choice(FILLER))
        if used + len(ids) > budget:
            break
        filler.append(ids)
        used += len(ids)
    at = round(depth * len(filler))
    body = [t for ids in filler[:at] for t in ids] + needle + [t for ids in filler[at:] for t in ids]
    return head + body + question


def prepare_passkey(
    records: list[Record], tokenizer: Any, max_len: int, convention: str = "eos"
) -> PasskeyPrepared:
    """Token ids of every item for a model whose context is max_len tokens. Under the "eos" convention
    a context starts with one EOS (as training documents do), under "lm-eval" with its text. An item
    whose length cell is too short for the prompt without filler is skipped and counted."""
    pieces = _Pieces(tokenizer)
    prefix = [tokenizer.eos_id] if convention == "eos" else []
    prep = PasskeyPrepared([], convention=convention)
    for record in records:
        target = min(int(round(record["fraction"] * max_len)), max_len)
        keys = [record["key"], *record["distractors"]]
        candidates = [pieces(ANSWER.format(key=k)) for k in keys]
        answer_len = max(len(c) for c in candidates)
        context = build_prompt(
            pieces, record["key"], record["depth"], target, record["filler_seed"], prefix, answer_len
        )
        if context is None:
            prep.skipped += 1
            continue
        prep.items.append(record)
        prep.contexts.append(context)
        prep.candidates.append(candidates)
        prep.lengths.append(target)
    return prep


@torch.no_grad()
def candidate_logprobs(
    model: torch.nn.Module, context: list[int], candidates: list[list[int]], device: torch.device
) -> tuple[list[float], list[bool]]:
    """Log-probability of each candidate as the continuation of `context`, and whether each of its
    tokens is the greedy choice. The context runs once; its KV cache is copied to every candidate."""
    from smelt.model.generate import KVCache

    need = len(context) + max(len(c) for c in candidates) - 1
    if need > model.cfg.max_seq_len:
        raise UserError(
            f"a passkey item takes {need} tokens but the model's context (model.max_seq_len) is "
            f"{model.cfg.max_seq_len}. Score lengths up to the context, or widen the model's RoPE table first "
            f"(smelt.model.rope.extend_context) to measure how it extrapolates."
        )
    dtype = next(model.parameters()).dtype
    single = KVCache(model, 1, need, dtype, device)
    logits, _ = model(torch.tensor([context], device=device), cache=single)
    first = F.log_softmax(logits[0, -1].float(), dim=-1)
    width = max(len(c) for c in candidates)
    shared = KVCache(model, len(candidates), need, dtype, device)
    for layer in range(len(shared.k)):
        shared.k[layer][:, :, : single.pos] = single.k[layer][:, :, : single.pos]
        shared.v[layer][:, :, : single.pos] = single.v[layer][:, :, : single.pos]
    shared.pos = single.pos
    rest = None
    if width > 1:
        # Right-padded: a causal model never lets a candidate's padding change its earlier tokens.
        inputs = torch.zeros((len(candidates), width - 1), dtype=torch.long)
        for row, cand in enumerate(candidates):
            inputs[row, : len(cand) - 1] = torch.tensor(cand[:-1], dtype=torch.long)
        logits, _ = model(inputs.to(device), cache=shared)
        rest = F.log_softmax(logits.float(), dim=-1)
    logprobs, greedy = [], []
    for row, cand in enumerate(candidates):
        total = first[cand[0]].item()
        best = first.argmax().item() == cand[0]
        for i, token in enumerate(cand[1:]):
            total += rest[row, i, token].item()
            best = best and rest[row, i].argmax().item() == token
        logprobs.append(total)
        greedy.append(bool(best))
    return logprobs, greedy


def _cell(hits: list[bool], exact: list[bool]) -> dict[str, Any]:
    n = len(hits)
    return {"acc": sum(hits) / n, "exact_match": sum(exact) / n, "items": n}


def score_passkey(
    model: torch.nn.Module, prep: PasskeyPrepared, device: torch.device, details: bool = False
) -> dict[str, Any]:
    """Accuracy (the true key ranks first among 1 + 9 candidates) and exact match, overall, per length
    (in tokens), per depth and per (length, depth) cell."""
    from smelt.progress import progress

    was_training = model.training
    model.eval()
    rows = []
    try:
        for i in progress(range(len(prep.items)), desc="passkey", unit="item"):
            logprobs, greedy = candidate_logprobs(model, prep.contexts[i], prep.candidates[i], device)
            rank_first = all(logprobs[0] > lp for lp in logprobs[1:])
            rows.append((prep.lengths[i], prep.items[i]["depth"], rank_first, greedy[0], logprobs))
    finally:
        model.train(was_training)
    n = len(rows)
    result: dict[str, Any] = {
        "formulation": "passkey",
        "metric": "acc",
        "items": n,
        "skipped": prep.skipped,
        "shots": 0,
        "convention": prep.convention,
        "chance": 1 / (1 + DISTRACTORS),
    }
    if n == 0:
        return {**result, "score": None, "stderr": None}
    overall = _cell([r[2] for r in rows], [r[3] for r in rows])
    result.update(acc=overall["acc"], exact_match=overall["exact_match"])
    lengths = sorted({r[0] for r in rows})
    depths = sorted({r[1] for r in rows})
    result["by_length"] = {
        str(n_tok): _cell([r[2] for r in rows if r[0] == n_tok], [r[3] for r in rows if r[0] == n_tok])
        for n_tok in lengths
    }
    result["by_depth"] = {
        str(d): _cell([r[2] for r in rows if r[1] == d], [r[3] for r in rows if r[1] == d]) for d in depths
    }
    result["by_cell"] = {
        str(n_tok): {
            str(d): sum(r[2] for r in rows if r[0] == n_tok and r[1] == d)
            / max(1, sum(1 for r in rows if r[0] == n_tok and r[1] == d))
            for d in depths
        }
        for n_tok in lengths
    }
    result["score"] = result["acc"]
    result["stderr"] = math.sqrt(result["acc"] * (1 - result["acc"]) / (n - 1)) if n > 1 else 0.0
    if details:
        result["details"] = [
            {"id": rec["id"], "length": r[0], "depth": r[1], "key": rec["key"], "logprobs": r[4],
             "correct": r[2], "greedy": r[3]}
            for rec, r in zip(prep.items, rows, strict=True)
        ]  # fmt: skip
    return result


def evaluate_passkey(
    model: torch.nn.Module,
    tokenizer: Any,
    lengths: tuple[int, ...],
    depths: tuple[float, ...] = DEPTHS,
    per_cell: int = PER_CELL,
    device: torch.device | None = None,
    convention: str = "eos",
    seed: int = PASSKEY_SEED,
) -> dict[str, Any]:
    """Passkey accuracy at explicit lengths in tokens (e.g. 256, 512, 1024 around a training length),
    outside the task harness: the form a benchmark comparing a model before and after a context
    extension uses. The lengths must fit the model's context (see extend_context to go past it)."""
    device = device or next(model.parameters()).device
    longest = max(lengths)
    records = passkey_records(
        per_cell * len(lengths) * len(depths), tuple(n / longest for n in lengths), depths, seed
    )
    return score_passkey(model, prepare_passkey(records, tokenizer, longest, convention), device)
