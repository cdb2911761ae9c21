"""Benchmark tasks as data files: one TOML file per task names its files, reader, field mapping,
formulation, prompt template, few-shot examples and metric (see docs/evaluation.md).

The built-in tasks are such files, shipped in `smelt/eval/task_files/`; a `*.toml` in the tasks
directory (eval.tasks_dir) adds a task or replaces a built-in one of the same name, and `--tasks`
takes a path to a task file too. A task's relative paths resolve against the tasks directory, or for
a task file named by its path, against the folder holding it. The readers (`smelt.benchmark_files`)
turn the files into records of one shape, and the formulation (see harness.py) turns records into
scoring requests. Few-shot examples come from `shots_from` (a dev split) or else from the same file,
drawn with a fixed seed and then left out of the scored items; `limit` keeps a seeded random subset in
file order, so a subset of MMLU's subject-sorted files still spans every subject.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from smelt.benchmark_files import LETTERS, SHAPES, BenchmarkFileError, FileFormat, Record, read_records
from smelt.errors import UserError
from smelt.eval.passkey import PASSKEY_VERSION, passkey_records

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["LETTERS", "Record", "Task", "TaskSpec", "get_spec", "load_task", "resolve_tasks_dir"]

SUBSET_SEED = 1234  # fixed, not the run seed: subsets and shots must match across runs to compare them
BUILTIN_DIR = Path(__file__).parent / "task_files"
# formulation -> (record shape it scores, metrics it reports)
FORMULATIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "cloze": ("multiple_choice", ("acc", "acc_per_char", "acc_per_token")),
    "mc": ("multiple_choice", ("acc",)),
    "schema": ("schema", ("acc",)),
    "lastword": ("completion", ("acc", "perplexity")),
    "generate": ("generation", ("exact_match",)),
    "passkey": ("", ("acc", "exact_match")),
}
# Tasks made from a fixed seed instead of read from a file (reader "synthetic"): generator -> records(limit).
SYNTHETIC: dict[str, tuple[Callable[[int], list[Record]], str]] = {
    "passkey": (passkey_records, PASSKEY_VERSION)
}


@dataclass(frozen=True)
class TaskSpec:
    """What a task is: its files and how they are read, prompted and scored."""

    name: str
    path: str  # file or folder, relative to the tasks directory (or to `base`)
    reader: str  # a reader of smelt.benchmark_files, or "synthetic"
    formulation: str  # cloze | mc | schema | lastword | generate | passkey
    template: str = "{query}"  # fills the record's fields into the prompt (before the answer)
    metric: str = "acc"  # the primary metric reported on curves
    shots: int = 0
    shots_from: str = ""  # file or directory with few-shot examples (else: the task's own file)
    shot_separator: str = "\n\n"
    stop: tuple[str, ...] = ()  # generate: the completion ends at the first of these
    extract: str = ""  # generate: regex whose group 1 is the answer (else: the last number)
    max_new_tokens: int = 0
    note: str = ""
    fields: tuple[tuple[str, Any], ...] = ()  # reader jsonl / csv: record key -> the file's field(s)
    labels: str = ""  # a label file paired line by line with `path`'s records (their `label` field)
    shots_labels: str = ""  # the same for `shots_from`
    gold_base: int = 0  # the value of the first choice's index in the file (1 for 1-based answers)
    columns: tuple[str, ...] = ()  # reader csv: column names of a file without a header row
    generator: str = ""  # reader synthetic: a key of SYNTHETIC
    source: str = ""  # the task file it was read from; "" for a spec made in code
    base: str = ""  # the folder its relative paths resolve against; "" for the tasks directory

    def fingerprint(self) -> str:
        blob = json.dumps(self.__dict__, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def file_format(self) -> FileFormat:
        return FileFormat(self.reader, self.fields, self.labels, self.gold_base, self.columns)

    def root(self, tasks_dir: Path | None) -> Path | None:
        return Path(self.base) if self.base else tasks_dir

    def needs_files(self) -> bool:
        return self.reader != "synthetic"


# ---------------------------------------------------------------------------------------------
# Task files

_KEYS = {f.name for f in fields(TaskSpec)} - {"source", "base"}
_TEXT_KEYS = ("name", "path", "reader", "formulation", "template", "metric", "shots_from", "shot_separator")
_TEXT_KEYS += ("extract", "note", "labels", "shots_labels", "generator")


def _check_type(value: Any, kind: type | tuple[type, ...], key: str, where: Path) -> None:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UserError(
            f"task file {where}: `{key}` = {value!r} should be {getattr(kind, '__name__', kind)}."
        )


def read_task_file(path: Path, base: Path | None = None) -> TaskSpec:
    """A TaskSpec from one task file; `base`: the folder its paths resolve against (None: the tasks
    directory). Raises UserError naming the file and key for an unknown key or a bad value."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"task file {path} cannot be read ({exc}).") from exc
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"task file {path} is not valid TOML ({exc}).") from exc
    for key in raw:
        if key not in _KEYS:
            close = difflib.get_close_matches(key, sorted(_KEYS), n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; keys: {', '.join(sorted(_KEYS))}"
            raise UserError(f"task file {path}: unknown key {key!r}{hint}.")
    values: dict[str, Any] = {"name": path.stem, **raw}
    for key in _TEXT_KEYS:
        if key in values:
            _check_type(values[key], str, key, path)
    for key in ("shots", "max_new_tokens", "gold_base"):
        if key in values:
            _check_type(values[key], int, key, path)
    for key in ("stop", "columns"):
        if key in values:
            _check_type(values[key], list, key, path)
            values[key] = tuple(str(v) for v in values[key])
    if "fields" in values:
        _check_type(values["fields"], dict, "fields", path)
        values["fields"] = tuple(sorted(values["fields"].items()))
    for key in ("reader", "formulation"):
        if key not in values:
            raise UserError(
                f"task file {path} lacks `{key}`; see docs/evaluation.md for the keys of a task file."
            )
    if values["reader"] == "synthetic":
        values.setdefault("path", "")
        if values.get("generator") not in SYNTHETIC:
            raise UserError(
                f"task file {path}: reader synthetic needs `generator` = one of {', '.join(SYNTHETIC)}."
            )
    elif "path" not in values:
        raise UserError(
            f"task file {path} lacks `path`: the benchmark file, relative to the tasks directory."
        )
    spec = TaskSpec(**values, source=str(path), base=str(base) if base is not None else "")
    check_spec(spec, str(path))
    return spec


def check_spec(spec: TaskSpec, where: str) -> None:
    """Formulation, metric and reader of a spec fit together, or a UserError naming `where`."""
    if spec.formulation not in FORMULATIONS:
        raise UserError(
            f"task file {where}: formulation {spec.formulation!r} is not one of {', '.join(FORMULATIONS)}."
        )
    metrics = FORMULATIONS[spec.formulation][1]
    if spec.metric not in metrics:
        raise UserError(
            f"task file {where}: metric {spec.metric!r} is not reported by formulation {spec.formulation!r} "
            f"(it reports {', '.join(metrics)})."
        )
    if (spec.reader == "synthetic") != (spec.formulation == "passkey"):
        raise UserError(f"task file {where}: formulation passkey goes with reader synthetic, and only it.")


@functools.cache
def _builtin(directory: str) -> dict[str, TaskSpec]:
    specs = [read_task_file(p) for p in sorted(Path(directory).glob("*.toml"))]
    return {s.name: s for s in specs}


def builtin_specs() -> dict[str, TaskSpec]:
    """The tasks shipped with smelt (smelt/eval/task_files/*.toml), by name."""
    return dict(_builtin(str(BUILTIN_DIR)))


def scan_tasks_dir(tasks_dir: Path | None) -> tuple[dict[str, TaskSpec], dict[str, UserError]]:
    """The task files at the top of the tasks directory: the specs of those that read, by name, and
    the error of each that does not, by file name without `.toml`. A bad file stops only the task it
    defines, not every other task of the directory."""
    specs: dict[str, TaskSpec] = {}
    bad: dict[str, UserError] = {}
    if tasks_dir is not None and tasks_dir.is_dir():
        for path in sorted(tasks_dir.glob("*.toml")):
            try:
                spec = read_task_file(path)
            except UserError as exc:
                bad[path.stem] = exc
                continue
            specs[spec.name] = spec
    return specs, bad


def find_specs(tasks_dir: Path | None) -> dict[str, TaskSpec]:
    """The built-in tasks, then the task files at the top of the tasks directory (which replace a
    built-in task of the same name); task files that cannot be read are left out (get_spec names them)."""
    return {**builtin_specs(), **scan_tasks_dir(tasks_dir)[0]}


def get_spec(name: str, tasks_dir: Path | None = None) -> TaskSpec:
    """A task by name (built-in, or a task file in tasks_dir), or by the path of its task file. A task
    whose task file in tasks_dir cannot be read raises that file's error, even over a built-in task of
    the same name."""
    if name.endswith(".toml"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise UserError(f"task file {name!r} in eval.tasks / --tasks does not exist (from {Path.cwd()}).")
        return read_task_file(path, base=path.resolve().parent)
    found, bad = scan_tasks_dir(tasks_dir)
    if name in bad and name not in found:
        raise bad[name]
    specs = {**builtin_specs(), **found}
    if name not in specs:
        unread = f" (task files that could not be read: {', '.join(f'{n}.toml' for n in bad)})" if bad else ""
        raise UserError(
            f"unknown task {name!r} in eval.tasks / --tasks; known tasks: {', '.join(specs)}{unread}. A new task "
            f"is a task file (docs/evaluation.md): put NAME.toml in the tasks directory, or pass its path."
        )
    return specs[name]


def find_tasks_dir() -> Path | None:
    """The benchmark files found without configuration, or None."""
    try:
        return resolve_tasks_dir()
    except UserError:
        return None


def configured_tasks_dir(configured: str) -> Path | None:
    """eval.tasks_dir when it is a directory, else the one found by default; None when there is none
    (a task that reads files then stops with resolve_tasks_dir's message, a synthetic one runs)."""
    if configured:
        path = Path(configured).expanduser()
        return path if path.is_dir() else None
    return find_tasks_dir()


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


def available_tasks(tasks_dir: Path) -> list[str]:
    """The known tasks whose file exists under tasks_dir."""
    return [
        n
        for n, spec in find_specs(tasks_dir).items()
        if not spec.needs_files() or (spec.root(tasks_dir) / spec.path).exists()
    ]


def _data_paths(spec: TaskSpec, tasks_dir: Path | None) -> list[Path]:
    root = spec.root(tasks_dir) or Path()
    named = (spec.path, spec.labels, spec.shots_from, spec.shots_labels)
    return [root / p for p in named if p] if spec.needs_files() else []


def task_fingerprint(spec: TaskSpec, tasks_dir: Path | None) -> dict[str, Any]:
    """What decides a task's records and prompts: the task file's bytes (or the spec's fields when it
    was made in code), and the content hash of each file it reads (or its generator's version)."""
    from smelt.manifest import hash_file, hash_files

    definition = spec.fingerprint()
    if spec.source and Path(spec.source).is_file():
        definition = hash_file(spec.source)[:16]
    data: dict[str, str] = {}
    for path in _data_paths(spec, tasks_dir):
        if path.is_dir():
            data[path.name] = hash_files([p for p in path.rglob("*") if p.is_file()], path)[:16]
        elif path.is_file():
            data[path.name] = hash_file(path)[:16]
    if not spec.needs_files():
        data[spec.generator] = SYNTHETIC[spec.generator][1]
    return {"definition": definition, "data": data}


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


def _read(spec: TaskSpec, path: Path, labels: Path | None) -> list[Record]:
    """Records of one of the task's files, each checked to have the shape its formulation scores."""
    where = f"task {spec.name!r}" + (f" ({spec.source})" if spec.source else "")
    try:
        records = read_records(path, spec.file_format(), labels)
    except BenchmarkFileError as exc:
        raise UserError(
            f"{where}: {exc} Restore the original file, or fix the task file's reader and fields."
        ) from exc
    shape = FORMULATIONS[spec.formulation][0]
    for number, record in enumerate(records, start=1):
        missing = [k for k in SHAPES[shape] if k not in record]
        if missing:
            raise UserError(
                f"{where}: record {number} of {path} has no {', '.join(missing)}, which formulation "
                f"{spec.formulation!r} scores ({shape}: {', '.join(SHAPES[shape])}). Map them in the task "
                f"file's [fields] table (its fields: {sorted(record)})."
            )
    return records


def _label_file(spec: TaskSpec, root: Path, key: str, value: str, data: Path) -> Path | None:
    """The label file `key` names, relative to the same folder as `path` (the tasks directory, or the
    task file's folder for a task named by its path); a UserError naming the key when it is not there,
    with the value to write when a file of that name sits beside the data file instead."""
    if not value:
        return None
    labels = root / value
    if labels.exists():
        return labels
    where = "the task file's folder" if spec.base else "the tasks directory"
    beside = (data if data.is_dir() else data.parent) / value
    hint = ""
    if beside.is_file():
        try:
            fixed = beside.relative_to(root).as_posix()
        except ValueError:
            fixed = str(beside)
        hint = f" A file of that name is beside the questions ({beside}): write {key} = {fixed!r}."
    raise UserError(
        f"task {spec.name!r}" + (f" ({spec.source})" if spec.source else "") + f": label file {labels} "
        f"({key} = {value!r}) does not exist. `{key}` is relative to {where} ({root}), like `path`.{hint}"
    )


def load_task(spec: TaskSpec, tasks_dir: Path | None, limit: int = 0, shots: int = -1) -> Task:
    """Read a task's file, draw its few-shot examples and its scored subset (both seeded, fixed).

    shots = -1 keeps the spec's count. Raises UserError when the file is missing or malformed. A
    synthetic task is generated (tasks_dir unused), `limit` items or its default count, never shots."""
    if not spec.needs_files():
        records = SYNTHETIC[spec.generator][0](limit)
        return Task(spec, records, total=len(records))
    root = spec.root(tasks_dir)
    if root is None:
        raise UserError(
            f"task {spec.name!r} reads {spec.path}, but no tasks directory is set: set eval.tasks_dir."
        )
    path = root / spec.path
    if not path.exists():
        raise UserError(
            f"task {spec.name!r}: {path} does not exist. Point eval.tasks_dir at the benchmark files, or drop "
            f"the task from eval.tasks (tasks found there: {', '.join(available_tasks(root)) or 'none'})."
        )
    records = _read(spec, path, _label_file(spec, root, "labels", spec.labels, path))
    if not records:
        raise UserError(f"task {spec.name!r}: {path} holds no records.")
    total = len(records)
    n_shots = spec.shots if shots < 0 else shots
    rng = random.Random(f"{SUBSET_SEED}:{spec.name}")
    examples: list[Record] = []
    if n_shots and spec.shots_from:
        source = root / spec.shots_from
        if not source.exists():
            raise UserError(f"task {spec.name!r}: few-shot file {source} does not exist; set eval.shots = 0.")
        examples = _read(spec, source, _label_file(spec, root, "shots_labels", spec.shots_labels, source))
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
