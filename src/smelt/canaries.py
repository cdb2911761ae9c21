"""Canary strings: the record `RUN/documents/canaries.json` that curation writes (data.canaries = N) and
the contamination meter reads (eval/contamination.py).

A canary is a string of random letter-words that no text on the web contains. Curation plants canary i
in the first source's train split `2 ** (i % LEVELS)` times (1, 2, 4, ... 32 copies), so the meter can
draw memorisation against exposure: the loss of a canary seen k times against the loss of control
strings from the same generator that were never planted. The strings come from a fixed seed, so the
same N gives the same canaries in every run, and the controls are drawn from a stream of their own.
This module owns the file; stages read and write it only through these functions.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

CANARIES_FILE = "canaries.json"
VERSION = 1
SEED = 1729
LEVELS = 6  # exposures 1, 2, 4, 8, 16, 32
WORDS = 16
MIN_CONTROLS = 16  # enough unseen strings for a stable baseline and its spread


def copies_of(index: int) -> int:
    """How many times canary `index` is planted."""
    return 2 ** (index % LEVELS)


def random_text(rng: random.Random) -> str:
    """WORDS random lowercase words of 3 to 8 letters, as a sentence."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(3, 8))) for _ in range(WORDS)]
    return " ".join(words).capitalize() + "."


def make_record(n: int, source: str) -> dict[str, Any]:
    """N canaries (text and copies) and max(N, MIN_CONTROLS) never-planted controls, for `source`."""
    planted = random.Random(f"{SEED}:canary")
    unseen = random.Random(f"{SEED}:control")
    canaries = [
        {"id": f"canary-{i:04d}", "text": random_text(planted), "copies": copies_of(i)} for i in range(n)
    ]
    controls = [random_text(unseen) for _ in range(max(n, MIN_CONTROLS))]
    return {"version": VERSION, "seed": SEED, "source": source, "canaries": canaries, "controls": controls}


def write_record(documents_dir: Path, record: dict[str, Any] | None) -> None:
    """Write the record (or, with None, remove a record an earlier curation left)."""
    path = Path(documents_dir) / CANARIES_FILE
    if record is None:
        path.unlink(missing_ok=True)
        return
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def read_record(documents_dir: Path) -> dict[str, Any] | None:
    """The canaries curation planted in this documents directory, or None when it planted none."""
    path = Path(documents_dir) / CANARIES_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or not record.get("canaries"):
        return None
    return record
