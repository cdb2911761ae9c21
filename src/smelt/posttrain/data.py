"""The items of a stage, read as its [data] section says: what it trains on and what it holds out.

Input that teaches nothing (a message with empty content, a conversation SFT cannot train on because it
has no assistant turn, a preference pair with identical sides) is dropped with a reason and counted, as
curation quarantines unreadable input. Held-out items never overlap the training items: the synthetic
addition task holds out a partition of its problem space (`chat.addition_heldout`), the other formats a
seeded shuffle, and then every held-out item whose prompt the training data contains (curation's 13-gram
rule, `smelt.data.dedup.decontam.overlapping_items`) is dropped and counted too.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smelt.data.dedup.decontam import overlapping_items
from smelt.errors import UserError
from smelt.posttrain.chat import (
    addition_items,
    chat_records,
    gsm8k_records,
    heldout_addition_problems,
    preference_records,
    prompt_of,
    prompt_text,
    read_hh_rlhf,
    useless_conversation,
    useless_pair,
)
from smelt.posttrain.config import DataSection

ADDITION_TRAIN_SEED = 12345
ADDITION_HELDOUT_SEED = 999  # also `smelt posttrain eval --addition N`: the same held-out problems first
DECONTAM_NGRAM = 13  # curation's defaults ([data.decontam])
DECONTAM_THRESHOLD = 0.5


@dataclass
class Split:
    """A stage's items: trained on, held out, and what was left out of both and why."""

    train: list[dict[str, Any]]
    held: list[dict[str, Any]]
    dropped: dict[str, int] = field(default_factory=dict)  # input records, by reason
    dropped_records: list[dict[str, Any]] = field(default_factory=list)  # {"where", "reason"}
    contaminated: int = 0  # held-out items whose prompt the training data contains
    train_texts: list[str] = field(default_factory=list)  # what held-out prompts are checked against

    def stats(self) -> dict[str, Any]:
        """What the start event and summary.json record."""
        return {"dropped": dict(sorted(self.dropped.items())), "heldout_contaminated": self.contaminated}


def conversation_split(data: DataSection, seed: int, stage: str) -> Split:
    """Conversations (`{"messages", "answer"?}`) for SFT (`stage` "sft") and GRPO: train and held out."""
    if data.format == "addition":
        return _addition_split(data)
    if data.format not in ("gsm8k", "chat", "hh-rlhf"):
        raise UserError(
            f"data.format = {data.format!r} holds preference pairs, not conversations; use chat, gsm8k, "
            f"hh-rlhf or addition for this stage."
        )

    def read(path: str) -> tuple[list[tuple[str, dict[str, Any]]], int]:
        if data.format == "gsm8k":
            return list(gsm8k_records(path, data.keep_calculations)), 0
        if data.format == "chat":
            return list(chat_records(path)), 0
        pairs, skipped = _hh_pairs(path)  # hh-rlhf: the chosen side, as chat data
        return [(where, {"messages": p["prompt"] + p["chosen"]}) for where, p in pairs], skipped

    needs_reply = stage == "sft"
    return _split(read, data, seed, lambda item: useless_conversation(item, needs_reply), _prompt, _text)


def pair_split(data: DataSection, seed: int) -> Split:
    """Preference pairs (`{"prompt", "chosen", "rejected"}`) for DPO: train and held out."""
    if data.format == "hh-rlhf":
        return _split(_hh_pairs, data, seed, useless_pair, _pair_prompt, _pair_text)
    if data.format == "preferences":
        return _split(lambda path: (list(preference_records(path)), 0), data, seed, useless_pair, _pair_prompt,
                      _pair_text)  # fmt: skip
    else:
        raise UserError(
            f"data.format = {data.format!r} has no preference pairs; DPO reads data.format = 'hh-rlhf' or "
            f'\'preferences\' (JSONL {{"prompt", "chosen", "rejected"}}).'
        )


def decontaminate(items: list[Any], texts: list[str], prompt: Callable[[Any], str]) -> tuple[list[Any], int]:
    """(the items whose prompt `texts` do not contain, how many were dropped)."""
    found = overlapping_items([prompt(item) for item in items], texts, DECONTAM_NGRAM, DECONTAM_THRESHOLD)
    return [item for i, item in enumerate(items) if i not in found], len(found)


