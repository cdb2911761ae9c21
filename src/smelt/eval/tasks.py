"""Benchmark tasks as data: one TaskSpec per task names its file, reader, prompt template and metric.

A reader turns the original file into plain records with one of three shapes:
    multiple choice  {"id", "query", "choices": [str], "gold": int}
    schema           {"id", "contexts": [str], "continuation": str, "gold": int}  (WinoGrande, WSC)
    completion       {"id", "context", "continuation"}  (LAMBADA: the last word)
    generation       {"id", "question", "answer"}  (GSM8K: the answer's final number is the gold)
The formulation (see harness.py) turns records into scoring requests. Few-shot examples come from the
spec's `shots_from` pool (a dev split) or else from the same file, drawn with a fixed seed and then
left out of the scored items; `limit` keeps a seeded random subset in file order, so a subset of
MMLU's subject-sorted files still spans every subject.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smelt.errors import UserError
from smelt.eval.passkey import PASSKEY_VERSION, passkey_records
from smelt.jsonl import json_objects

OLMES_UNCONDITIONAL = 1_000_000
SUBSET_SEED = 1234  # fixed, not the run seed: subsets and shots must match across runs to compare them
LETTERS = "ABCDEFGHIJ"

Record = dict[str, Any]


@dataclass(frozen=True)
class TaskSpec:
    """What a task is: everything that decides its score, so its fingerprint keys cached results."""

    name: str
    path: str  # relative to the tasks directory
    reader: str  # a key of READERS
    formulation: str  # cloze | mc | schema | lastword | generate
    template: str = "{query}"  # fills the record's fields into the prompt (before the answer)
    metric: str = "acc"  # the primary metric reported on curves
    shots: int = 0
    shots_from: str = ""  # file or directory with few-shot examples (else: the task's own file)
    shot_separator: str = "\n\n"
    stop: tuple[str, ...] = ()  # generate: the completion ends at the first of these
    extract: str = ""  # generate: regex whose group 1 is the answer (else: the last number)
    max_new_tokens: int = 0
    note: str = ""

    def fingerprint(self) -> str:
        blob = json.dumps(self.__dict__, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# Readers of the original file formats


def _lines(path: Path) -> Iterator[tuple[int, Record]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            yield from json_objects(
                handle,
                path,
                "task file",
                "Restore the original file, or point eval.tasks_dir at an intact copy.",
            )
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise UserError(f"task file {path} cannot be read ({exc}).") from exc


def _need(record: Record, fields: tuple[str, ...], path: Path, number: int) -> None:
    missing = [f for f in fields if f not in record]
    if missing:
        raise UserError(
            f"task file {path} line {number} lacks {', '.join(missing)} (its keys: {sorted(record)}); the "
            f"file is not in the layout its task expects. Restore the original file."
        )


def _mc(record: Record, path: Path, number: int, id_: Any) -> Record:
    _need(record, ("query", "choices", "gold"), path, number)
    choices, gold = record["choices"], record["gold"]
    if not isinstance(choices, list) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise UserError(f"task file {path} line {number}: gold {gold!r} is not an index into its choices.")
    return {"id": id_, "query": record["query"], "choices": [str(c) for c in choices], "gold": gold}


def read_mosaic(path: Path) -> list[Record]:
    """llm-foundry ICL jsonl: multiple choice, schema or (context, continuation) records."""
    out = []
    for number, record in _lines(path):
        if "context_options" in record:
            _need(record, ("continuation", "gold"), path, number)
            out.append(
                {
                    "id": number,
                    "contexts": list(record["context_options"]),
                    "continuation": record["continuation"],
                    "gold": int(record["gold"]),
                }
            )
        elif "query" in record:
            out.append(_mc(record, path, number, number))
        else:
            _need(record, ("context", "continuation"), path, number)
            out.append({"id": number, "context": record["context"], "continuation": record["continuation"]})
    return out


def read_olmes(path: Path) -> list[Record]:
    """OLMES requests.jsonl.gz: one line per (doc, choice); the docs (not the prompts) are kept, so
    prompts and shots are built here the same way for every task."""
    docs: dict[int, Record] = {}
    for number, record in _lines(path):
        _need(record, ("doc", "doc_id"), path, number)
        doc_id = int(record["doc_id"])
        if doc_id >= OLMES_UNCONDITIONAL or doc_id in docs:
            continue
        doc = record["doc"]
        if "sentence" in doc and "option1" in doc:  # WinoGrande's original fields
            _need(doc, ("option2", "answer"), path, number)
            prefix, _, suffix = doc["sentence"].partition("_")
            docs[doc_id] = {
                "id": doc_id,
                "contexts": [prefix + doc["option1"], prefix + doc["option2"]],
                "continuation": suffix.strip(),
                "gold": int(doc["answer"]) - 1,
            }
        else:
            docs[doc_id] = _mc(doc, path, number, doc.get("id", doc.get("ind", doc_id)))
    return [docs[k] for k in sorted(docs)]


def _mmlu_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"task file {path} cannot be read as CSV ({exc}).") from exc
    for number, row in enumerate(rows, start=1):
        if number == 1 and row[:1] == ["question"]:
            continue  # the Hugging Face layout's header
        yield number, row


def read_mmlu(path: Path) -> list[Record]:
    """MMLU CSVs, either layout: `question,choice0..3,answer` with 0-3, or Hendrycks' with A-D."""
    files = sorted(path.glob("*.csv")) if path.is_dir() else [path]
    if not files:
        raise UserError(f"task directory {path} holds no .csv files; MMLU needs <subject>_test.csv files.")
    out = []
    for file in files:
        subject = file.stem.rsplit("_", 1)[0].replace("_", " ")
        for number, row in _mmlu_rows(file):
            answer = row[5].strip() if len(row) == 6 else ""
            gold = int(answer) if answer.isdigit() else LETTERS[:4].find(answer.upper())
            if len(row) != 6 or not 0 <= gold < 4:
                raise UserError(
                    f"task file {file} row {number}: expected 6 columns (question, 4 choices, answer 0-3 or "
                    f"A-D), got {len(row)} with answer {answer!r}."
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
    for number, record in _lines(path):
        _need(record, ("question", "answer"), path, number)
        if "####" not in record["answer"]:
            raise UserError(f"task file {path} line {number}: the answer has no `#### <number>` line.")
        out.append({"id": number, "question": record["question"], "answer": record["answer"]})
    return out


READERS: dict[str, Callable[[Path], list[Record]]] = {
    "mosaic": read_mosaic,
    "olmes": read_olmes,
    "mmlu": read_mmlu,
    "gsm8k": read_gsm8k,
}
# Tasks made from a fixed seed instead of read from a file (reader "synthetic"): name -> records(limit).
SYNTHETIC: dict[str, Callable[[int], list[Record]]] = {"passkey": passkey_records}

# ---------------------------------------------------------------------------------------------
# The registry

_GSM8K_STOP = ("\n\nQuestion:", "Question:", "\n\n\n")
SPECS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec("arc_easy", "arc_easy/mosaic_arc_easy_test.jsonl", "mosaic", "cloze", "{query}\nAnswer:"),
        TaskSpec("arc_easy_mc", "arc_easy/mosaic_arc_easy_test.jsonl", "mosaic", "mc", "{query}"),
        TaskSpec(
            "arc_easy_val",
            "arc_easy/olmes_arc_easy_val_rc_0shot/requests.jsonl.gz",
            "olmes",
            "cloze",
            note="OLMES 570-item validation subset",
        ),
        TaskSpec(
            "hellaswag",
            "hellaswag/olmes_hellaswag_val1000_rc_5shot/requests.jsonl.gz",
            "olmes",
            "cloze",
            metric="acc_per_char",
            note="OLMES 1,000-item validation subset",
        ),
        TaskSpec("boolq", "boolq/mosaic_boolq_validation.jsonl", "mosaic", "cloze", "{query}\nAnswer:"),
        TaskSpec("copa", "copa/mosaic_copa_validation.jsonl", "mosaic", "cloze"),
        TaskSpec(
            "openbookqa",
            "openbookqa/mosaic_openbookqa_test.jsonl",
            "mosaic",
            "cloze",
            "Question: {query}\nAnswer:",
            metric="acc_per_char",
        ),
        TaskSpec(
            "sciq",
            "sciq/olmes_sciq_val_rc_0shot/requests.jsonl.gz",
            "olmes",
            "cloze",
            "Question: {query}\nAnswer:",
        ),
        TaskSpec("siqa", "siqa/mosaic_siqa_validation.jsonl", "mosaic", "mc", note="letters in the file"),
        TaskSpec(
            "commonsense_qa",
            "commonsense_qa/mosaic_commonsense_qa_validation.jsonl",
            "mosaic",
            "mc",
            note="letters in the file",
        ),
        TaskSpec("winogrande", "winogrande/mosaic_winogrande_dev.jsonl", "mosaic", "schema"),
        TaskSpec("winograd_wsc", "winograd_wsc/mosaic_winograd_wsc.jsonl", "mosaic", "schema"),
        TaskSpec("lambada", "lambada/mosaic_lambada_openai_test.jsonl", "mosaic", "lastword"),
        TaskSpec(
            "mmlu",
            "mmlu/test",
            "mmlu",
            "mc",
            "The following is a question about {subject}.\n\n{query}",
            shots=5,
            shots_from="mmlu/dev",
        ),
        TaskSpec(
            "mmlu_cloze",
            "mmlu/test",
            "mmlu",
            "cloze",
            "Question: {query}\nAnswer:",
            metric="acc_per_char",
            shots=5,
            shots_from="mmlu/dev",
        ),
        TaskSpec(
            "gsm8k",
            "gsm8k/test.jsonl",
            "gsm8k",
            "generate",
            "Question: {question}\nAnswer:",
            metric="exact_match",
            shots=8,
            stop=_GSM8K_STOP,
            extract=r"#### *(-?[0-9.,]+)",
            max_new_tokens=256,
        ),
        TaskSpec(
            "passkey",
            "synthetic/passkey",
            "synthetic",
            "passkey",
            note=f"generated, no file: pass key retrieval at 1/8 to all of the context ({PASSKEY_VERSION})",
        ),
    )
}


