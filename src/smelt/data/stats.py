"""The curate stats: counts in, kept, dropped and quarantined per reason, per step, split and source.

The accounting invariant `documents_in == kept + sum(dropped) + sum(quarantined)` is checked here for
the whole run and for every source; a violation is a bug in smelt, not a user error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from smelt.data.langid import UNDETERMINED
from smelt.data.ledger import DROPPED, QUARANTINED, Doc, Ledger
from smelt.data.read_spec import DECLARED_LANG
from smelt.data.split import SPLITS, TRAIN


def language_group(doc: Doc) -> str | None:
    """The language a document counts under for per-language figures: the language its source declares
    (`declared_lang`) where there is one, else its language id label (`lang`); None for none or `und`."""
    lang = doc.meta.get(DECLARED_LANG) or doc.meta.get("lang")
    return lang if lang and lang != UNDETERMINED else None


class KeptStats:
    """Running totals of the kept documents (streamed past once, never held)."""

    def __init__(self) -> None:
        self.splits: Counter = Counter()  # (source, split, "documents"|"chars"|"bytes") -> n
        self.langs: Counter = Counter()  # (source, lang) -> documents
        self.pii: Counter = Counter()  # (source, kind) -> replacements
        # (language group, split, "documents"|"chars") -> n over the run; (language group, source) -> documents
        self.lang_splits: Counter = Counter()
        self.lang_sources: Counter = Counter()
        self.declared: Counter = Counter()  # (source, declared language, language id label) -> documents

    def add(self, doc: Doc) -> None:
        self.splits[(doc.source, doc.split, "documents")] += 1
        self.splits[(doc.source, doc.split, "chars")] += len(doc.text)
        self.splits[(doc.source, doc.split, "bytes")] += len(doc.text.encode("utf-8"))
        lang = doc.meta.get("lang")
        if lang:
            self.langs[(doc.source, lang)] += 1
        declared = doc.meta.get(DECLARED_LANG)
        if declared:
            self.declared[(doc.source, declared, lang or "")] += 1
        group = language_group(doc)
        if group:
            self.lang_splits[(group, doc.split, "documents")] += 1
            self.lang_splits[(group, doc.split, "chars")] += len(doc.text)
            self.lang_sources[(group, doc.source)] += 1
        for kind, n in (doc.meta.get("pii") or {}).items():
            self.pii[(doc.source, kind)] += n


def check_invariant(name: str, block: dict[str, Any]) -> None:
    accounted = block["documents_kept"] + sum(block[DROPPED].values()) + sum(block[QUARANTINED].values())
    if block["documents_in"] != accounted:
        raise AssertionError(
            f"curate accounting is broken for {name}: documents_in = {block['documents_in']} but kept + "
            f"dropped + quarantined = {accounted}. This is a bug in smelt; please report it."
        )


def _source_block(name: str, files: int, ledger: Ledger, kept: KeptStats) -> dict[str, Any]:
    splits = {
        split: {key: kept.splits[(name, split, key)] for key in ("documents", "chars", "bytes")}
        for split in SPLITS
    }
    block: dict[str, Any] = {
        "documents_in": ledger.records_in[name],
        "documents_kept": sum(s["documents"] for s in splits.values()),
        DROPPED: {},
        QUARANTINED: {},
        "splits": splits,
        "files": files,
        "files_empty": ledger.files(name, "empty"),
        "files_unreadable": ledger.files(name, "unreadable"),
    }
    for (kind, source, reason), n in sorted(ledger.reasons.items()):
        if source == name:
            block[kind][reason] = n
    notes = {what: n for (source, what), n in sorted(ledger.notes.items()) if source == name}
    if notes:
        block["notes"] = notes
    langs = {lang: n for (source, lang), n in kept.langs.most_common() if source == name}
    if langs:
        block["languages"] = langs
    declared: dict[str, dict[str, Any]] = {}
    for (source, lang, label), n in sorted(
        kept.declared.items(), key=lambda kv: (kv[0][1], -kv[1], kv[0][2])
    ):
        if source == name:
            row = declared.setdefault(lang, {"documents": 0, "language_id": {}})
            row["documents"] += n
            row["language_id"][label or "none"] = n
    if declared:
        block["declared_languages"] = declared
    pii = {kind: n for (source, kind), n in sorted(kept.pii.items()) if source == name}
    if pii:
        block["pii"] = pii
    return block


def _steps(ledger: Ledger, step_names: list[str], sources: list[str]) -> list[dict[str, Any]]:
    rows = []
    for step in ["read", *step_names]:
        row: dict[str, Any] = {"step": step}
        for kind in ("in", "out"):
            row[kind] = sum(ledger.steps[(step, s, kind)] for s in sources)
        for kind in ("in", "out"):
            row[f"chars_{kind}"] = sum(ledger.chars[(step, s, kind)] for s in sources)
        if step == "read":  # the characters of unreadable records are unknown
            row["chars_in"] = None
        row["sources"] = {
            s: {
                "in": ledger.steps[(step, s, "in")],
                "out": ledger.steps[(step, s, "out")],
                "chars_in": ledger.chars[(step, s, "in")],
                "chars_out": ledger.chars[(step, s, "out")],
            }
            for s in sources
        }
        rows.append(row)
    return rows


def build_stats(
    sources: list[str],
    files: dict[str, int],
    ledger: Ledger,
    kept: KeptStats,
    step_names: list[str],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    per_source = {name: _source_block(name, files[name], ledger, kept) for name in sources}
    total: dict[str, Any] = {
        "documents_in": 0,
        "documents_kept": 0,
        DROPPED: Counter(),
        QUARANTINED: Counter(),
        "splits": {split: Counter() for split in SPLITS},
        "files": sum(files.values()),
    }
    for block in per_source.values():
        total["documents_in"] += block["documents_in"]
        total["documents_kept"] += block["documents_kept"]
        for kind in (DROPPED, QUARANTINED):
            total[kind].update(block[kind])
        for split, figures in block["splits"].items():
            total["splits"][split].update(figures)
    total[DROPPED] = dict(sorted(total[DROPPED].items()))
    total[QUARANTINED] = dict(sorted(total[QUARANTINED].items()))
    total["splits"] = {
        split: {key: figures[key] for key in ("documents", "chars", "bytes")}
        for split, figures in total["splits"].items()
    }
    pii = Counter()
    for (_, kind), n in kept.pii.items():
        pii[kind] += n
    if pii:
        total["pii"] = dict(sorted(pii.items()))
    for name, block in per_source.items():
        check_invariant(f"source {name!r}", block)
    check_invariant("the run", total)
    steps = _steps(ledger, step_names, sources)
    return {**total, "sources": per_source, "steps": steps, **(extra or {})}


# A source that keeps less than this share of the characters it read gets a warning.
KEPT_SHARE_WARNING = 0.5


def removed_chars(entries: Iterable[dict[str, Any]]) -> Counter:
    """Characters and documents dropped, keyed (step, reason, "chars" | "documents"), from a source's
    ledger entries (quarantined records have no text and are not counted)."""
    removed: Counter = Counter()
    for entry in entries:
        if entry.get("kind") == DROPPED:
            key = (entry.get("step") or "", entry.get("reason") or "")
            removed[(*key, "chars")] += int(entry.get("chars") or 0)
            removed[(*key, "documents")] += 1
    return removed


def loss_warnings(stats: dict[str, Any], removed: dict[str, Counter]) -> list[dict[str, Any]]:
    """A warning per source that kept less than half the characters its readable documents held, naming
    what removed the most: a drop reason, or a step cutting text out of documents it kept."""
    warnings = []
    for name, block in stats["sources"].items():
        per_step = {row["step"]: row["sources"].get(name, {}) for row in stats["steps"]}
        read = (per_step.get("read") or {}).get("chars_out", 0)
        kept = sum(split["chars"] for split in block["splits"].values())
        if not read or kept >= KEPT_SHARE_WARNING * read:
            continue
        causes: Counter = Counter()
        documents: Counter = Counter()
        dropped_in_step: Counter = Counter()
        for (step, reason, what), n in removed.get(name, Counter()).items():
            if what == "chars":
                causes[(step, reason)] += n
                dropped_in_step[step] += n
            else:
                documents[(step, reason)] += n
        for step, figures in per_step.items():
            inside = figures.get("chars_in", 0) - figures.get("chars_out", 0) - dropped_in_step[step]
            if step != "read" and inside > 0:
                causes[(step, "")] += inside
        if not causes:
            continue
        (step, reason), chars = causes.most_common(1)[0]
        warning = {"source": name, "chars_read": read, "chars_kept": kept, "kept_share": round(kept / read, 4),
                   "step": step, "reason": reason, "reason_chars": chars,
                   "reason_documents": documents[(step, reason)]}  # fmt: skip
        warnings.append({**warning, "message": warning_text(warning)})
    return warnings


def warning_text(warning: dict[str, Any], documents_dir: str = "RUN") -> str:
    """The sentence for a loss warning, with the `smelt inspect` command that shows what was removed."""
    name, step, reason, chars = warning["source"], warning["step"], warning["reason"], warning["reason_chars"]
    if reason:
        cause = f"{reason} (step {step}: {chars:,} characters in {warning['reason_documents']:,} documents)"
        look = f"smelt inspect documents {documents_dir} --dropped-by {step} --source {name}"
    else:
        cause = f"step {step} cutting text out of the documents it kept ({chars:,} characters)"
        look = f"smelt inspect documents {documents_dir} --kept --source {name}"
    kept, read = warning["chars_kept"], warning["chars_read"]
    return (
        f"source {name!r} kept {kept / read:.0%} of the text it read ({kept:,} of {read:,} characters); "
        f"most was removed by {cause}. Look at it with `{look}`, then change that step's settings "
        f"or the source's `filters` if it should have stayed."
    )


SPLIT_GUIDE = "docs/curation.md, 'Choosing split_unit'"
DEFAULT_UNIT = "'id'"


def split_warnings(
    stats: dict[str, Any], kept: KeptStats, units: dict[str, str], val_fraction: float, test_fraction: float
) -> list[dict[str, Any]]:
    """A warning per source, and per language group over the run, that has kept documents but none in
    the train split: a split unit (a file, a directory) lands whole in one split, so a source or a
    language that is one unit can go wholly to validation, and the tokenizer and the model never see
    it. `units`: each source's split_unit as shown (`'id' (the file)`)."""
    fractions = f"data.val_fraction = {val_fraction:g}, data.test_fraction = {test_fraction:g}"
    warnings = []
    for name, block in stats["sources"].items():
        held = {k: v["documents"] for k, v in block["splits"].items() if k != TRAIN and v["documents"]}
        if not block["documents_kept"] or block["splits"][TRAIN]["documents"]:
            continue
        message = (
            f"source {name!r} has no training documents: {_documents(block['documents_kept'])} kept, all in "
            f"{_where(held)} (split_unit = {units.get(name, DEFAULT_UNIT)}, {fractions}). A split unit lands "
            f"whole in one split; give the source more units than one, or a smaller split_unit "
            f"({SPLIT_GUIDE})."
        )
        warnings.append({"kind": "no_train", "source": name, "splits": held, "message": message})
    groups = sorted({group for group, _, _ in kept.lang_splits})
    for group in groups:
        held = {split: kept.lang_splits[(group, split, "documents")] for split in SPLITS if split != TRAIN}
        held = {k: v for k, v in held.items() if v}
        if kept.lang_splits[(group, TRAIN, "documents")] or not held:
            continue
        chars = sum(kept.lang_splits[(group, split, "chars")] for split in SPLITS)
        sources = sorted(source for g, source in kept.lang_sources if g == group)
        unit_list = ", ".join(
            f"{source!r} (split_unit = {units.get(source, DEFAULT_UNIT)})" for source in sources
        )
        message = (
            f"language {group!r} has no training documents: {_documents(sum(held.values()))} "
            f"({chars:,} characters), all in {_where(held)}, from source {unit_list}. A language that is one "
            f"split unit (one file, one directory) lands whole in one split, and the tokenizer and the model "
            f"never see it; split it into smaller units ({SPLIT_GUIDE})."
        )
        warnings.append({"kind": "no_train", "language": group, "splits": held, "message": message})
    return warnings


