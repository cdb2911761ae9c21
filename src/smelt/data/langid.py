"""Language identification of documents: py3langid by default, lingua as an option.

Why py3langid by default: nothing is downloaded at run time (fastText's lid.176 is not on PyPI), its
4.5 MB model ships inside the wheel and knows 140 languages (114 with ISO 639-1 codes), it loads in
under a second, and its normalized probabilities are temperature-scaled by text length, so a
confidence means about the same for a tweet and a book.

`data.langid.backend = "lingua"` uses lingua-language-detector (the `langid-lingua` extra, a 96 MB
wheel): more accurate on short text and on close pairs (Malay/Indonesian, Bosnian/Croatian), and it
knows Maori, Tswana and Tsonga, which py3langid lacks; but its high-accuracy models take about 1.2 GB
and tens of seconds to load (once, in the parent process, shared by forked workers) and it classifies
about 5x slower. `"lingua_low"` is its low-accuracy mode: trigram models only, about 130 MB and a few
seconds to load. Per-language accuracy of all three: docs/curation.md, from bench/langid.py.

Speed: py3langid walks its byte n-gram automaton in Python (~1.5 MB/s), so a long document is not
classified whole. Up to `max_chars` characters are used: the whole text when it is that short,
otherwise 4 windows of max_chars/4 characters centred at 1/8, 3/8, 5/8 and 7/8 of the text. Windows
spread over the text keep a header or footer in another language (a licence, a cookie banner) from
deciding the language; on lingua documents of ~4,000 characters, 1,000 sampled characters are within
0.3 points of the accuracy of the whole text. Every backend classifies the same sample.

A source may also declare its documents' language (`declared_language`: a code, `file`, `dir` or
`field:<name>`, see `ReadSpec.declared_for`), kept as `meta.declared_lang`: language id cannot tell
near-identical standard varieties apart (Bosnian from Croatian, Malay from Indonesian), and per-language
figures group by the declared language where there is one, with the language id label beside it.

`smelt inspect langid FILE|DIR` (langid_texts, langid_report, format_langid) classifies any text the
same way and, when file or folder names are the languages (`--labels file|dir`), gives each language's
accuracy and wrong answers: bench/langid.py's measurement for a user's own files.

Meta: `lang` is the backend's code. py3langid: ISO 639-1 where one exists (Norwegian is `no`; a
keep-list may say `nb`), ISO 639-3 for the rest (e.g. `ary`, `ace`). lingua: ISO 639-1 for all its 75
languages (Norwegian is `nb` or `nn`). `und` with score 0 for text without letters. `lang_score` is the
probability of that language, 0..1, rounded to 4 digits (lingua: its relative confidence value).
"""

from __future__ import annotations

import difflib
import gzip
import re
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from smelt.config import DataConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep
from smelt.errors import ConfigError, UserError

UNDETERMINED = "und"
WINDOWS = 4
BACKENDS = ("py3langid", "lingua", "lingua_low")
# Codes a person may write for a language the backend labels differently.
ALIASES = {"nb": "no", "nob": "no", "iw": "he", "in": "id", "ji": "yi"}
LINGUA_ALIASES = {"nob": "nb", "nno": "nn", "iw": "he", "in": "id"}
_LETTER = re.compile(r"[^\W\d_]")
# A declared language code: ISO 639-1 or 639-3, optionally with a script or region (sr-latn, pt-br).
_CODE = re.compile(r"[a-z]{2,3}(?:[-_][a-z0-9]{2,8})*")


def check_declared_languages(cfg: DataConfig) -> None:
    """ConfigError naming `data.sources[i].declared_language` for a value that is neither a language
    code nor `file`, `dir` or `field:<name>` (the last only for jsonl and parquet sources)."""
    for i, source in enumerate(cfg.sources):
        value = source.declared_language.strip()
        where = f"data.sources[{i}].declared_language = {source.declared_language!r} (source {source.name!r})"
        if value.startswith("field:"):
            if len(value) > len("field:") and source.format in ("jsonl", "parquet"):
                continue
            raise ConfigError(
                f"{where}: field:<name> takes the language from a record field, which only jsonl and "
                f"parquet sources have; use a code such as pl, or `file` / `dir` to take it from the path."
            )
        if not value or value in ("file", "dir") or _CODE.fullmatch(value.lower()):
            continue
        raise ConfigError(
            f"{where} is not a language code: use an ISO 639 code such as pl, bs or ms (as lowercase letters, "
            f"optionally with a script or region: sr-latn), `file` (the file name before its first dot), "
            f"`dir` (the top directory) or field:<record field>."
        )


