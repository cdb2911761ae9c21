"""Rules that hold only in some languages are skipped for the others, and the skip is recorded: the
stop-word rule (an English list) for documents in other languages, rules over whitespace words for
languages written without spaces between words. On real text from the shared data set."""

from __future__ import annotations

import json
from collections import Counter

import pyarrow.parquet as pq
import pytest

from smelt.config import FineWebConfig, GopherQualityConfig, GopherRepetitionConfig
from smelt.data.curate import curate
from smelt.data.filters import FineWebFilter, GopherQuality, GopherRepetition
from smelt.data.filters.languages import SPACED, STOP_WORD_LIST, STOP_WORDS, rule_holds
from smelt.data.ledger import Doc, Ledger

LANGS = ("de", "fr", "it", "ja", "zh", "en")


@pytest.fixture(scope="module")
def sentences(shared_data) -> dict[str, list[str]]:
    root = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    return {lang: (root / f"{lang}.txt").read_text(encoding="utf-8").splitlines() for lang in LANGS}


def _run(step, text: str, lang: str | None) -> tuple[Doc | None, Ledger]:
    ledger = Ledger()
    ledger.step = step.name
    doc = Doc("web", 0, "d", text, "f.txt", meta={"lang": lang} if lang else {})
    return step.apply(doc, ledger), ledger


def test_rule_requirements():
    assert rule_holds(STOP_WORD_LIST, "en") and not rule_holds(STOP_WORD_LIST, "de")
    assert not rule_holds(STOP_WORD_LIST, "und") and rule_holds(STOP_WORD_LIST, None)
    assert rule_holds(SPACED, "de") and rule_holds(SPACED, "ko") and not rule_holds(SPACED, "ja")
    assert not rule_holds(SPACED, "zh") and not rule_holds(SPACED, "th") and rule_holds(SPACED, "")
    assert set(STOP_WORDS) == {"en"}


@pytest.mark.parametrize("lang", ["fr", "it"])
def test_stop_words_are_an_english_rule(sentences, lang):
    text = " ".join(sentences[lang][:20])
    step = GopherQuality(GopherQualityConfig())
    out, ledger = _run(step, text, lang)
    assert out is not None and out.meta["gopher_quality"]["skipped"] == ["min_stop_words"]
    assert out.meta["gopher_quality"]["stop_words"] < 2  # the English list finds next to nothing
    assert ledger.notes == Counter(
        {
            ("web", "gopher_quality.min_stop_words.skipped"): 1,
            ("web", f"gopher_quality.min_stop_words.skipped.{lang}"): 1,
        }
    )
    # the same text labelled English, or with no language at all (language id off), runs the rule
    for label in ("en", None):
        out, ledger = _run(step, text, label)
        assert out is None and ledger.entries[0]["reason"] == "gopher_quality.min_stop_words"
        assert "skipped" not in ledger.entries[0] and not ledger.notes


def test_an_english_document_without_stop_words_is_still_dropped(sentences):
    out, ledger = _run(
        GopherQuality(GopherQualityConfig(min_stop_words=200)), " ".join(sentences["en"][:20]), "en"
    )
    assert out is None and ledger.entries[0]["reason"] == "gopher_quality.min_stop_words"


@pytest.mark.parametrize("lang", ["ja", "zh"])
def test_word_rules_skip_languages_without_spaces(sentences, lang):
    text = "\n".join(sentences[lang][:30])
    step = GopherQuality(GopherQualityConfig())
    out, _ = _run(step, text, None)
    assert out is None  # a whitespace "word" is a sentence: too few words, too long
    out, ledger = _run(step, text, lang)
    assert out is not None
    skipped = ["max_mean_word_length", "max_words", "min_mean_word_length", "min_stop_words", "min_words"]
    assert out.meta["gopher_quality"]["skipped"] == skipped
    assert ledger.notes[("web", f"gopher_quality.min_words.skipped.{lang}")] == 1
    # rules that do not count words still run: a page of bullets is dropped in any language
    bullets = "\n".join("• " + line for line in sentences[lang][:30])
    out, ledger = _run(step, bullets, lang)
    assert out is None and ledger.entries[0]["reason"] == "gopher_quality.max_bullet_lines_ratio"


def _reason(step, text: str, lang: str | None) -> str | None:
    out, ledger = _run(step, text, lang)
    return None if out is not None else ledger.entries[0]["reason"]


def test_top_ngram_and_lines_per_word_rules_skip_languages_without_spaces(sentences):
    """Chinese sentences with a few spaces (around Latin words) look like 2-grams of whole phrases."""
    repetition = GopherRepetition(GopherRepetitionConfig())
    fineweb = FineWebFilter(FineWebConfig(min_line_punct_ratio=0.0, max_short_line_ratio=1.0))
    chunks = ["\n".join(sentences["zh"][i : i + 5]) for i in range(0, 500, 5)]
    for step, rule in ((repetition, "max_top_2gram_char_ratio"), (fineweb, "max_newline_word_ratio")):
        dropped = [c for c in chunks if _reason(step, c, None) == f"{step.name}.{rule}"]
        assert len(dropped) >= 10
        assert all(_reason(step, c, "zh") is None for c in dropped)
        assert all(_reason(step, c, "ja") is None for c in dropped)  # the same script rule
    # a repeated line is repetition in any script
    repeated = "\n".join([sentences["zh"][0]] * 4 + sentences["zh"][1:3])
    assert _reason(repetition, repeated, "zh") == "gopher_repetition.max_dup_line_ratio"


def test_default_filters_keep_german_web_pages(shared_data, tmp_path, source, config):
    """The shared trafilatura pages under the default filters: the German ones were dropped by the
    English stop-word rule (65 of 70 before the rule went per language)."""
    root = shared_data / "corpus" / "web" / "trafilatura-eval" / "html"
    cfg = config(source("web", root, format="html", include=["*.html"], filters=["auto"]), min_chars=64)
    stats = curate(cfg, tmp_path / "out")
    rows = [
        r
        for p in sorted((tmp_path / "out").glob("*/web/part-*.parquet"))
        for r in pq.read_table(p).to_pylist()
    ]
    kept = Counter(json.loads(r["meta"])["lang"] for r in rows)
    dropped = stats["sources"]["web"]["dropped"]
    notes = stats["sources"]["web"]["notes"]
    assert kept["de"] >= 50 and kept["en"] >= 15
    assert notes["gopher_quality.min_stop_words.skipped.de"] >= kept["de"]
    assert "gopher_quality.min_stop_words.skipped.en" not in notes
    assert notes["gopher_quality.min_stop_words.skipped"] == sum(
        n for key, n in notes.items() if key.startswith("gopher_quality.min_stop_words.skipped.")
    )
    assert dropped.get("gopher_quality.min_stop_words", 0) == 0  # the English pages all have stop words
