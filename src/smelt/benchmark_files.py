"""Benchmark files in their released formats, read into plain records: the contract that evaluation
(`eval/tasks.py`, which scores the records) and decontamination (`data/dedup/benchmarks.py`, which
looks for their text in training data) share, so both read a file the same way.

A reader turns a file into records of one of four shapes:
    multiple choice  {"id", "query", "choices": [str], "gold": int}
    schema           {"id", "contexts": [str], "continuation": str, "gold": int}  (WinoGrande, WSC)
    completion       {"id", "context", "continuation"}  (LAMBADA: the last word)
    generation       {"id", "question", "answer"}  (GSM8K: the answer ends with `#### <number>`)
Readers of released layouts: `mosaic` (llm-foundry ICL jsonl), `olmes` (OLMES requests.jsonl.gz; the
docs are kept, not the prompts), `mmlu` (a CSV file or a folder of `<subject>_test.csv`, with or
without the Hugging Face header) and `gsm8k`. Readers of any layout: `jsonl` and `csv`, through a
field mapping (`FileFormat.fields`) from the record's keys to the file's fields, and an optional
label file (one label per line, e.g. PIQA's `valid-labels.lst`) whose lines become each record's
`label` field. Mapped records keep the file's own fields too, so a prompt template may name either.
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.jsonl import json_objects

OLMES_UNCONDITIONAL = 1_000_000  # OLMES doc ids from here on are its unconditional-normalization requests
LETTERS = "ABCDEFGHIJ"
READERS = ("mosaic", "olmes", "mmlu", "gsm8k", "jsonl", "csv")
SHAPES: dict[str, tuple[str, ...]] = {
    "multiple_choice": ("query", "choices", "gold"),
    "schema": ("contexts", "continuation", "gold"),
    "completion": ("context", "continuation"),
    "generation": ("question", "answer"),
}
# Keys a field mapping may set: the shapes' keys, the record id, MMLU-style subject, and for a list of
# choices given by their labels (ARC's "A".."E" or "1".."4"), the labels the gold answer is one of.
MAPPED_KEYS = ("id", "subject", "choice_labels", *sorted({k for keys in SHAPES.values() for k in keys}))

Record = dict[str, Any]


class BenchmarkFileError(UserError):
    """A benchmark file that is missing, unreadable, or not in the layout its reader expects. The
    message names the file (and line or row); callers put what the user configured in front of it."""


@dataclass(frozen=True)
class FileFormat:
    """How to read one benchmark file: the reader, and for `jsonl` and `csv` the field mapping.

    fields: record key -> the file's field: a name, a dotted path into nested objects (a list on the
    way applies the rest of the path to each element: `question.choices.text`), or a list of those
    (one choice or context each). gold may be an index (`gold_base` is the first index's value), a
    letter A-J, one of `choice_labels`, or the text of a choice. `text` alone, for a completion, is
    split before its last word (LAMBADA's original layout). labels: a file of one label per line,
    each record's `label` field. columns: the CSV's column names when it has no header row."""

    reader: str
    fields: tuple[tuple[str, Any], ...] = ()
    labels: str = ""
    gold_base: int = 0
    columns: tuple[str, ...] = ()

    def field_map(self) -> dict[str, Any]:
        return dict(self.fields)


def _open_text(path: Path):
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8", newline="" if path.suffix == ".csv" else None)


def json_records(path: Path) -> Iterator[tuple[int, Record]]:
    fix = "Restore the original file, or name the reader that matches its layout."
    try:
        with _open_text(path) as handle:
            yield from json_objects(handle, path, "benchmark file", fix)
    except BenchmarkFileError:
        raise
    except UserError as exc:  # a line that is not a JSON object: said by json_objects, named here
        raise BenchmarkFileError(str(exc)) from None
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise BenchmarkFileError(f"benchmark file {path} cannot be read ({exc}).") from exc


def _need(record: Record, fields: tuple[str, ...], path: Path, number: int, reader: str) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise BenchmarkFileError(
            f"a record of {path} (line {number}) lacks {', '.join(missing)} (reader {reader!r} expects them; "
            f"its keys are {sorted(record)})."
        )


def _multiple_choice(record: Record, path: Path, number: int, id_: Any) -> Record:
    choices, gold = record["choices"], record["gold"]
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise BenchmarkFileError(f"{path} line {number}: gold {gold!r} is not an index into its choices.")
    return {"id": id_, "query": record["query"], "choices": [str(c) for c in choices], "gold": gold}


def read_mosaic(path: Path) -> list[Record]:
    """llm-foundry ICL jsonl: multiple choice, schema or (context, continuation) records."""
    out = []
    for number, record in json_records(path):
        if "context_options" in record:
            _need(record, ("continuation", "gold"), path, number, "mosaic")
            out.append(
                {
                    "id": number,
                    "contexts": list(record["context_options"]),
                    "continuation": record["continuation"],
                    "gold": int(record["gold"]),
                }
            )
        elif "query" in record:
            _need(record, ("choices", "gold"), path, number, "mosaic")
            out.append(_multiple_choice(record, path, number, number))
        else:
            _need(record, ("context", "continuation"), path, number, "mosaic")
            out.append({"id": number, "context": record["context"], "continuation": record["continuation"]})
    return out


def read_olmes(path: Path) -> list[Record]:
    """OLMES requests.jsonl.gz (the file, or the folder holding it): one record per doc below the
    unconditional ids, from the doc (its `query`, `choices`, `gold`; WinoGrande's original fields)."""
    if path.is_dir():
        path = path / "requests.jsonl.gz"
    docs: dict[int, Record] = {}
    for number, record in json_records(path):
        _need(record, ("doc", "doc_id"), path, number, "olmes")
        doc_id = int(record["doc_id"])
        if doc_id >= OLMES_UNCONDITIONAL or doc_id in docs:
            continue
        doc = record["doc"]
        if "sentence" in doc and "option1" in doc:  # WinoGrande's original fields
            _need(doc, ("option2", "answer"), path, number, "olmes")
            prefix, _, suffix = doc["sentence"].partition("_")
            docs[doc_id] = {
                "id": doc_id,
                "contexts": [prefix + doc["option1"], prefix + doc["option2"]],
                "continuation": suffix.strip(),
                "gold": int(doc["answer"]) - 1,
            }
        else:
            _need(doc, ("query", "choices", "gold"), path, number, "olmes")
            docs[doc_id] = _multiple_choice(doc, path, number, doc.get("id", doc.get("ind", doc_id)))
    return [docs[k] for k in sorted(docs)]


def _csv_rows(path: Path) -> list[list[str]]:
    try:
        with _open_text(path) as handle:
            return list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise BenchmarkFileError(f"benchmark file {path} cannot be read as CSV ({exc}).") from exc


def read_mmlu(path: Path) -> list[Record]:
    """MMLU CSVs (a file or a folder of them), either layout: `question,choice0..3,answer` with 0-3,
    or Hendrycks' header-less one with A-D. The subject comes from the file name."""
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files:
        raise BenchmarkFileError(f"{path} holds no .csv files; MMLU needs <subject>_test.csv files.")
    out = []
    for file in files:
        subject = file.stem.rsplit("_", 1)[0].replace("_", " ")
        for number, row in enumerate(_csv_rows(file), start=1):
            if number == 1 and row[:1] == ["question"]:
                continue  # the Hugging Face layout's header
            answer = row[5].strip() if len(row) == 6 else ""
            gold = int(answer) if answer.isdigit() else LETTERS[:4].find(answer.upper())
            if len(row) != 6 or not 0 <= gold < 4:
                raise BenchmarkFileError(
                    f"{file} row {number}: expected 6 columns (question, 4 choices, answer 0-3 or A-D), got "
                    f"{len(row)} with answer {answer!r}."
                )
            out.append(
                {
                    "id": f"{file.stem}:{number}",
                    "query": row[0].strip(),
                    "choices": [c.strip() for c in row[1:5]],
                    "gold": gold,
                    "subject": subject,
                }
            )
    return out


def read_gsm8k(path: Path) -> list[Record]:
    out = []
    for number, record in json_records(path):
        _need(record, ("question", "answer"), path, number, "gsm8k")
        if "####" not in record["answer"]:
            raise BenchmarkFileError(f"{path} line {number}: the answer has no `#### <number>` line.")
        out.append({"id": number, "question": record["question"], "answer": record["answer"]})
    return out


# ---------------------------------------------------------------------------------------------
# Any jsonl or CSV, through a field mapping


def lookup(record: Any, dotted: str) -> Any:
    """The value at a dotted path; a list met on the way maps the rest of the path over its elements.
    Raises KeyError naming the first missing step."""
    value = record
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if isinstance(value, list):
            rest = ".".join(parts[i:])
            return [lookup(element, rest) for element in value]
        if not isinstance(value, dict) or part not in value:
            raise KeyError(".".join(parts[: i + 1]))
        value = value[part]
    return value


def _resolve_gold(value: Any, record: Record, base: int) -> int | None:
    labels = record.get("choice_labels")
    if isinstance(labels, list) and value in labels:
        return labels.index(value)
    if isinstance(value, bool):
        return int(value) - base
    if isinstance(value, int) or (isinstance(value, str) and value.strip().lstrip("-").isdigit()):
        return int(value) - base
    if isinstance(value, str) and len(value.strip()) == 1 and value.strip().upper() in LETTERS:
        return LETTERS.index(value.strip().upper())
    choices = record.get("choices")
    if isinstance(choices, list) and value in choices:
        return choices.index(value)
    return None


def _map_record(raw: Record, fmt: FileFormat, where: str, number: int) -> Record:
    mapping = fmt.field_map()
    record: Record = {**raw, "id": raw.get("id", number)}
    for key, source in mapping.items():
        try:
            if isinstance(source, list):
                record[key] = [lookup(raw, s) for s in source]
            else:
                record[key] = lookup(raw, source)
        except KeyError as exc:
            raise BenchmarkFileError(
                f"{where}: field {exc.args[0]!r} (mapped to {key!r}) is not in the record; its fields are "
                f"{sorted(raw)}."
            ) from None
    if "text" in mapping and "context" not in mapping:
        context, _, word = str(record["text"]).rstrip().rpartition(" ")
        record["context"], record["continuation"] = context, word
    for key in ("choices", "contexts"):
        if key in record and not isinstance(record[key], list):
            raise BenchmarkFileError(f"{where}: {key} is {record[key]!r}, not a list.")
    if "choices" in record:
        record["choices"] = [str(c) for c in record["choices"]]
    if "gold" in record and ("choices" in record or "contexts" in record):
        options = record.get("choices", record.get("contexts"))
        gold = _resolve_gold(record["gold"], record, fmt.gold_base)
        if gold is None or not 0 <= gold < len(options):
            raise BenchmarkFileError(
                f"{where}: gold {record['gold']!r} is not an index, a letter, a choice label or a choice "
                f"of its {len(options)} options (gold_base = {fmt.gold_base})."
            )
        record["gold"] = gold
    return record


def _label_lines(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise BenchmarkFileError(f"label file {path} cannot be read ({exc}).") from exc


def _raw_rows(path: Path, fmt: FileFormat) -> list[tuple[int, Record]]:
    if fmt.reader == "jsonl":
        return list(json_records(path))
    rows = _csv_rows(path)
    columns = list(fmt.columns)
    if not columns:
        if not rows:
            return []
        columns, rows = [c.strip() for c in rows[0]], rows[1:]
        first = 2
    else:
        first = 1
    out = []
    for number, row in enumerate(rows, start=first):
        if len(row) != len(columns):
            raise BenchmarkFileError(
                f"{path} row {number} has {len(row)} columns, the header {len(columns)} ({', '.join(columns)})."
            )
        out.append((number, dict(zip(columns, row, strict=True))))
    return out


def read_mapped(path: Path, fmt: FileFormat, labels: Path | None = None) -> list[Record]:
    """Records of a jsonl or CSV file through `fmt.fields`; `labels`: a label file beside it."""
    unknown = sorted(set(fmt.field_map()) - set(MAPPED_KEYS) - {"text"})
    if unknown:
        raise BenchmarkFileError(
            f"fields {', '.join(unknown)} are not record keys; a mapping may set {', '.join(MAPPED_KEYS)} or text."
        )
    rows = _raw_rows(path, fmt)
    if labels is not None:
        values = _label_lines(labels)
        if len(values) != len(rows):
            raise BenchmarkFileError(
                f"label file {labels} has {len(values)} labels but {path} has {len(rows)} records; they pair "
                f"up line by line."
            )
        rows = [(n, {**r, "label": v}) for (n, r), v in zip(rows, values, strict=True)]
    return [
        _map_record(raw, fmt, f"{path} {'line' if fmt.reader == 'jsonl' else 'row'} {n}", n)
        for n, raw in rows
    ]


def read_records(path: Path, fmt: FileFormat, labels: Path | None = None) -> list[Record]:
    """The records of one benchmark file (or folder, for `olmes` and `mmlu`) in `fmt`."""
    if fmt.reader not in READERS:
        raise BenchmarkFileError(f"reader {fmt.reader!r} is not one of {', '.join(READERS)}.")
    if not path.exists():
        raise BenchmarkFileError(f"{path} does not exist.")
    if fmt.reader in ("jsonl", "csv"):
        return read_mapped(path, fmt, labels)
    if labels is not None or fmt.fields:
        raise BenchmarkFileError(
            f"reader {fmt.reader!r} reads its own layout: `fields` and `labels` go with reader jsonl or csv."
        )
    return {"mosaic": read_mosaic, "olmes": read_olmes, "mmlu": read_mmlu, "gsm8k": read_gsm8k}[fmt.reader](
        path
    )


def shape_of(record: Record) -> str | None:
    """The shape a record has (the first whose keys it holds), or None."""
    for shape, keys in SHAPES.items():
        if all(k in record for k in keys):
            return shape
    return None


def item_text(record: Record) -> str:
    """A record as a model could have read it on the web: the question (or context) and its correct
    answer, or for a record of no known shape its string fields joined."""
    shape = shape_of(record)
    if shape == "multiple_choice":
        return f"{record['query']} {record['choices'][int(record['gold'])]}"
    if shape == "schema":
        return f"{record['contexts'][int(record['gold'])]} {record['continuation']}"
    if shape == "completion":
        return f"{record['context']} {record['continuation']}"
    if shape == "generation":
        return f"{record['question']} {record['answer']}"
    return " ".join(v for v in record.values() if isinstance(v, str))
