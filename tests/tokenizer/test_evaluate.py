"""Tokenizer evaluation: word segmentation, fertility, the language-temperature acceptance check."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.config import TokenizerConfig
from smelt.errors import UserError
from smelt.tokenizer.evaluate import (
    bytes_per_token_svg,
    document_groups,
    evaluate_texts,
    evaluate_tokenizers,
    split_words,
)
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.sample import Sample, Weighting, sample_texts
from smelt.tokenizer.train import train_tokenizer

LANGS = ("zh", "ar", "ru", "hi", "th", "ja")


def write_lang_documents(
    root: Path, split: str, source: str, docs: list[tuple[str, str | None]], part: int = 0
):
    directory = root / split / source
    directory.mkdir(parents=True, exist_ok=True)
    n = len(docs)
    table = pa.table(
        {
            "id": [f"{source}:{part}:{i}" for i in range(n)],
            "text": [t for t, _ in docs],
            "source": [source] * n,
            "url": [""] * n,
            "lang": pa.array([lang for _, lang in docs], type=pa.string()),
            "meta": ["{}"] * n,
        }
    )
    pq.write_table(table, directory / f"part-{part:05d}.parquet")


def test_split_words_handles_scripts_without_spaces():
    def words(text):
        return [text[a:b] for a, b in split_words(text)]

    assert words("Hello, wörld! it's 42") == ["Hello", "wörld", "it", "s", "42"]
    assert words("東京は日本") == ["東", "京", "は", "日", "本"]
    assert words("abc中文def") == ["abc", "中", "文", "def"]
    assert words("สวัสดี") == list("สวัสดี")
    assert words("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # vowel signs and virama stay inside the word
    assert words("مرحبا بالعالم") == ["مرحبا", "بالعالم"]
    assert words("  \t\n") == []


@pytest.mark.slow
def test_evaluate_texts_figures(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    result = evaluate_texts(
        tok, {"en": ["the the the", "unbelievably antidisestablishmentarianism"], "zh": ["中文"]}
    )
    en = result["groups"]["en"]
    assert en["words"] == 5 and en["bytes"] == len("the the theunbelievably antidisestablishmentarianism")
    assert en["tokens"] == len(tok.encode("the the the")) + len(
        tok.encode("unbelievably antidisestablishmentarianism")
    )
    # every token here lies inside a word (spaces ride on the next word), so fertility = tokens / words
    assert en["fertility"] == pytest.approx(en["tokens"] / 5, abs=1e-4)
    single = sum(
        len(tok.encode(w)) == 1
        for w in ("the", " the", " the", "unbelievably", " antidisestablishmentarianism")
    )
    assert en["continued_word_rate"] == pytest.approx(1 - single / 5)
    punct = evaluate_texts(tok, {"x": ["a, b; c!"]})["groups"]["x"]
    assert punct["words"] == 3 and punct["fertility"] == pytest.approx(1.0)  # punctuation is not in any word
    assert result["groups"]["zh"]["words"] == 2
    assert result["never_produced"] > 0 and len(result["never_produced_examples"]) == 20
    assert result["longest_tokens"][0]["bytes"] >= result["longest_tokens"][-1]["bytes"] > 1
    assert result["bytes_per_token_max_min_ratio"] >= 1.0


@pytest.mark.slow
def test_evaluate_tokenizers_writes_table_json_and_svg(tmp_path, real_tokenizer, real_documents):
    groups = document_groups(real_documents, "val", max_bytes_per_group=50_000)
    assert set(groups) == {"prose", "code", "multi"}
    assert all(sum(len(t.encode()) for t in texts) <= 50_000 for texts in groups.values())
    report = evaluate_tokenizers({"a": real_tokenizer[0], "b": real_tokenizer[0]}, groups, tmp_path / "eval")
    assert "| a | prose |" in report["table"] and "| b | multi |" in report["table"]
    saved = json.loads((tmp_path / "eval" / "tokenizer_eval.json").read_text())
    assert saved["results"]["a"]["groups"] == saved["results"]["b"]["groups"]
    svg = (tmp_path / "eval" / "tokenizer_eval.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") == 1 + 3 * 2 + 2 and "prose" in svg
    with pytest.raises(UserError, match="no documents to evaluate"):
        document_groups(tmp_path, "val")
    assert bytes_per_token_svg({}).startswith("<svg")


def test_weighting_shares_the_budget_by_temperature(tmp_path):
    docs = tmp_path / "docs"
    web = [(f"a{i:05d}" + "a" * 94, "en") for i in range(900)] + [
        (f"b{i:05d}" + "b" * 94, "fr") for i in range(100)
    ]
    write_lang_documents(docs, "train", "web", web)
    write_lang_documents(docs, "train", "books", [(f"c{i:05d}" + "c" * 94, None) for i in range(1000)])

    def drawn(alpha):
        sample = Sample()
        texts = [t for b in sample_texts(docs, "train", 40_000, 0, sample, weighting=alpha) for t in b]
        counts = {k: sum(t[0] == k for t in texts) for k in "abc"}
        return counts, sample

    flat, sample = drawn(Weighting(lang_alpha=0.0))
    assert sample.units["web/fr"]["target"] == pytest.approx(sample.units["web/en"]["target"])  # uniform
    proportional, _ = drawn(Weighting(lang_alpha=1.0))
    assert proportional["b"] < flat["b"] and proportional["a"] > flat["a"]
    assert 150 < proportional["c"] < 250  # books keeps half the budget either way (source_alpha = 1)
    weighted, _ = drawn(Weighting(source_weights=(("books", 0.0),)))
    assert weighted["c"] == 0
    with pytest.raises(UserError, match=r"tokenizer.lang_weights.fr = -1: a weight must be a number >= 0"):
        Weighting.from_config(TokenizerConfig(lang_weights={"fr": -1}))


def _multilingual(shared_data: Path) -> tuple[list[tuple[str, str | None]], dict[str, list[str]]]:
    """English dominates the train split (Shakespeare + English sentences); six other languages are small."""
    corpus = shared_data / "corpus"
    prose = (corpus / "prose" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    train = [(prose[i : i + 2000], "en") for i in range(0, 300_000, 2000)]
    held: dict[str, list[str]] = {}
    for lang in ("en", *LANGS):
        path = corpus / "multilingual" / "lingua-testdata-A" / "sentences" / f"{lang}.txt"
        lines = path.read_text(encoding="utf-8").splitlines()
        train += [("\n".join(lines[i : i + 5]), lang) for i in range(0, 100, 5)]
        held[lang] = ["\n".join(lines[i : i + 5]) for i in range(200, 300, 5)]
    return train, held


@pytest.mark.slow
def test_language_temperature_evens_out_bytes_per_token(tmp_path, shared_data):
    """Acceptance: alpha 0.3 gives a smaller max/min bytes-per-token ratio across languages than alpha 1.0."""
    train, held = _multilingual(shared_data)
    docs = tmp_path / "docs"
    write_lang_documents(docs, "train", "web", train)
    tokenizers = {}
    for alpha in (0.3, 1.0):
        cfg = TokenizerConfig(vocab_size=1024, sample_bytes=100_000, lang_alpha=alpha)
        train_tokenizer(cfg, docs, tmp_path / f"alpha_{alpha}", seed=0)
        tokenizers[f"alpha {alpha}"] = tmp_path / f"alpha_{alpha}"
        info = json.loads((tmp_path / f"alpha_{alpha}" / "smelt.json").read_text())
        assert info["sample_weighting"]["lang_alpha"] == alpha and ("web/zh" in info["sample_units"]) == (
            alpha < 1
        )
    report = evaluate_tokenizers(tokenizers, held, tmp_path / "eval")
    low, high = report["results"]["alpha 0.3"], report["results"]["alpha 1.0"]
    assert low["bytes_per_token_max_min_ratio"] < high["bytes_per_token_max_min_ratio"], report["table"]
    # the small languages gain, English pays a little
    assert low["groups"]["th"]["bytes_per_token"] > high["groups"]["th"]["bytes_per_token"]
    assert low["groups"]["en"]["bytes_per_token"] <= high["groups"]["en"]["bytes_per_token"]
    print(report["table"])


def test_train_and_evaluate_across_vocab_sizes(tmp_path, synthetic_documents):
    from smelt.tokenizer.evaluate import train_and_evaluate

    cfg = TokenizerConfig(sample_bytes=10_000, min_frequency=1)
    report = train_and_evaluate(cfg, synthetic_documents, tmp_path / "sweep", seed=0, vocab_sizes=[384, 512])
    assert list(report["results"]) == ["vocab 384", "vocab 512"]
    small, large = report["results"]["vocab 384"], report["results"]["vocab 512"]
    assert (small["vocab_size"], large["vocab_size"]) == (384, 512)
    assert large["total"]["bytes_per_token"] >= small["total"]["bytes_per_token"]
    assert (tmp_path / "sweep" / "vocab_512" / "tokenizer.json").is_file()
    assert (tmp_path / "sweep" / "tokenizer_eval.svg").is_file()
    assert "| vocab 384 | mixed |" in (tmp_path / "sweep" / "tokenizer_eval.md").read_text()
