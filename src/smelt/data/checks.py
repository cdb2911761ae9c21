"""User errors found while reading: a source that yields no usable document at all."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smelt.config import SourceConfig
from smelt.data.ledger import QUARANTINED, Ledger
from smelt.errors import UserError


def check_usable(
    source: SourceConfig,
    root: Path,
    n_files: int,
    ledger: Ledger,
    entries_of: Callable[[str], list[dict[str, Any]]],
) -> None:
    """Raise UserError when none of a source's files held a readable record with visible text.
    `entries_of(source)` returns the source's ledger entries (read only when the check fails)."""
    name = source.name
    if ledger.files(name, "ok"):
        return
    where = f"source {name!r}: all {n_files} files under {root} (include = {source.include!r})"
    entries = [e for e in entries_of(name) if e["kind"] == QUARANTINED]
    reasons = Counter(e["reason"] for e in entries)
    if not entries or ledger.files(name, "empty") == n_files:
        raise UserError(
            f"{where} are empty (zero bytes or only whitespace). Point include at files that hold text, "
            f"or remove the source."
        )
    example = entries[0]
    at = f"{example['file']}" + (f" line {example['line']}" if example.get("line") is not None else "")
    detail = f"e.g. {at}: {example.get('detail', example['reason'])}"
    if set(reasons) <= {"binary", "decode_error"}:
        raise UserError(
            f"{where} are binary or not UTF-8 ({detail}). Point include at text files "
            f'(e.g. include = ["**/*.txt"]) or convert the files to UTF-8.'
        )
    top = reasons.most_common(1)[0][0]
    if top == "missing_text_field":
        fields = ", ".join(example.get("fields", [])) or "none"
        raise UserError(
            f"source {name!r}: no record in the {n_files} files under {root} has a string field "
            f"{source.text_field!r} (fields of the first record: {fields}). Set text_field of the source to "
            f"the field that holds the text."
        )
    if top == "missing_id":
        raise UserError(
            f"source {name!r}: no record in the {n_files} files under {root} has the id field "
            f"{source.id_field!r} ({detail}). Set id_field to a field every record has, or leave it empty."
        )
    if top == "bad_json":
        raise UserError(
            f"{where} hold no JSON object per line ({detail}). Check that format = {source.format!r} fits "
            f'these files (format = "text" reads plain text files).'
        )
    summary = ", ".join(f"{reason}: {n}" for reason, n in sorted(reasons.items()))
    raise UserError(f"{where} gave no usable document ({summary}; {detail}). Fix the files or the source.")
