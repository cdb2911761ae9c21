"""Evaluate tokenizers: compression and fertility per source and language, unused and longest tokens.

Figures per group (a source, or a source/language when documents carry a language: the language the
source declares, `meta.declared_lang`, where there is one, else the language id label `lang`; each row
lists the language id labels of its documents beside it, `language_id`, since language id merges
near-identical varieties such as Bosnian and Croatian):
- bytes_per_token: UTF-8 bytes of the text over its tokens (higher is better compression);
- fertility: tokens per word; words come from `split_words`, which also works for scripts written
  without spaces (each Han, Kana, Thai, Lao, Khmer or Myanmar character counts as a word);
- continued_word_rate: share of words that span two or more tokens.
Over the whole sample: the longest tokens (in bytes) and the regular tokens never produced.
`evaluate_tokenizers` compares several tokenizers (or vocab sizes) in one table and one SVG plot.
"""

from __future__ import annotations

import html
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from smelt.documents import document_parts
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer

# Scripts written without spaces between words: every character is counted as a word.
_PER_CHAR = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # Han
    "\U00020000-\U0002fa1f"  # Han extensions
)
# Letters, digits and the combining marks that belong inside words (Indic vowel signs, Arabic harakat).
_WORD_CHAR = (
    r"\w\u0300-\u036f\u0483-\u0489\u0591-\u05c7\u0610-\u061a\u064b-\u065f\u0670\u06d6-\u06ed"
    r"\u0900-\u0dff\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
)
WORD_RE = re.compile(f"[{_PER_CHAR}]|(?:(?![{_PER_CHAR}])[{_WORD_CHAR}])+")


