"""Synthetic data for bench/effects.py: preference pairs of a correct against an incorrect sum.

The pairs are 1-digit addition problems, split by smelt's own held-out partition of {a, b}
(`smelt.posttrain.chat.addition_heldout`, the partition SFT and `smelt posttrain eval --addition` use):
training pairs come from the training partition and held-out pairs (the stage's `data.heldout_path`)
from the held-out one, so no held-out problem, in either order, is a training problem, and the SFT
parent never trained on a held-out problem either. Each problem gets several pairs: its correct sum
against distinct wrong sums drawn from 0-18 (the range of every 1-digit sum), so a wrong answer looks
like an answer and only the arithmetic tells them apart.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from smelt.posttrain.chat import addition_heldout, write_jsonl

WRONG_PER_PROBLEM = 6


def addition_pairs(
    heldout: bool, seed: int, wrong_per_problem: int = WRONG_PER_PROBLEM
) -> list[dict[str, Any]]:
    """Every ordered 1-digit problem of one side of the partition, each with `wrong_per_problem` pairs."""
    rng = random.Random(seed)
    pairs = []
    for a in range(10):
        for b in range(10):
            if addition_heldout(a, b) != heldout:
                continue
            for wrong in rng.sample([w for w in range(19) if w != a + b], wrong_per_problem):
                pairs.append({"prompt": [{"role": "user", "content": f"{a}+{b}"}],
                              "chosen": [{"role": "assistant", "content": str(a + b)}],
                              "rejected": [{"role": "assistant", "content": str(wrong)}]})  # fmt: skip
    return pairs


def unordered_problem(pair: dict[str, Any]) -> tuple[int, int]:
    a, b = (int(x) for x in pair["prompt"][-1]["content"].split("+"))
    return min(a, b), max(a, b)


def write_addition_pairs(train: Path, held: Path, seed: int) -> dict[str, int]:
    """Write the training and held-out pairs as smelt preference JSONL; returns the counts the result
    records, and fails if a held-out problem (in either order) is among the training problems."""
    train_pairs, held_pairs = addition_pairs(False, seed), addition_pairs(True, seed + 10_000)
    shared = {unordered_problem(p) for p in train_pairs} & {unordered_problem(p) for p in held_pairs}
    if shared:
        raise AssertionError(f"held-out problems also in training: {sorted(shared)}")
    write_jsonl(train, train_pairs)
    write_jsonl(held, held_pairs)
    return {"train_pairs": len(train_pairs), "heldout_pairs_written": len(held_pairs),
            "train_problems": len({unordered_problem(p) for p in train_pairs}),
            "heldout_problems": len({unordered_problem(p) for p in held_pairs}), "shared_problems": 0}  # fmt: skip
