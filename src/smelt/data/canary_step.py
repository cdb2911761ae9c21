"""Planting canaries (data.canaries = N): random strings with known exposure counts in the train split.

After the reduce has written the documents, canary i goes into the first source's train split
`2 ** (i % 6)` times (smelt.canaries), as parts numbered after that split's own parts, the copies in a
seeded shuffled order so that repeats of one string do not sit next to each other in the token
stream. They are planted after the accounting (filters and dedup would remove the repeats), so the
identity documents_in = kept + dropped + quarantined is about the raw records alone; stats.json lists
the canaries under `canaries`, and RUN/documents/canaries.json records every string and its copies
for the contamination meter (eval/contamination.py). With N = 0 nothing is planted and a record
left by an earlier curation is removed.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from smelt.canaries import SEED, make_record, write_record
from smelt.config import DataConfig
from smelt.data.ledger import Doc
from smelt.data.split import TRAIN
from smelt.data.writer import write_part


def plant_canaries(cfg: DataConfig, out_dir: Path) -> dict[str, Any] | None:
    """Write the canary parts and their record; return the figures for stats.json (None: none planted)."""
    if not cfg.canaries or not cfg.sources:
        write_record(out_dir, None)
        return None
    source = cfg.sources[0].name
    record = make_record(cfg.canaries, source)
    docs = [
        Doc(source, 0, f"{c['id']}#copy{k:02d}", c["text"], file="", split=TRAIN,
            meta={"canary": c["id"], "copies": c["copies"]})
        for c in record["canaries"]
        for k in range(c["copies"])
    ]  # fmt: skip
    random.Random(f"{SEED}:order").shuffle(docs)
    folder = out_dir / TRAIN / source
    first = len(list(folder.glob("part-*.parquet")))
    for n, start in enumerate(range(0, len(docs), cfg.docs_per_part)):
        write_part(docs[start : start + cfg.docs_per_part], folder / f"part-{first + n:05d}.parquet")
    write_record(out_dir, record)
    return {"source": source, "strings": len(record["canaries"]), "documents": len(docs)}
