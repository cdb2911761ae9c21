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

Meta: `lang` is the backend's code. py3langid: ISO 639-1 where one exists (Norwegian is `no`; a
keep-list may say `nb`), ISO 639-3 for the rest (e.g. `ary`, `ace`). lingua: ISO 639-1 for all its 75
languages (Norwegian is `nb` or `nn`). `und` with score 0 for text without letters. `lang_score` is the
probability of that language, 0..1, rounded to 4 digits (lingua: its relative confidence value).
"""

from __future__ import annotations

import difflib
import re
from functools import cache
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
