"""Language identification: model answers on real multilingual text, sampling of long documents,
keep-lists and thresholds per source, and config errors."""

import math

import pytest

from smelt.config import DataConfig, LangIdConfig, SourceConfig
from smelt.data.langid import UNDETERMINED, WINDOWS, LanguageId, identify, sample_text
from smelt.data.ledger import Doc, Ledger

LANGS = ("en", "de", "fr", "es", "ru", "zh", "ar", "hi", "ja", "pt", "it", "nl", "pl", "tr", "ko")


@pytest.fixture(scope="module")
def sentences(shared_data):
    root = shared_data / "corpus" / "multilingual" / "lingua-testdata-A" / "sentences"
    return {
        lang: [s for s in (root / f"{lang}.txt").read_text(encoding="utf-8").splitlines() if s.strip()]
        for lang in (*LANGS, "nb")
    }


def doc(text, source="web"):
    return Doc(source, 0, "d", text, "f")


def test_documents_of_real_sentences_are_identified(sentences):
    """Documents of 10 sentences from the lingua test set (Leipzig corpora), 15 languages in 8 scripts."""
    right = total = 0
    for lang in LANGS:
        for k in range(0, 100, 10):
            got, score = identify(" ".join(sentences[lang][k : k + 10]))
            right += got == lang
            total += 1
            assert 0.0 <= score <= 1.0
    assert right / total >= 0.97


def test_a_header_and_footer_in_another_language_do_not_decide(sentences):
    header = "The Project Gutenberg eBook, produced by volunteers. " * 30  # ~1,600 characters of English
    body = " ".join(sentences["de"][:200])
    text = header + body + header
    assert len(body) > 10 * len(header)
    assert identify(text)[0] == "de"
    assert identify(text[:1000])[0] == "en"


def test_sample_text_bounds_long_documents():
    assert sample_text("short text", 1000) == "short text"
    text = "".join(f"{i:06d}" for i in range(20_000))  # 120,000 characters, every window unique
    sample = sample_text(text, 1000)
    assert len(sample) == 1000 + WINDOWS - 1  # windows joined by spaces
    windows = sample.split(" ")
    assert len(windows) == WINDOWS and all(len(w) == 1000 // WINDOWS for w in windows)
    assert [text.index(w) for w in windows] == [15_000 - 125, 45_000 - 125, 75_000 - 125, 105_000 - 125]


def test_text_without_letters_is_undetermined():
    assert identify("") == (UNDETERMINED, 0.0)
    assert identify("12 345 -- 6.7 %") == (UNDETERMINED, 0.0)


def test_annotates_every_language_when_no_keep_list(sentences):
    step = LanguageId.from_config(DataConfig(sources=[SourceConfig(name="web")]))
    ledger = Ledger()
    out = step.apply(doc(" ".join(sentences["fr"][:5])), ledger)
    assert out.meta["lang"] == "fr" and 0.65 < out.meta["lang_score"] <= 1.0
    assert round(out.meta["lang_score"], 4) == out.meta["lang_score"] and not ledger.entries


def test_keep_list_drops_other_languages_with_reason_language(sentences):
    cfg = DataConfig(sources=[SourceConfig(name="web", languages=["en", "DE"])])
    step = LanguageId.from_config(cfg)
    ledger = Ledger()
    ledger.step = step.name
    assert step.apply(doc(" ".join(sentences["de"][:5])), ledger) is not None
    assert step.apply(doc(" ".join(sentences["ru"][:5])), ledger) is None
    entry = ledger.entries[0]
    assert entry["reason"] == "language" and entry["lang"] == "ru" and entry["lang_score"] > 0.9
    assert entry["step"] == "language_id"


def test_threshold_boundary_keeps_at_the_score_and_drops_just_above(sentences):
    text = sentences["nl"][3]
    lang, score = identify(text)
    assert lang == "nl"
    at = LanguageId({"web": (frozenset({"nl"}), score)}, frozenset({"web"}))
    above = LanguageId({"web": (frozenset({"nl"}), math.nextafter(score, 1.0))}, frozenset({"web"}))
    assert at.apply(doc(text), Ledger()) is not None
    ledger = Ledger()
    assert above.apply(doc(text), ledger) is None and ledger.entries[0]["reason"] == "language"


def test_norwegian_alias(sentences):
    step = LanguageId.from_config(DataConfig(sources=[SourceConfig(name="web", languages=["nb"])]))
    assert step.keep["web"][0] == {"no"}
    assert step.apply(doc(" ".join(sentences["nb"][:10])), Ledger()) is not None


def test_code_sources_are_skipped_and_the_step_can_be_off():
    cfg = DataConfig(sources=[SourceConfig(name="web"), SourceConfig(name="py", code=True)])
    step = LanguageId.from_config(cfg)
    assert step.sources == {"web"}
    kept = list(step.run([doc("def f(x):\n    return x\n", source="py")], Ledger()))
    assert "lang" not in kept[0].meta
    assert LanguageId.from_config(DataConfig(sources=[SourceConfig(name="py", code=True)])) is None
    off = DataConfig(sources=[SourceConfig(name="web")], langid=LangIdConfig(enabled=False))
    assert LanguageId.from_config(off) is None


def test_unknown_language_code_names_the_key():
    from smelt.errors import ConfigError

    cfg = DataConfig(sources=[SourceConfig(name="a"), SourceConfig(name="b", languages=["en", "english"])])
    with pytest.raises(ConfigError) as err:
        LanguageId.from_config(cfg)
    message = str(err.value)
    assert "data.sources[1].languages" in message and "'english'" in message and " en," in message