def find_tasks_dir() -> Path | None:
    """The benchmark files found without configuration, or None."""
    try:
        return resolve_tasks_dir()
    except UserError:
        return None


def resolve_tasks_dir(configured: str = "") -> Path:
    """eval.tasks_dir when set; else $SMELT_SHARED_DATA/eval, ../shared/data/eval from the working
    directory, or ../shared/data/eval next to the source checkout."""
    if configured:
        path = Path(configured).expanduser()
        if not path.is_dir():
            raise UserError(
                f"eval.tasks_dir = {configured!r} is not a directory (resolved from {Path.cwd()}). Point it "
                f"at the benchmark files (e.g. ../shared/data/eval)."
            )
        return path
    candidates = []
    if os.environ.get("SMELT_SHARED_DATA"):
        candidates.append(Path(os.environ["SMELT_SHARED_DATA"]) / "eval")
    candidates.append(Path.cwd().parent / "shared" / "data" / "eval")
    candidates.append(Path(__file__).resolve().parents[3].parent / "shared" / "data" / "eval")
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise UserError(
        "no benchmark files found (looked in " + ", ".join(str(c) for c in candidates) + "). Set "
        "eval.tasks_dir (or --tasks-dir) to the directory holding arc_easy/, hellaswag/, ..., or set "
        "eval.tasks = [] to score held-out loss only."
    )