@cache
def _model() -> Any:
    """The py3langid identifier with normalized probabilities, loaded once per process (~0.7 s)."""
    import numpy as np
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    model = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    # The weights ship as float16; scoring gathers a few hundred rows per document and numpy
    # converts them to float32 on every call. Converting once (57 MB) makes scoring ~3x faster and
    # changes no result: float16 -> float32 is exact and the product was computed in float32 anyway.
    model.nb_ptc = np.ascontiguousarray(model.nb_ptc, dtype=np.float32)
    return model


@cache
def _lingua(backend: str) -> Any:
    """The lingua detector over all its languages, models loaded now (high accuracy: about 1.2 GB;
    `lingua_low`: about 130 MB). UserError when the package is not installed."""
    try:
        from lingua import LanguageDetectorBuilder
    except ImportError:
        raise UserError(
            f'data.langid.backend = "{backend}" needs the lingua-language-detector package, which is not '
            "installed. Install it with `pip install -e '.[langid-lingua]'` (or `make install`, which "
            'includes that extra), or set data.langid.backend = "py3langid".'
        ) from None
    builder = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models()
    if backend == "lingua_low":
        builder = builder.with_low_accuracy_mode()
    return builder.build()


def _lingua_code(language: Any) -> str:
    return language.iso_code_639_1.name.lower()


def known_languages(backend: str = "py3langid") -> frozenset[str]:
    """Every code the backend can answer."""
    if backend == "py3langid":
        return frozenset(_model().labels)
    from lingua import Language

    return frozenset(_lingua_code(language) for language in Language.all())


