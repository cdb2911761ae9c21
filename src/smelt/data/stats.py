"""The curate stats: counts in, kept, dropped and quarantined per reason, per step, per split and source.

The accounting invariant `documents_in == kept + sum(dropped) + sum(quarantined)` is checked here for
the whole run and for every source; a violation is a bug in smelt, not a user error.
"""

from __future__ import annotations

from typing import Any

from smelt.data.document import DROPPED, QUARANTINED, Doc, Ledger
from smelt.data.split import TRAIN, VAL


def _split_block() -> dict[str, int]:
    return {"documents": 0, "chars": 0, "bytes": 0}


def _block() -> dict[str, Any]:
    return {
        "documents_in": 0,
        "documents_kept": 0,
        DROPPED: {},
        QUARANTINED: {},
        "splits": {TRAIN: _split_block(), VAL: _split_block()},
    }


def check_invariant(name: str, block: dict[str, Any]) -> None:
    accounted = block["documents_kept"] + sum(block[DROPPED].values()) + sum(block[QUARANTINED].values())
    if block["documents_in"] != accounted:
        raise AssertionError(
            f"curate accounting is broken for {name}: documents_in = {block['documents_in']} but kept + "
            f"dropped + quarantined = {accounted}. This is a bug in smelt; please report it."
        )


def build_stats(
    sources: list[str],
    files: dict[str, int],
    docs: list[Doc],
    ledger: Ledger,
    step_names: list[str],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    per_source = {name: _block() for name in sources}
    for name in sources:
        block = per_source[name]
        block["documents_in"] = ledger.records_in[name]
        block["files"] = files[name]
        for status in ("empty", "unreadable"):
            block[f"files_{status}"] = ledger.files[(name, status)]
    for entry in ledger.entries:
        counts = per_source[entry["source"]][entry["kind"]]
        counts[entry["reason"]] = counts.get(entry["reason"], 0) + 1
    for doc in docs:
        block = per_source[doc.source]
        block["documents_kept"] += 1
        split = block["splits"][doc.split]
        split["documents"] += 1
        split["chars"] += len(doc.text)
        split["bytes"] += len(doc.text.encode("utf-8"))

    total = _block()
    total["files"] = sum(files.values())
    for block in per_source.values():
        total["documents_in"] += block["documents_in"]
        total["documents_kept"] += block["documents_kept"]
        for kind in (DROPPED, QUARANTINED):
            for reason, n in block[kind].items():
                total[kind][reason] = total[kind].get(reason, 0) + n
        for split, figures in block["splits"].items():
            for key, n in figures.items():
                total["splits"][split][key] += n

    for name, block in per_source.items():
        check_invariant(f"source {name!r}", block)
    check_invariant("the run", total)
    steps = [
        {"step": name, "in": ledger.steps[(name, "in")], "out": ledger.steps[(name, "out")]}
        for name in ["read", *step_names]
    ]
    return {**total, "sources": per_source, "steps": steps, **(extra or {})}
