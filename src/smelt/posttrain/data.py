"""The training items of a stage, read as its [data] section says, and a seeded held-out split."""

from __future__ import annotations

import random
from typing import Any

from smelt.errors import UserError
from smelt.posttrain.chat import (
    addition_items,
    read_chat,
    read_gsm8k,
    read_hh_rlhf,
    read_preferences,
)
from smelt.posttrain.config import DataSection


def read_items(data: DataSection) -> list[dict[str, Any]]:
    """Conversations (`{"messages", "answer"?}`) for SFT and GRPO."""
    if data.format == "addition":
        items = addition_items(data.addition_items, seed=12345, digits=data.addition_digits)
    elif data.format == "gsm8k":
        items = read_gsm8k(_path(data), data.keep_calculations)
    elif data.format == "chat":
        items = read_chat(_path(data))
    elif data.format == "hh-rlhf":  # the chosen side, as chat data
        pairs, _ = read_hh_rlhf(_path(data))
        items = [{"messages": p["prompt"] + p["chosen"]} for p in pairs]
    else:
        raise UserError(
            f"data.format = {data.format!r} holds preference pairs, not conversations; use chat, gsm8k, "
            f"hh-rlhf or addition for this stage."
        )
    return items[: data.limit] if data.limit else items


def read_pairs(data: DataSection) -> list[dict[str, Any]]:
    """Preference pairs (`{"prompt", "chosen", "rejected"}`) for DPO."""
    if data.format == "hh-rlhf":
        pairs, _ = read_hh_rlhf(_path(data))
    elif data.format == "preferences":
        pairs = read_preferences(_path(data))
    else:
        raise UserError(
            f"data.format = {data.format!r} has no preference pairs; DPO reads data.format = 'hh-rlhf' or "
            f'\'preferences\' (JSONL {{"prompt", "chosen", "rejected"}}).'
        )
    return pairs[: data.limit] if data.limit else pairs


def _path(data: DataSection) -> str:
    if not data.path:
        raise UserError(
            f"data.path is empty: data.format = {data.format!r} reads a JSONL file; set data.path."
        )
    return data.path


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