def sample_text(text: str, max_chars: int) -> str:
    """The text itself when it has at most `max_chars` characters, else WINDOWS windows of
    max_chars // WINDOWS characters centred at (k + 1/2) / WINDOWS of the text, joined by spaces."""
    if len(text) <= max_chars:
        return text
    size = max_chars // WINDOWS
    n = len(text)
    starts = (int((k + 0.5) * n / WINDOWS) - size // 2 for k in range(WINDOWS))
    return " ".join(text[s : s + size] for s in starts)


def identify(text: str, max_chars: int = 1000, backend: str = "py3langid") -> tuple[str, float]:
    """(language code, probability 0..1) of `text`, classified on `sample_text(text, max_chars)` by
    `backend` (one of BACKENDS); (`und`, 0.0) when the sample has no letter (numbers, symbols, empty)."""
    sample = sample_text(text, max_chars)
    if not _LETTER.search(sample):
        return UNDETERMINED, 0.0
    if backend == "py3langid":
        lang, score = _model().classify(sample)
        return lang, float(score)
    values = _lingua(backend).compute_language_confidence_values(sample)
    if not values:
        return UNDETERMINED, 0.0
    return _lingua_code(values[0].language), float(values[0].value)


def resolve_languages(languages: list[str], where: str, backend: str = "py3langid") -> frozenset[str]:
    """A keep-list as the backend's codes (aliases applied, lowercased); ConfigError naming `where` for
    a code the backend never answers, with the closest known codes."""
    known = known_languages(backend)
    aliases = ALIASES if backend == "py3langid" else LINGUA_ALIASES
    out = set()
    for code in languages:
        norm = aliases.get(code.strip().lower(), code.strip().lower())
        if norm not in known:
            close = difflib.get_close_matches(norm, sorted(known), n=3, cutoff=0.5)
            hint = f" (closest: {', '.join(close)})" if close else ""
            raise ConfigError(
                f"{where}: {code!r} is not a language code the language-id backend ({backend}) can "
                f"answer{hint}. Use ISO 639-1 codes such as en, de, fr, zh; {backend} knows: "
                f"{', '.join(sorted(known))}."
            )
        out.add(norm)
    return frozenset(out)


class LanguageId(DocStep):
    """Annotate `lang` and `lang_score`; drop (reason `language`) documents of a source with a
    keep-list whose language is not on it or whose score is below the source's threshold."""

    name = "language_id"

    def __init__(
        self,
        keep: dict[str, tuple[frozenset[str], float]],
        sources: frozenset[str] | None = None,
        max_chars: int = 1000,
        backend: str = "py3langid",
    ):
        self.keep = dict(keep)
        self.sources = None if sources is None else frozenset(sources)
        self.max_chars = max_chars
        self.backend = backend

    @classmethod
    def from_config(cls, cfg: DataConfig) -> LanguageId | None:
        """The step for every non-code source, or None when `data.langid.enabled` is false or every
        source is code. Validates keep-lists and loads the model here, in the parent process, so
        forked workers share it instead of each loading it; UserError when the lingua backend is
        chosen and not installed."""
        if not cfg.langid.enabled:
            return None
        backend = cfg.langid.backend
        sources = [(i, source) for i, source in enumerate(cfg.sources) if not source.code]
        if not sources:
            return None
        if backend == "py3langid":
            _model()
        else:
            _lingua(backend)
        keep = {}
        for i, source in sources:
            where = f"data.sources[{i}].languages (source {source.name!r})"
            keep[source.name] = (resolve_languages(source.languages, where, backend), source.lang_threshold)
        return cls(keep, frozenset(keep), cfg.langid.max_chars, backend)

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        lang, score = identify(doc.text, self.max_chars, self.backend)
        doc.meta["lang"] = lang
        doc.meta["lang_score"] = round(score, 4)
        langs, threshold = self.keep.get(doc.source, (frozenset(), 0.0))
        if langs and (lang not in langs or score < threshold):
            ledger.drop(doc, "language", lang=lang, lang_score=round(score, 4))
            return None
        return doc


# ---------------------------------------------------------------------------------------------
# `smelt inspect langid FILE|DIR`: language id of any text, with per-language accuracy when the
# file or folder names say which language each text is in.

TEXT_SUFFIXES = (".txt", ".md", ".jsonl", ".jsonl.gz")
LABEL_SOURCES = ("none", "file", "dir")


def _suffix(path: Path) -> str | None:
    return next((s for s in TEXT_SUFFIXES if path.name.lower().endswith(s)), None)


def _label_of(file: Path, root: Path, labels: str) -> str | None:
    """The language a text is labelled with: the file name before its first dot (`file`), or its top
    folder under `root` (`dir`); a UserError naming the file when that is not a language code."""
    if labels == "none":
        return None
    if labels == "file":
        label, what = file.name.split(".", 1)[0], "file name before its first dot"
    else:
        parts = file.relative_to(root).parts if file != root else (file.parent.name, file.name)
        label, what = (parts[0] if len(parts) > 1 else file.parent.name), "top folder"
    if not _CODE.fullmatch(label.lower()):
        raise UserError(
            f"--labels {labels}: {file} is not labelled with a language: its {what}, {label!r}, is not an "
            f"ISO 639 code such as de, pl or pt-br. Rename it, use --labels "
            f"{'dir' if labels == 'file' else 'file'}, or --labels none for the languages found."
        )
    return label.lower()


def langid_texts(
    path: Path, labels: str = "none", unit: str = "line", field: str = "text", limit: int = 0
) -> list[tuple[str | None, str]]:
    """(label, text) of every text under `path` (a file, or a folder's .txt, .md, .jsonl and .jsonl.gz
    files in path order): each non-empty line of a text file (`unit` "line") or the whole file
    ("file"), each jsonl record's `field`; at most `limit` texts per file (0: all). Texts are normalized
    as `smelt curate` normalizes them before language id."""
    from smelt.data.normalize import normalize_text
    from smelt.jsonl import json_objects

    path = Path(path)
    if not path.exists():
        raise UserError(f"{path} does not exist (resolved from {Path.cwd()}).")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and _suffix(p))
    if not files or _suffix(files[0]) is None:
        raise UserError(
            f"{path}: no text to read there; give a {', '.join(TEXT_SUFFIXES)} file or a folder of them."
        )
    items: list[tuple[str | None, str]] = []
    for file in files:
        label = _label_of(file, path, labels)
        try:
            if _suffix(file) in (".jsonl", ".jsonl.gz"):
                opener = gzip.open if file.name.lower().endswith(".gz") else open
                with opener(file, "rt", encoding="utf-8") as handle:
                    fix = f"Name the text field with --field (now {field!r})."
                    texts = [r.get(field) for _, r in json_objects(handle, file, "file", fix)]
                if any(not isinstance(t, str) for t in texts):
                    raise UserError(f"{file}: a record has no string {field!r} field; name it with --field.")
            else:
                text = file.read_text(encoding="utf-8")
                texts = text.splitlines() if unit == "line" else [text]
        except (OSError, UnicodeDecodeError, EOFError) as exc:
            raise UserError(f"{file} cannot be read as UTF-8 text ({exc}).") from exc
        texts = [normalize_text(t).strip() for t in texts]
        texts = [t for t in texts if t]
        items += [(label, t) for t in (texts[:limit] if limit else texts)]
    if not items:
        raise UserError(f"{path} holds no text.")
    return items


