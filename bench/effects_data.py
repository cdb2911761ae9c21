"""Synthetic data for bench/effects.py: preference pairs of a correct against an incorrect sum.

Every pair is a distinct unordered problem {a, b} (never both `a+b` and `b+a`), so however a stage splits
the file into training and held-out pairs, no held-out problem is a training problem. The rejected
answer is the correct sum with its last digit replaced by another digit, so the two replies have the
same length and the same leading digits: only the last digit, the sum of the operands' last digits
mod 10, tells them apart.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from smelt.posttrain.chat import write_jsonl


def addition_pairs(n: int, digits: int, seed: int) -> list[dict[str, Any]]:
    """`n` preference pairs on distinct unordered addition problems whose operands have exactly `digits`
    digits (so none is a problem of a run that trained on fewer digits)."""
    rng = random.Random(seed)
    low, top = 10 ** (digits - 1) if digits > 1 else 0, 10**digits
    if n > (top - low) * (top - low + 1) // 2:
        raise ValueError(f"{n} distinct unordered {digits}-digit problems asked for; there are fewer")
    seen: set[tuple[int, int]] = set()
    pairs = []
    while len(pairs) < n:
        a, b = rng.randrange(low, top), rng.randrange(low, top)
        key = (min(a, b), max(a, b))
        if key in seen:
            continue
        seen.add(key)
        wrong = a + b
        while wrong == a + b:
            wrong = (a + b) // 10 * 10 + rng.randrange(10)
        user = [{"role": "user", "content": f"{a}+{b}"}]
        pairs.append({"prompt": user,
                      "chosen": [{"role": "assistant", "content": str(a + b)}],
                      "rejected": [{"role": "assistant", "content": str(wrong)}]})  # fmt: skip
    return pairs


def unordered_problem(pair: dict[str, Any]) -> tuple[int, int]:
    a, b = (int(x) for x in pair["prompt"][-1]["content"].split("+"))
    return min(a, b), max(a, b)


def write_addition_pairs(path: Path, n: int, digits: int, seed: int) -> dict[str, int]:
    """Write the pairs as smelt preference JSONL; returns the counts the result records (problems,
    distinct unordered problems: equal, so any split of the file is disjoint)."""
    pairs = addition_pairs(n, digits, seed)
    write_jsonl(path, pairs)
    return {"pairs": len(pairs), "distinct_unordered_problems": len({unordered_problem(p) for p in pairs})}
