"""The drop list of a run (`RUN/drops.jsonl`) and what tokenize dropped by it (`tokens/dropped.jsonl`).

A spike that replays bit for bit comes from its data (`smelt train triage`); `smelt data drop RUN --spike
STEP` adds the documents it named to the run's drop list, one JSON line each:
`{"source", "id", "split", "reason", "spike_step", "run"}`. The next `smelt tokenize` (or `smelt run`)
leaves them out of the token shards: the list's hash is one of the tokenize stage's inputs, so adding to
it makes the shards stale, and the documents and the tokenizer stay as they are (a retrained tokenizer
would make every checkpoint of the run useless for a fork). Each document left out is recorded, like a
record that curation quarantines, in `tokens/dropped.jsonl` with its split, source, id, its row in the
source's documents (so a step still maps to its documents) and the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from smelt.errors import UserError
from smelt.jsonl import json_objects

DROP_LIST = "drops.jsonl"
DROPPED = "dropped.jsonl"


def drop_list_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / DROP_LIST


def read_drop_list(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a drop list (none when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:  # not smelt.jsonl: one message for a line that is not JSON and one that lacks a field
            entry = json.loads(line)
            str(entry["source"]), str(entry["id"])
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(
                f"{path}, line {number}: not a drop list entry ({exc}); each line is a JSON object with at "
                f'least "source" and "id". Fix or remove that line (`smelt data drop` writes them).'
            ) from exc
        entries.append(entry)
    return entries


def drop_list_hash(path: str | Path) -> str | None:
    """The sha256 of the drop list's (source, id) pairs, or None when it lists none: a tokenize input."""
    pairs = sorted({(str(e["source"]), str(e["id"])) for e in read_drop_list(path)})
    if not pairs:
        return None
    return hashlib.sha256(json.dumps(pairs).encode()).hexdigest()


def drop_inputs(run_dir: str | Path) -> dict[str, str]:
    """The tokenize stage's input from the run's drop list: {"drops": its hash}, or {} when it lists none
    (a run without one keeps the cache key it always had)."""
    digest = drop_list_hash(drop_list_path(run_dir))
    return {"drops": digest} if digest is not None else {}


def add_to_drop_list(path: str | Path, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Append the entries whose (source, id) the list does not hold yet; returns those appended."""
    path = Path(path)
    listed = {(str(e["source"]), str(e["id"])) for e in read_drop_list(path)}
    new = []
    for entry in entries:
        key = (str(entry["source"]), str(entry["id"]))
        if key not in listed:
            listed.add(key)
            new.append(entry)
    if new:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            for entry in new:
                handle.write(json.dumps(entry, sort_keys=True, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
    return new


class DocFilter:
    """Leaves the listed documents of one split and source out of tokenize's text batches, counting
    every row it sees (its position in the source's documents) and recording what it dropped."""

    def __init__(self, split: str, source: str, entries: list[dict[str, Any]]) -> None:
        self.split, self.source = split, source
        self.reasons = {str(e["id"]): e for e in entries if str(e["source"]) == source}
        self.row = 0
        self.dropped: list[dict[str, Any]] = []

    def __bool__(self) -> bool:
        return bool(self.reasons)

    def key(self) -> str:
        """What the source's shards depend on: the ids left out (a shard's resume key)."""
        return hashlib.sha256(json.dumps(sorted(self.reasons)).encode()).hexdigest()[:16]

    def skip_rows(self, count: int) -> None:
        self.row += count

    def keep(self, ids: list[Any]) -> np.ndarray:
        """A mask over a batch of document ids: False for the listed ones (recorded as dropped)."""
        mask = np.ones(len(ids), dtype=bool)
        for i, doc_id in enumerate(ids):
            entry = self.reasons.get(str(doc_id))
            if entry is not None:
                mask[i] = False
                self.dropped.append({
                    "split": self.split, "source": self.source, "id": str(doc_id), "row": self.row + i,
                    "reason": entry.get("reason", "drop list"), "spike_step": entry.get("spike_step"),
                })  # fmt: skip
        self.row += len(ids)
        return mask


def write_dropped(tokens_dir: Path, dropped: list[dict[str, Any]]) -> None:
    """`tokens/dropped.jsonl`: every document the drop list left out (an empty file when none)."""
    path = Path(tokens_dir) / DROPPED
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(d, sort_keys=True) + "\n" for d in dropped), encoding="utf-8")
    os.replace(tmp, path)


def dropped_rows(tokens_dir: Path, split: str, source: str) -> list[int]:
    """The rows of a source's documents that tokenize left out, ascending."""
    path = Path(tokens_dir) / DROPPED
    if not path.is_file():
        return []
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for _, entry in json_objects(
        lines, path, "tokenize's dropped-rows file", "Run `smelt tokenize --force`."
    ):
        if entry.get("split") == split and entry.get("source") == source:
            rows.append(int(entry["row"]))
    return sorted(rows)


def document_row(ordinal: int, dropped: list[int]) -> int:
    """The row in a source's documents of its `ordinal`-th tokenized document, given the dropped rows."""
    row = ordinal
    for gone in dropped:
        if gone <= row:
            row += 1
        else:
            break
    return row