def get_spec(name: str) -> TaskSpec:
    if name not in SPECS:
        raise UserError(f"unknown task {name!r} in eval.tasks / --tasks; known tasks: {', '.join(SPECS)}.")
    return SPECS[name]


def available_tasks(tasks_dir: Path) -> list[str]:
    """The registered tasks whose file exists under tasks_dir."""
    return [n for n, spec in SPECS.items() if spec.reader == "synthetic" or (tasks_dir / spec.path).exists()]


@dataclass
class Task:
    """A loaded task: the records to score and the few-shot examples for their prompts."""

    spec: TaskSpec
    records: list[Record]
    shots: list[Record] = field(default_factory=list)  # the fixed examples, or a per-subject pool
    n_shots: int = 0
    total: int = 0  # records in the file before shots and `limit` were taken out
    file: Path = Path()

    def shots_for(self, record: Record) -> list[Record]:
        """The examples shown before `record`: the same for every record, except that a pool of
        subject-tagged examples (MMLU's dev split) gives each question its own subject's."""
        if not self.n_shots:
            return []
        if "subject" in record and self.shots and "subject" in self.shots[0]:
            return [s for s in self.shots if s["subject"] == record["subject"]][: self.n_shots]
        return self.shots[: self.n_shots]


def load_task(spec: TaskSpec, tasks_dir: Path, limit: int = 0, shots: int = -1) -> Task:
    """Read a task's file, draw its few-shot examples and its scored subset (both seeded, fixed).

    shots = -1 keeps the spec's count. Raises UserError when the file is missing or malformed. A
    synthetic task is generated (tasks_dir unused), `limit` items or its default count, never shots."""
    if spec.reader == "synthetic":
        records = SYNTHETIC[spec.name](limit)
        return Task(spec, records, total=len(records))
    path = tasks_dir / spec.path
    if not path.exists():
        raise UserError(
            f"task {spec.name!r}: {path} does not exist. Point eval.tasks_dir at the benchmark files, or drop "
            f"the task from eval.tasks (tasks found there: {', '.join(available_tasks(tasks_dir)) or 'none'})."
        )
    records = READERS[spec.reader](path)
    if not records:
        raise UserError(f"task {spec.name!r}: {path} holds no records.")
    total = len(records)
    n_shots = spec.shots if shots < 0 else shots
    rng = random.Random(f"{SUBSET_SEED}:{spec.name}")
    examples: list[Record] = []
    if n_shots and spec.shots_from:
        source = tasks_dir / spec.shots_from
        if not source.exists():
            raise UserError(f"task {spec.name!r}: few-shot file {source} does not exist; set eval.shots = 0.")
        examples = READERS[spec.reader](source)
        if "subject" not in examples[0]:
            examples = rng.sample(examples, min(n_shots, len(examples)))
    elif n_shots:  # shots come from the file itself and are then not scored
        order = rng.sample(range(len(records)), min(n_shots, len(records) - 1))
        examples = [records[i] for i in order]
        taken = set(order)
        records = [r for i, r in enumerate(records) if i not in taken]
    if limit and limit < len(records):
        keep = sorted(rng.sample(range(len(records)), limit))
        records = [records[i] for i in keep]
    return Task(spec, records, examples, n_shots, total, path)
