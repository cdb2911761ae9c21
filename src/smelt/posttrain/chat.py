"""The chat data contract and readers into it.

A conversation is `{"messages": [{"role", "content"}, ...]}` (roles system, user, assistant, tool);
a task item may add `"answer"` (the verifiable final answer). A preference pair is
`{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`: the shared context and the two
replies that differ. Readers turn GSM8K (`{"question", "answer"}` with `#### N`) and Anthropic
hh-rlhf (`{"chosen", "rejected"}` dialogues in `\\n\\nHuman: ... \\n\\nAssistant: ...` form) into them.
"""

from __future__ import annotations

import functools
import gzip
import json
import random
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smelt.chat_template import ROLES
from smelt.errors import UserError
from smelt.jsonl import json_objects

_CALC = re.compile(r"<<[^<>]*>>")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_HH_TURN = re.compile(r"\n\n(Human|Assistant): ")


def check_messages(messages: Any, where: str) -> list[dict[str, str]]:
    """The messages of one record, validated: a non-empty list of {"role", "content"} with known roles."""
    if not isinstance(messages, list) or not messages:
        raise UserError(f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects.')
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise UserError(f'{where}: message {i} must be an object with a string "content".')
        if message.get("role") not in ROLES:
            raise UserError(
                f"{where}: message {i} has role {message.get('role')!r}; use one of {', '.join(ROLES)}."
            )
        out.append({"role": message["role"], "content": message["content"]})
    return out


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) of a JSONL file, gzipped when its name ends in .gz."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"data file {path} does not exist; check posttrain data.path.")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        yield from json_objects(handle, path, "data file", "Fix or remove the line (posttrain data.path).")


# --- answers -----------------------------------------------------------------------------------


def normalize_number(text: str) -> str:
    """`1,234.50` -> `1234.5`, `-7` -> `-7`: the form answers are compared in."""
    text = text.replace(",", "").strip()
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def final_number(text: str) -> str | None:
    """The answer a completion gives: the number after its last `####`, else its last number."""
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        match = _NUMBER.search(tail)
        return normalize_number(match.group()) if match else None
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


# --- GSM8K ------------------------------------------------------------------------------------


def gsm8k_item(record: dict[str, Any], where: str, keep_calculations: bool = False) -> dict[str, Any]:
    """A GSM8K record -> a conversation (question, worked answer) with its final answer."""
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str) or "####" not in answer:
        raise UserError(
            f'{where}: a GSM8K record needs string "question" and "answer" fields, the answer ending in '
            f"`#### <number>`; is this the right data.format?"
        )
    worked = answer if keep_calculations else _CALC.sub("", answer)
    return {
        "messages": [{"role": "user", "content": question}, {"role": "assistant", "content": worked}],
        "answer": normalize_number(answer.rsplit("####", 1)[1]),
    }


