"""The key-value tables the commands print, and nested dicts as the dotted keys those tables (and a
config diff) show."""

from __future__ import annotations

from typing import Any


def flat(value: Any, prefix: str = "", whole_lists: bool = False) -> dict[str, Any]:
    """Nested dicts as dotted keys. A list of records shows as "[N items]" in a summary table;
    `whole_lists` keeps every list whole (the unit of a config diff)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flat(v, f"{prefix}{k}.", whole_lists))
        return out
    if isinstance(value, list) and not whole_lists:
        return (
            {prefix.rstrip("."): f"[{len(value)} items]"}
            if value and isinstance(value[0], dict)
            else {prefix.rstrip("."): value}
        )
    return {prefix.rstrip("."): value}


def print_table(rows: list[tuple[str, Any]]) -> None:
    width = max((len(str(k)) for k, _ in rows), default=0)
    for key, value in rows:
        print(f"{str(key):<{width}}  {value}")
