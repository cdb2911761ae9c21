"""Evaluation sets in their original release files, for decontamination.

Each item is the text of a benchmark record as a model could have seen it on the web: the question (or
context) followed by its correct answer (`smelt.benchmark_files.item_text`). The files are read by the
same readers evaluation scores them with (`smelt.benchmark_files`), so both agree on what an item is.
Formats (`data.decontam.evals[i].format`):

* `mosaic`: llm-foundry ICL jsonl: `{query, choices, gold}`, `{context_options, continuation, gold}`
  (WinoGrande, WSC) or `{context, continuation}` (LAMBADA);
* `olmes`: OLMES `requests.jsonl.gz` (a file or the directory holding it): one item per `doc_id` below
  1,000,000, from its `doc`;
* `gsm8k`: `{question, answer}` jsonl;
* `mmlu_csv`: a csv file or a directory tree of them, header `question,choice0..3,answer` (answer 0-3),
  or the original header-less Hendrycks layout (answer letter A-D);
* `jsonl`: any jsonl; the item is the configured `fields` joined with spaces.
"""

from __future__ import annotations

from pathlib import Path

from smelt.benchmark_files import (
    BenchmarkFileError,
    FileFormat,
    item_text,
    json_records,
    lookup,
    read_mmlu,
    read_records,
)
from smelt.config import EvalSetConfig
from smelt.errors import UserError

FORMATS = ("mosaic", "olmes", "gsm8k", "mmlu_csv", "jsonl")


def _file_of(path: Path, key: str, spec: EvalSetConfig) -> Path:
    """The one jsonl file a directory holds (OLMES keeps requests.jsonl.gz in a folder of its own)."""
    if not path.is_dir():
        return path
    found = sorted(path.glob("requests.jsonl.gz")) or sorted(path.glob("*.jsonl*"))
    if len(found) != 1:
        raise UserError(
            f"{key}.path = {spec.path!r} is a directory with {len(found)} jsonl files; name one file."
        )
    return found[0]


def _items(spec: EvalSetConfig, path: Path, key: str) -> list[str]:
    if spec.format == "mmlu_csv":
        files = sorted(path.rglob("*.csv")) if path.is_dir() else [path]
        if not files:
            raise UserError(f"{key}.path = {spec.path!r} holds no .csv files (format mmlu_csv).")
        return [item_text(record) for f in files for record in read_mmlu(f)]
    path = _file_of(path, key, spec)
    if spec.format == "jsonl":
        if not spec.fields:
            raise UserError(f"{key}.fields is empty: format jsonl needs the record fields that make an item.")
        return [" ".join(str(v) for v in values) for values in _field_values(path, spec.fields)]
    return [item_text(record) for record in read_records(path, FileFormat(spec.format))]


def _field_values(path: Path, fields: list[str]) -> list[list[object]]:
    """Per record of any jsonl, the values of the configured fields (dotted paths allowed)."""
    out = []
    for number, raw in json_records(path):
        try:
            out.append([lookup(raw, f) for f in fields])
        except KeyError as exc:
            raise BenchmarkFileError(
                f"a record of {path} (line {number}) lacks {exc.args[0]} (format 'jsonl' with fields "
                f"{', '.join(fields)}; its keys are {sorted(raw)})."
            ) from None
    return out


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
    try:
        return _items(spec, path, key)
    except BenchmarkFileError as exc:
        raise UserError(
            f'{key}: {exc} Set `format` to the file\'s layout, or use format = "jsonl" with `fields`.'
        ) from exc
