"""JSON Lines, read one way: `json_objects` for files that must be whole (one object per non-empty line,
or a UserError naming the file, the line and the fix), `json_object` for one line of a file that may
hold a line cut by a crash (metric_records.read_records reads whole such files)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from smelt.errors import UserError


def json_object(line: str | bytes) -> dict[str, Any] | None:
    """One line as a JSON object, or None when it is not one (a line cut by a crash, a JSON array)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def json_objects(
    lines: Iterable[str], path: Path, label: str, fix: str
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for each non-empty line; `label` prefixes the message (e.g. "task file")."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{label} {path} line {number} is not JSON ({exc.msg}). {fix}") from None
        if not isinstance(record, dict):
            raise UserError(f"{label} {path} line {number} is not a JSON object. {fix}")
        yield number, record
