"""Readers for evaluation sets in their original release files, for decontamination.

Each reader yields the text of every benchmark item as a model could have seen it on the web: the
question (or context) followed by its correct answer. Formats (the layouts of `../shared/data/eval`):

* `mosaic`: llm-foundry ICL jsonl: `{query, choices, gold}`, `{context_options, continuation, gold}`
  (WinoGrande, WSC) or `{context, continuation}` (LAMBADA);
* `olmes`: OLMES `requests.jsonl.gz` (a file or the directory holding it): one item per `doc_id` below
  1,000,000, from its `doc` (`query` + gold choice; WinoGrande's `sentence` with the right option;
  SciQ's `support`, `question`, `correct_answer`);
* `gsm8k`: `{question, answer}` jsonl;
* `mmlu_csv`: a csv file or a directory of them, header `question,choice0..3,answer` (answer 0-3), or
  the original header-less Hendrycks layout (answer letter A-D);
* `jsonl`: any jsonl; the item is the configured `fields` joined with spaces.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from smelt.config import EvalSetConfig
from smelt.errors import UserError
from smelt.jsonl import json_objects

OLMES_UNCONDITIONAL = 1_000_000
FORMATS = ("mosaic", "olmes", "gsm8k", "mmlu_csv", "jsonl")


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _jsonl(path: Path, key: str) -> Iterator[dict[str, Any]]:
    with _open_text(path) as handle:
        fix = "Point the path at the benchmark's jsonl file or choose the matching `format`."
        for _, record in json_objects(handle, path, f"{key}:", fix):
            yield record


def _need(record: dict[str, Any], fields: tuple[str, ...], key: str, path: Path, fmt: str) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise UserError(
            f"{key}: a record of {path} lacks {', '.join(missing)} (format {fmt!r} expects them); "
            f'its keys are {sorted(record)}. Set `format` to the file\'s layout, or use format = "jsonl" '
            f"with `fields`."
        )


def _mosaic_item(record: dict[str, Any], key: str, path: Path) -> str:
    if "query" in record and "choices" in record:
        return f"{record['query']} {record['choices'][int(record.get('gold', 0))]}"
    if "context_options" in record:
        _need(record, ("continuation", "gold"), key, path, "mosaic")
        return f"{record['context_options'][int(record['gold'])]} {record['continuation']}"
    _need(record, ("context", "continuation"), key, path, "mosaic")
    return f"{record['context']} {record['continuation']}"


def _olmes_item(doc: dict[str, Any]) -> str:
    if "query" in doc and "choices" in doc and "gold" in doc:
        return f"{doc['query']} {doc['choices'][int(doc['gold'])]}"
    if "sentence" in doc and "option1" in doc:
        option = doc["option1"] if str(doc.get("answer")) == "1" else doc["option2"]
        return doc["sentence"].replace("_", option)
    if "question" in doc and "correct_answer" in doc:
        return f"{doc.get('support', '')} {doc['question']} {doc['correct_answer']}".strip()
    return " ".join(v for v in doc.values() if isinstance(v, str))


def _csv_items(path: Path) -> Iterator[str]:
    with open(path, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    if rows and [c.strip().lower() for c in rows[0][:1]] == ["question"]:
        rows = rows[1:]
    for row in rows:
        if len(row) < 6:
            continue
        answer = row[5].strip()
        choice = int(answer) if answer.isdigit() else "ABCD".find(answer.upper())
        yield f"{row[0]} {row[1 + choice]}" if 0 <= choice < 4 else row[0]


def read_items(spec: EvalSetConfig, key: str) -> list[str]:
    """The item texts of one configured evaluation set. Raises UserError naming `key` when the path is
    missing, the format unknown, or the file not in that format."""
    if spec.format not in FORMATS:
        raise UserError(
            f"{key}.format = {spec.format!r} is not a benchmark format; use one of {', '.join(FORMATS)}."
        )
    if not spec.path:
        raise UserError(f"{key}.path is empty: set it to the benchmark file (e.g. ../shared/data/eval/...).")
    path = Path(spec.path)
    if not path.exists():
        raise UserError(
            f"{key}.path = {spec.path!r} does not exist (resolved from {Path.cwd()}). Fix the path or remove "
            f"the evaluation set."
        )
    if spec.format == "mmlu_csv":
        files = sorted(path.rglob("*.csv")) if path.is_dir() else [path]
        if not files:
            raise UserError(f"{key}.path = {spec.path!r} holds no .csv files (format mmlu_csv).")
        return [item for f in files for item in _csv_items(f)]
    if path.is_dir():
        found = sorted(path.glob("requests.jsonl.gz")) or sorted(path.glob("*.jsonl*"))
        if len(found) != 1:
            raise UserError(
                f"{key}.path = {spec.path!r} is a directory with {len(found)} jsonl files; name one file."
            )
        path = found[0]
    if spec.format == "olmes":
        docs: dict[Any, str] = {}
        for record in _jsonl(path, key):
            _need(record, ("doc", "doc_id"), key, path, "olmes")
            if int(record["doc_id"]) < OLMES_UNCONDITIONAL and record["doc_id"] not in docs:
                docs[record["doc_id"]] = _olmes_item(record["doc"])
        return list(docs.values())
    if spec.format == "gsm8k":
        items = []
        for record in _jsonl(path, key):
            _need(record, ("question", "answer"), key, path, "gsm8k")
            items.append(f"{record['question']} {record['answer']}")
        return items
    if spec.format == "jsonl":
        if not spec.fields:
            raise UserError(f"{key}.fields is empty: format jsonl needs the record fields that make an item.")
        items = []
        for record in _jsonl(path, key):
            _need(record, tuple(spec.fields), key, path, "jsonl")
            items.append(" ".join(str(record[f]) for f in spec.fields))
        return items
    return [_mosaic_item(record, key, path) for record in _jsonl(path, key)]