def check_addition_heldout(n: int, digits: int, key: str, fix: str) -> None:
    """A user error when `n` held-out addition problems are more than the held-out partition holds."""
    have = heldout_addition_problems(digits)
    if n > have:
        raise UserError(
            f"{key} = {n} asks for more held-out addition problems than exist: of the {10 ** (2 * digits):,} "
            f"problems with {digits}-digit operands, {have} are held out (never trained on) and the rest are "
            f"training problems. {fix.format(have=have)}"
        )


def _addition_split(data: DataSection) -> Split:
    check_addition_heldout(data.heldout, data.addition_digits, "data.heldout",
                           "Set data.heldout to {have} or fewer, or raise data.addition_digits.")  # fmt: skip
    n = min(data.addition_items, data.limit) if data.limit else data.addition_items
    train = addition_items(n, ADDITION_TRAIN_SEED, data.addition_digits)
    held = addition_items(data.heldout, ADDITION_HELDOUT_SEED, data.addition_digits, heldout=True)
    texts = [t for item in train for t in (_prompt(item), _text(item))]
    held, contaminated = decontaminate(held, texts, _prompt)
    return Split(train, held, contaminated=contaminated, train_texts=texts)


def _split(
    read: Callable[[str], tuple[list[tuple[str, dict[str, Any]]], int]],
    data: DataSection,
    seed: int,
    useless: Callable[[dict[str, Any]], str | None],
    prompt: Callable[[dict[str, Any]], str],
    text: Callable[[dict[str, Any]], str],
) -> Split:
    """Drop what teaches nothing, keep data.limit items, hold out data.heldout of them (a seeded shuffle, at
    most half) or read data.heldout_path's, then drop the held-out items whose prompt the training items
    contain. The training texts are each training item's prompt (the exact match of prompts too short for
    n-grams) and its whole text. `read(path)` gives (records as (where, item), input records it could not
    make an item of)."""
    dropped: Counter[str] = Counter()
    why: list[dict[str, Any]] = []

    def usable(path: str) -> list[dict[str, Any]]:
        records, not_items = read(path)
        if not_items:
            dropped["not_a_pair"] += not_items
        items = []
        for where, item in records:
            reason = useless(item)
            if reason is None:
                items.append(item)
            else:
                dropped[reason] += 1
                why.append({"where": where, "reason": reason})
        return items

    items = usable(_path(data))
    items = items[: data.limit] if data.limit else items
    if not items:
        detail = f" ({sum(dropped.values())} records dropped: {dict(dropped)})" if dropped else ""
        raise UserError(
            f"the stage has no training items{detail}: data.path holds none that teach anything or "
            f"data.limit is too small."
        )
    if data.heldout_path:
        train, held = items, usable(data.heldout_path)
        held = held[: data.heldout] if data.heldout else held
    else:
        train, held = split_heldout(items, data.heldout, seed)
    texts = [t for item in train for t in (prompt(item), text(item))]
    held, contaminated = decontaminate(held, texts, prompt)
    return Split(train, held, dict(dropped), why, contaminated, texts)


def _path(data: DataSection) -> str:
    if not data.path:
        raise UserError(
            f"data.path is empty: data.format = {data.format!r} reads a JSONL file; set data.path."
        )
    return data.path


def _prompt(item: dict[str, Any]) -> str:
    return prompt_text(prompt_of(item))


def _text(item: dict[str, Any]) -> str:
    return prompt_text(item["messages"])


def _hh_pairs(path: str) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    pairs, skipped = read_hh_rlhf(path)
    return [(f"{path} pair {i}", p) for i, p in enumerate(pairs)], skipped


def _pair_prompt(pair: dict[str, Any]) -> str:
    return prompt_text(pair["prompt"])


def _pair_text(pair: dict[str, Any]) -> str:
    return prompt_text(pair["prompt"] + pair["chosen"] + pair["rejected"])


def split_heldout(items: list[Any], heldout: int, seed: int) -> tuple[list[Any], list[Any]]:
    """(train, held-out): a seeded shuffle, the last `heldout` items held out (at most half)."""
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n = min(heldout, len(items) // 2)
    shuffled = [items[i] for i in order]
    train, held = shuffled[: len(items) - n], shuffled[len(items) - n :]
    if not train:
        raise UserError("the stage has no training items: data.path is empty or data.limit is too small.")
    return train, held
