"""The chat data contract and readers into it.

A conversation is `{"messages": [{"role", "content"}, ...]}` (roles system, user, assistant, tool);
a task item may add `"answer"` (the verifiable final answer). A preference pair is
`{"prompt": [messages], "chosen": [messages], "rejected": [messages]}`: the shared context and the two
replies that differ. Readers turn GSM8K (`{"question", "answer"}` with `#### N`) and Anthropic
hh-rlhf (`{"chosen", "rejected"}` dialogues in `\\n\\nHuman: ... \\n\\nAssistant: ...` form) into them.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smelt.chat_template import ROLES
from smelt.errors import UserError

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
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(
                    f"{path}:{number} is not valid JSON ({exc}); fix or remove the line."
                ) from exc
            if not isinstance(record, dict):
                raise UserError(f"{path}:{number} must be a JSON object.")
            yield number, record


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


def read_gsm8k(path: str | Path, keep_calculations: bool = False) -> list[dict[str, Any]]:
    return [gsm8k_item(r, f"{path}:{n}", keep_calculations) for n, r in read_jsonl(path)]


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


def read_chat(path: str | Path) -> list[dict[str, Any]]:
    """Conversations of a `{"messages": [...]}` JSONL file (an optional "answer" is kept)."""
    items = []
    for number, record in read_jsonl(path):
        item: dict[str, Any] = {"messages": check_messages(record.get("messages"), f"{path}:{number}")}
        if "answer" in record:
            item["answer"] = normalize_number(str(record["answer"]))
        items.append(item)
    return items


def read_preferences(path: str | Path) -> list[dict[str, Any]]:
    """Pairs of a `{"prompt", "chosen", "rejected"}` JSONL file, each side a list of messages."""
    pairs = []
    for number, record in read_jsonl(path):
        where = f"{path}:{number}"
        pairs.append(
            {
                key: check_messages(record.get(key), f"{where} ({key})")
                for key in ("prompt", "chosen", "rejected")
            }
        )
    return pairs


def addition_items(n: int, seed: int, digits: int = 2) -> list[dict[str, Any]]:
    """A synthetic verifiable task: `a+b` -> the sum, both operands with `digits` digits at most."""
    rng = random.Random(seed)
    top = 10**digits
    items = []
    for _ in range(n):
        a, b = rng.randrange(top), rng.randrange(top)
        items.append({
            "messages": [{"role": "user", "content": f"{a}+{b}"},
                         {"role": "assistant", "content": str(a + b)}],
            "answer": str(a + b),
        })  # fmt: skip
    return items


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