def langid_report(
    items: list[tuple[str | None, str]], backend: str = "py3langid", max_chars: int = 1000
) -> dict[str, Any]:
    """Each text classified as `smelt curate` does (identify). Always: the languages found, with their
    share and mean score. With labels: per label its texts, its accuracy (a label matches its
    backend's code: `nb` is py3langid's `no`; a region or script is ignored, `pt-br` is `pt`) and what
    the wrong answers were, then the mean of the per-language accuracies (macro) and the share of all
    texts labelled right (micro); `unknown_labels` are labels the backend never answers."""
    aliases = ALIASES if backend == "py3langid" else LINGUA_ALIASES
    known = known_languages(backend)
    found: Counter[str] = Counter()
    scores: dict[str, float] = {}
    per_label: dict[str, list[str]] = {}
    for label, text in items:
        lang, score = identify(text, max_chars, backend)
        found[lang] += 1
        scores[lang] = scores.get(lang, 0.0) + score
        if label is not None:
            per_label.setdefault(label, []).append(lang)
    total = len(items)
    report: dict[str, Any] = {
        "backend": backend,
        "texts": total,
        "languages": {
            lang: {"texts": n, "share": round(n / total, 4), "mean_score": round(scores[lang] / n, 4)}
            for lang, n in found.most_common()
        },
    }
    if per_label:
        rows, right_total = {}, 0
        for label, answers in sorted(per_label.items()):
            base = re.split(r"[-_]", label)[0]
            code = aliases.get(base, base)
            right = sum(answer == code for answer in answers)
            right_total += right
            wrong = Counter(a for a in answers if a != code)
            rows[label] = {"texts": len(answers), "accuracy": round(right / len(answers), 4),
                           "answered_as": dict(wrong.most_common(3)), "known": code in known}  # fmt: skip
        report["labels"] = rows
        report["macro_accuracy"] = round(sum(r["accuracy"] for r in rows.values()) / len(rows), 4)
        report["accuracy"] = round(right_total / sum(len(a) for a in per_label.values()), 4)
        report["unknown_labels"] = [label for label, row in rows.items() if not row["known"]]
    return report


def format_langid(report: dict[str, Any], top: int = 20) -> str:
    """The report as text: per-language accuracy with labels, else the languages found."""
    lines = []
    if "labels" in report:
        lines.append(f"{'label':<8} {'texts':>6} {'accuracy':>9}  wrong answers")
        for label, row in report["labels"].items():
            wrong = ", ".join(f"{lang} {n}" for lang, n in row["answered_as"].items())
            note = f" ({report['backend']} does not know {label})" if not row["known"] else ""
            lines.append(f"{label:<8} {row['texts']:>6} {row['accuracy']:>9.1%}  {wrong}{note}")
        lines.append(
            f"{len(report['labels'])} languages, {report['texts']:,} texts ({report['backend']}): accuracy "
            f"{report['macro_accuracy']:.1%} per language (macro), {report['accuracy']:.1%} of all texts"
        )
        return "\n".join(lines)
    lines.append(f"{'language':<9} {'texts':>6} {'share':>7} {'mean score':>11}")
    for lang, row in list(report["languages"].items())[:top]:
        lines.append(f"{lang:<9} {row['texts']:>6} {row['share']:>7.1%} {row['mean_score']:>11.3f}")
    more = len(report["languages"]) - top
    tail = f" (+{more} more in --json)" if more > 0 else ""
    lines.append(
        f"{len(report['languages'])} languages in {report['texts']:,} texts ({report['backend']}){tail}"
    )
    return "\n".join(lines)
