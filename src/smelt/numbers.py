"""Numbers as people type them on a command line: 5e5, 500_000, 2T, 1.5B, and N,D pairs (7e9,1.4e11).
Used by the command modules' argument types and by the planning code that reads targets."""

from __future__ import annotations

import argparse
import re

_SUFFIX = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def number(text: str) -> float:
    """A float that may use _ separators or a k/M/B/T suffix: 5e5, 500_000, 2T, 1.5B."""
    cleaned = text.strip().replace("_", "").replace(",", "")
    match = re.fullmatch(r"([-+0-9.eE]+)([kKMBGTP]?)", cleaned)
    try:
        if not match:
            raise ValueError(text)
        return float(match.group(1)) * _SUFFIX.get(match.group(2), 1.0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (e.g. 5e5, 500_000, 2T)") from None


def number_list(text: str) -> list[float]:
    return [number(x) for x in text.split(",") if x.strip()]


def number_pair(text: str) -> tuple[float, float]:
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} must be N,D, e.g. 7e9,1.4e11")
    return number(parts[0]), number(parts[1])