def split_words(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the words of `text` (see the module doc)."""
    return [m.span() for m in WORD_RE.finditer(text)]


class _Counts:
    def __init__(self) -> None:
        self.documents = 0
        self.bytes = 0
        self.tokens = 0
        self.words = 0
        self.word_tokens = 0
        self.continued = 0

    def row(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "bytes": self.bytes,
            "tokens": self.tokens,
            "words": self.words,
            "bytes_per_token": round(self.bytes / self.tokens, 4) if self.tokens else 0.0,
            "fertility": round(self.word_tokens / self.words, 4) if self.words else 0.0,
            "continued_word_rate": round(self.continued / self.words, 4) if self.words else 0.0,
        }


def evaluate_texts(
    tokenizer: Tokenizer, groups: Mapping[str, Sequence[str]], top: int = 20
) -> dict[str, Any]:
    """Evaluate one tokenizer on texts grouped by name (source or source/lang); see the module doc."""
    used = np.zeros(tokenizer.vocab_size, dtype=bool)
    rows: dict[str, dict[str, Any]] = {}
    total = _Counts()
    for name in sorted(groups):
        texts = [t for t in groups[name] if t]
        counts = _Counts()
        for start in range(0, len(texts), 256):
            batch = texts[start : start + 256]
            for text, encoding in zip(
                batch, tokenizer.inner.encode_batch(batch, add_special_tokens=False), strict=True
            ):
                ids = encoding.ids
                used[ids] = True
                counts.documents += 1
                counts.bytes += len(text.encode("utf-8"))
                counts.tokens += len(ids)
                spans = split_words(text)
                if not spans or not ids:
                    continue
                offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
                words = np.asarray(spans, dtype=np.int64)
                # tokens overlapping [ws, we): start < we and end > ws (token spans are in text order)
                per_word = np.searchsorted(offsets[:, 0], words[:, 1], side="left") - np.searchsorted(
                    np.maximum.accumulate(offsets[:, 1]), words[:, 0], side="right"
                )
                per_word = np.maximum(per_word, 1)
                counts.words += len(spans)
                counts.word_tokens += int(per_word.sum())
                counts.continued += int((per_word >= 2).sum())
        rows[name] = counts.row()
        for key in ("documents", "bytes", "tokens", "words", "word_tokens", "continued"):
            setattr(total, key, getattr(total, key) + getattr(counts, key))

    lengths = tokenizer.token_byte_lengths()
    regular = lengths > 0
    never = np.flatnonzero(regular & ~used)
    order = np.argsort(-lengths, kind="stable")[:top]
    bpt = [r["bytes_per_token"] for r in rows.values() if r["tokens"]]
    return {
        "vocab_size": tokenizer.vocab_size,
        "groups": rows,
        "total": total.row(),
        "bytes_per_token_max_min_ratio": round(max(bpt) / min(bpt), 4) if bpt else 0.0,
        "longest_tokens": [
            {"id": int(i), "bytes": int(lengths[i]), "text": tokenizer.decode([int(i)])} for i in order
        ],
        "never_produced": int(never.size),
        "never_produced_share": round(float(never.size) / max(1, int(regular.sum())), 4),
        "never_produced_examples": [tokenizer.decode([int(i)]) for i in never[:top]],
    }


class Groups(dict[str, list[str]]):
    """Texts by group name, with the language id labels of each group's documents (`language_id`) and
    the names of the groups that are a declared language (`declared`)."""

    def __init__(self) -> None:
        super().__init__()
        self.language_id: dict[str, Counter[str]] = {}
        self.declared: set[str] = set()


# the meta key curation gives a document's declared language (data/read_spec.py DECLARED_LANG)
DECLARED_KEY = '"declared_lang"'


def _declared(meta: str | None) -> str | None:
    if not meta or DECLARED_KEY not in meta:  # skip parsing the meta of the documents without one
        return None
    value = json.loads(meta).get("declared_lang")
    return str(value) if value else None


def document_groups(documents_dir: Path, split: str, max_bytes_per_group: int = 1_000_000) -> Groups:
    """Texts of a documents split grouped by source, and by `source/language` where documents have a
    language (the declared one where the source declares it, else the language id label), at most
    `max_bytes_per_group` UTF-8 bytes per group, in document order (deterministic)."""
    parts = document_parts(Path(documents_dir), split)
    if not parts:
        raise UserError(
            f"no documents to evaluate the tokenizer on: {Path(documents_dir) / split} has no "
            f"<source>/part-*.parquet files. Run `smelt curate CONFIG` first, or pick another split."
        )
    groups = Groups()
    sizes: dict[str, int] = {}
    for path in parts:
        part = pq.ParquetFile(path)
        columns = ["text"] + [c for c in ("lang", "meta") if c in part.schema_arrow.names]
        for batch in part.iter_batches(batch_size=1024, columns=columns):
            values = {name: batch.column(name).to_pylist() for name in columns}
            texts = values["text"]
            langs = values.get("lang") or [None] * len(texts)
            metas = values.get("meta") or [None] * len(texts)
            for text, lang, meta in zip(texts, langs, metas, strict=True):
                if not text:
                    continue
                declared = _declared(meta)
                group = declared or lang
                name = f"{path.parent.name}/{group}" if group else path.parent.name
                size = len(text.encode("utf-8"))
                if sizes.get(name, 0) + size > max_bytes_per_group and sizes.get(name, 0) > 0:
                    continue
                sizes[name] = sizes.get(name, 0) + size
                groups.setdefault(name, []).append(text)
                groups.language_id.setdefault(name, Counter())[lang or "none"] += 1
                if declared:
                    groups.declared.add(name)
    return groups


def evaluate_tokenizers(
    tokenizers: Mapping[str, str | Path],
    groups: Mapping[str, Sequence[str]],
    out_dir: str | Path | None = None,
    top: int = 20,
) -> dict[str, Any]:
    """Evaluate several tokenizers (name -> directory) on the same grouped texts.

    With `out_dir`, writes `tokenizer_eval.json` (everything), `tokenizer_eval.md` (the table) and
    `tokenizer_eval.svg` (bytes per token per group and tokenizer). Returns the results and the table.
    """
    if not tokenizers:
        raise UserError("no tokenizers to evaluate: give at least one tokenizer directory.")
    results = {
        name: evaluate_texts(Tokenizer.load(directory), groups, top) for name, directory in tokenizers.items()
    }
    labels = getattr(groups, "language_id", {})
    for result in results.values():
        for group, row in result["groups"].items():
            if group in labels:
                row["declared"] = group in groups.declared  # type: ignore[attr-defined]
                row["language_id"] = dict(labels[group].most_common())
    table = format_table(results)
    report = {"tokenizers": {k: str(v) for k, v in tokenizers.items()}, "results": results, "table": table}
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenizer_eval.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
        (out / "tokenizer_eval.md").write_text(table + "\n")
        (out / "tokenizer_eval.svg").write_text(bytes_per_token_svg(results))
        report["paths"] = {k: str(out / f"tokenizer_eval.{k}") for k in ("json", "md", "svg")}
    return report


def train_and_evaluate(
    cfg,
    documents_dir: Path,
    out_dir: Path,
    seed: int,
    vocab_sizes: Sequence[int],
    split: str = "val",
    groups: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Train one tokenizer per vocab size (out_dir/vocab_N) with `cfg` otherwise, and compare them on `split`
    (the train split when `split` has no documents), or on `groups` of texts when given."""
    import dataclasses

    from smelt.tokenizer.train import train_tokenizer

    out_dir = Path(out_dir)
    tokenizers = {}
    for size in vocab_sizes:
        directory = out_dir / f"vocab_{size}"
        train_tokenizer(dataclasses.replace(cfg, vocab_size=int(size)), documents_dir, directory, seed)
        tokenizers[f"vocab {size}"] = directory
    if groups is None:
        if not document_parts(Path(documents_dir), split):
            split = "train"
        groups = document_groups(documents_dir, split)
    return evaluate_tokenizers(tokenizers, groups, out_dir)


def format_table(results: Mapping[str, dict[str, Any]]) -> str:
    """A Markdown table: one row per group and tokenizer, then each tokenizer's totals."""
    labelled = any("language_id" in row for r in results.values() for row in r["groups"].values())
    head = "| tokenizer | group | language id |" if labelled else "| tokenizer | group |"
    lines = [
        f"{head} bytes/token | fertility | continued words | tokens |",
        "|---|---|" + ("---|" if labelled else "") + "---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        for group, row in result["groups"].items():
            label = f" {_labels(row.get('language_id') or {})} |" if labelled else ""
            lines.append(
                f"| {name} | {group} |{label} {row['bytes_per_token']:.3f} | {row['fertility']:.3f} | "
                f"{row['continued_word_rate']:.1%} | {row['tokens']} |"
            )
    lines += [
        "",
        "| tokenizer | vocab | bytes/token | max/min bytes/token | never produced | longest token |",
    ]
    lines.append("|---|---:|---:|---:|---:|---|")
    for name, result in results.items():
        longest = result["longest_tokens"][0]["text"] if result["longest_tokens"] else ""
        lines.append(
            f"| {name} | {result['vocab_size']} | {result['total']['bytes_per_token']:.3f} | "
            f"{result['bytes_per_token_max_min_ratio']:.3f} | {result['never_produced']} "
            f"({result['never_produced_share']:.1%}) | {json.dumps(longest, ensure_ascii=False)} |"
        )
    return "\n".join(lines)


def _labels(counts: Mapping[str, int], top: int = 3) -> str:
    """The language id labels of a group's documents with their shares: `hr 59%, bs 41%`."""
    total = sum(counts.values())
    if not total:
        return ""
    shown = ", ".join(f"{label} {n / total:.0%}" for label, n in list(counts.items())[:top])
    return shown + (f", +{len(counts) - top} more" if len(counts) > top else "")


_COLORS = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def bytes_per_token_svg(results: Mapping[str, dict[str, Any]], width: int = 900, height: int = 360) -> str:
    """A self-contained SVG grouped bar chart: bytes per token for each group, one bar per tokenizer."""
    names = list(results)
    groups = sorted({g for r in results.values() for g in r["groups"]})
    peak = max([r["groups"][g]["bytes_per_token"] for r in results.values() for g in r["groups"]] + [1.0])
    left, right, top, bottom = 50, 10, 30, 90
    plot_w, plot_h = width - left - right, height - top - bottom
    slot = plot_w / max(1, len(groups))
    bar = slot * 0.8 / max(1, len(names))
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="13">bytes per token (higher is better)</text>',
    ]
    for i in range(5):
        value = peak * i / 4
        y = top + plot_h - plot_h * value / peak
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{value:.1f}</text>')
    for gi, group in enumerate(groups):
        x0 = left + gi * slot + slot * 0.1
        for ni, name in enumerate(names):
            row = results[name]["groups"].get(group)
            if not row:
                continue
            h = plot_h * row["bytes_per_token"] / peak
            x, y = x0 + ni * bar, top + plot_h - h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar * 0.95:.1f}" height="{h:.1f}" '
                f'fill="{_COLORS[ni % len(_COLORS)]}"><title>{html.escape(name)} {html.escape(group)}: '
                f"{row['bytes_per_token']:.3f}</title></rect>"
            )
        cx, cy = left + gi * slot + slot / 2, top + plot_h + 12
        out.append(
            f'<text x="{cx:.1f}" y="{cy:.1f}" text-anchor="end" transform="rotate(-40 {cx:.1f} {cy:.1f})">'
            f"{html.escape(group)}</text>"
        )
    for ni, name in enumerate(names):
        x = left + ni * 150
        out.append(
            f'<rect x="{x}" y="{height - 16}" width="10" height="10" fill="{_COLORS[ni % len(_COLORS)]}"/>'
        )
        out.append(f'<text x="{x + 14}" y="{height - 7}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
