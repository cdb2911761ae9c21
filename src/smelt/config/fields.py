"""The field helper every config section is declared with."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option(
    default: Any, *, range: tuple[float, float] | None = None, choices: tuple | None = None, help: str = ""
) -> Any:
    """A dataclass field whose metadata carries the allowed range or choices and the help line that
    validation errors and `describe` show."""
    meta = {"range": range, "choices": choices, "help": help}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)