def gsm8k_records(path: str | Path, keep_calculations: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """("file:line", conversation) of each GSM8K record."""
    for n, record in read_jsonl(path):
        yield f"{path}:{n}", gsm8k_item(record, f"{path}:{n}", keep_calculations)


def read_gsm8k(path: str | Path, keep_calculations: bool = False) -> list[dict[str, Any]]:
    return [item for _, item in gsm8k_records(path, keep_calculations)]


# --- hh-rlhf ----------------------------------------------------------------------------------


def hh_turns(dialogue: str) -> list[dict[str, str]] | None:
    """`\\n\\nHuman: a\\n\\nAssistant: b` -> messages; None when the text does not follow that form."""
    parts = _HH_TURN.split(dialogue)
    if parts[0].strip() or len(parts) < 3:
        return None
    roles = {"Human": "user", "Assistant": "assistant"}
    return [{"role": roles[parts[i]], "content": parts[i + 1]} for i in range(1, len(parts), 2)]


def hh_pair(record: dict[str, Any]) -> dict[str, Any] | None:
    """A hh-rlhf record -> a preference pair (shared turns, last assistant reply of each side), or None
    when the two dialogues do not share every turn but a final assistant reply."""
    chosen, rejected = hh_turns(record.get("chosen") or ""), hh_turns(record.get("rejected") or "")
    if not chosen or not rejected or len(chosen) != len(rejected):
        return None
    if (
        chosen[-1]["role"] != "assistant"
        or rejected[-1]["role"] != "assistant"
        or chosen[:-1] != rejected[:-1]
    ):
        return None
    if chosen[-1]["content"] == rejected[-1]["content"]:
        return None
    return {"prompt": chosen[:-1], "chosen": [chosen[-1]], "rejected": [rejected[-1]]}


def read_hh_rlhf(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """Preference pairs of a hh-rlhf file and how many records did not make a pair (skipped)."""
    pairs, skipped = [], 0
    for _, record in read_jsonl(path):
        pair = hh_pair(record)
        if pair is None:
            skipped += 1
        else:
            pairs.append(pair)
    if not pairs:
        raise UserError(
            f'{path}: no record is a hh-rlhf pair ("chosen"/"rejected" dialogues that share every turn but '
            f"the last assistant reply); is this the right data.format?"
        )
    return pairs, skipped


# --- smelt's own formats ----------------------------------------------------------------------


def chat_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """("file:line", conversation) of a `{"messages": [...]}` JSONL file (an optional "answer" is kept)."""
    for number, record in read_jsonl(path):
        item: dict[str, Any] = {"messages": check_messages(record.get("messages"), f"{path}:{number}")}
        if "answer" in record:
            item["answer"] = normalize_number(str(record["answer"]))
        yield f"{path}:{number}", item


def read_chat(path: str | Path) -> list[dict[str, Any]]:
    return [item for _, item in chat_records(path)]


def preference_records(path: str | Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """("file:line", pair) of a `{"prompt", "chosen", "rejected"}` JSONL file, each side a list of messages."""
    for number, record in read_jsonl(path):
        where = f"{path}:{number}"
        yield (
            where,
            {
                key: check_messages(record.get(key), f"{where} ({key})")
                for key in ("prompt", "chosen", "rejected")
            },
        )


def read_preferences(path: str | Path) -> list[dict[str, Any]]:
    return [pair for _, pair in preference_records(path)]


# One unordered problem {a, b} in HELDOUT_SHARE is held out, by a hash of the pair: `a+b` and `b+a` fall
# on the same side, and a problem's side does not depend on data.addition_digits (the 1-digit problems of
# a 2-digit run are split as in a 1-digit run). Training items come only from the rest.
HELDOUT_SHARE = 4


def addition_heldout(a: int, b: int) -> bool:
    """Whether the problem `a+b` belongs to the held-out partition (never trained on)."""
    return zlib.crc32(f"{min(a, b)}+{max(a, b)}".encode()) % HELDOUT_SHARE == 0


@functools.lru_cache(maxsize=8)
def _heldout_problems(digits: int) -> tuple[tuple[int, int], ...]:
    top = 10**digits
    return tuple((a, b) for a in range(top) for b in range(top) if addition_heldout(a, b))


def heldout_addition_problems(digits: int) -> int:
    """How many distinct problems the held-out partition holds at `digits` digits per operand (counted up to
    3 digits; beyond, about a quarter of 10**(2 * digits), more than any data.heldout asks)."""
    return len(_heldout_problems(digits)) if digits <= 3 else 10 ** (2 * digits) // HELDOUT_SHARE


def addition_items(n: int, seed: int, digits: int = 2, heldout: bool = False) -> list[dict[str, Any]]:
    """A synthetic verifiable task: `a+b` -> the sum, both operands with `digits` digits at most.

    Training items (`heldout=False`) are drawn with replacement from the training partition; held-out
    items are `n` distinct problems of the held-out partition (`addition_heldout`), so no held-out problem
    is ever a training item. Asking for more held-out problems than the partition holds is an error: check
    `heldout_addition_problems(digits)` first and name the setting in the message."""
    rng = random.Random(seed)
    top = 10**digits
    if not heldout:
        pairs: list[tuple[int, int]] = []
        while len(pairs) < n:
            a, b = rng.randrange(top), rng.randrange(top)
            if not addition_heldout(a, b):
                pairs.append((a, b))
    elif n > heldout_addition_problems(digits):
        raise ValueError(f"{n} held-out {digits}-digit addition problems asked for; the partition holds "
                         f"{heldout_addition_problems(digits)}")  # fmt: skip
    elif digits <= 3:
        pairs = rng.sample(_heldout_problems(digits), n)
    else:
        chosen: dict[tuple[int, int], None] = {}
        while len(chosen) < n:
            a, b = rng.randrange(top), rng.randrange(top)
            if addition_heldout(a, b):
                chosen[(a, b)] = None
        pairs = list(chosen)
    return [{"messages": [{"role": "user", "content": f"{a}+{b}"},
                          {"role": "assistant", "content": str(a + b)}],
             "answer": str(a + b)} for a, b in pairs]  # fmt: skip


# --- input that teaches nothing ----------------------------------------------------------------


def useless_conversation(item: dict[str, Any], needs_reply: bool) -> str | None:
    """Why a conversation teaches nothing (a reason to drop it with), or None: a message with empty
    content; for SFT (`needs_reply`) no assistant turn to train on; for RL no prompt to reply to."""
    messages = item["messages"]
    if any(not m["content"].strip() for m in messages):
        return "empty_content"
    if needs_reply and not any(m["role"] == "assistant" for m in messages):
        return "no_assistant_turn"
    if not needs_reply and not prompt_of(item):
        return "no_prompt"
    return None


def useless_pair(pair: dict[str, Any]) -> str | None:
    """Why a preference pair teaches nothing, or None: empty content, a side with no assistant turn, or
    two identical sides."""
    if any(not m["content"].strip() for key in ("prompt", "chosen", "rejected") for m in pair[key]):
        return "empty_content"
    if not all(any(m["role"] == "assistant" for m in pair[key]) for key in ("chosen", "rejected")):
        return "no_assistant_turn"
    if pair["chosen"] == pair["rejected"]:
        return "identical_replies"
    return None


def prompt_text(messages: list[dict[str, str]]) -> str:
    """The text of messages, one per line: what decontamination compares."""
    return "\n".join(m["content"] for m in messages)


def prompt_of(item: dict[str, Any]) -> list[dict[str, str]]:
    """The messages up to (not including) the final assistant reply: what a model is asked."""
    messages = item["messages"]
    return messages[:-1] if messages and messages[-1]["role"] == "assistant" else messages


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