def _documents(n: int) -> str:
    return f"{n:,} document" + ("" if n == 1 else "s")


def _where(held: dict[str, int]) -> str:
    return " and ".join(f"{split} ({n:,})" if len(held) > 1 else split for split, n in held.items())


def retention_table(stats: dict[str, Any]) -> str:
    """Per-step and per-source retention as aligned text: what survived and why the rest did not."""
    lines = [f"{'step':<22} {'docs in':>9} {'docs out':>9} {'chars kept':>10}"]
    for row in stats["steps"]:
        kept = "" if not row.get("chars_in") else f"{100 * row['chars_out'] / row['chars_in']:.1f}%"
        lines.append(f"{row['step']:<22} {row['in']:>9,} {row['out']:>9,} {kept:>10}")
    lines.append("")
    lines.append(f"{'source':<14} {'in':>7} {'kept':>7} {'kept %':>7}  removed (reason: documents)")
    for name, block in stats["sources"].items():
        n_in = block["documents_in"]
        share = f"{100 * block['documents_kept'] / n_in:.1f}" if n_in else "-"
        removed = {**block[DROPPED], **{f"quarantined:{k}": v for k, v in block[QUARANTINED].items()}}
        top = ", ".join(f"{k}: {v}" for k, v in sorted(removed.items(), key=lambda kv: -kv[1])[:4])
        more = f" (+{len(removed) - 4} more)" if len(removed) > 4 else ""
        lines.append(f"{name:<14} {n_in:>7,} {block['documents_kept']:>7,} {share:>7}  {top}{more}")
    for warning in stats.get("warnings") or []:
        lines.append(f"\nwarning: {warning['message']}")
    return "\n".join(lines)
