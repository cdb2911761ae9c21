"""The quality classifier: training, determinism, the scoring step, the top-fraction cut, user errors,
and a real-data run (books and Wikipedia against raw web-page text)."""

import json
import math
import os
import pickle
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smelt.config import Config, DataConfig, QualityConfig, RunConfig, SourceConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.quality import (
    THRESHOLD_REASON,
    HashSpec,
    QualityModel,
    QualityScore,
    features,
    fit,
    roc_auc,
    top_fraction_cutoff,
    train_quality,
)
from smelt.data.steps import run_steps
from smelt.errors import ConfigError, UserError

GOOD_TEXT = (
    "the committee examined the evidence carefully and concluded that the river had shaped the valley "
    "over many centuries while historians recorded its influence on trade and settlement"
)
POOR_TEXT = "click here buy now free shipping login subscribe cookie menu share like follow home cart deals"
GOOD_WORDS, POOR_WORDS = GOOD_TEXT.split(), POOR_TEXT.split()


def synthetic(n: int, seed: int) -> tuple[list[str], list[str]]:
    """Two classes of 40-word documents; each word comes from the other class's vocabulary 20% of the
    time, so the problem is learnable but not trivial per word."""
    rng = random.Random(seed)

    def make(own: list[str], other: list[str]) -> str:
        return " ".join(rng.choice(other if rng.random() < 0.2 else own) for _ in range(40))

    return [make(GOOD_WORDS, POOR_WORDS) for _ in range(n)], [make(POOR_WORDS, GOOD_WORDS) for _ in range(n)]


def write_jsonl(path: Path, texts: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")


def make_config(root: Path, seed: int = 7, **quality) -> Config:
    sources = [
        SourceConfig(name=name, format="jsonl", root=str(root), include=[f"{name}.jsonl"])
        for name in ("good", "poor")
    ]
    defaults = {"positive_sources": ["good"], "negative_sources": ["poor"]}
    return Config(
        run=RunConfig(seed=seed),
        data=DataConfig(sources=sources, quality=QualityConfig(**{**defaults, **quality})),
    )


@pytest.fixture
def synthetic_root(tmp_path):
    good, poor = synthetic(150, 0)
    write_jsonl(tmp_path / "data" / "good.jsonl", good)
    write_jsonl(tmp_path / "data" / "poor.jsonl", poor)
    return tmp_path / "data"


# ---------------------------------------------------------------------------------------------
# training


def test_learns_a_two_class_problem_and_writes_model_and_json(synthetic_root, tmp_path):
    out = tmp_path / "quality" / "model.safetensors"
    metrics = train_quality(make_config(synthetic_root, buckets=1 << 16), out)
    assert metrics["holdout_accuracy"] >= 0.95 and metrics["holdout_auc"] >= 0.98
    assert metrics["docs_positive"] == metrics["docs_negative"] == 150
    assert metrics["holdout_positive"] == metrics["holdout_negative"] == 15
    info = json.loads(out.with_suffix(".json").read_text())
    assert info["positive_sources"] == ["good"] and info["negative_sources"] == ["poor"]
    assert info["metrics"] == metrics and info["hash_spec"]["buckets"] == 1 << 16
    import hashlib

    assert info["weights_sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    model = QualityModel.load(out)
    good, poor = synthetic(20, 99)  # fresh documents
    assert (model.score_many(good) > 0.5).mean() >= 0.9 and (model.score_many(poor) < 0.5).mean() >= 0.9


def test_same_seed_same_bytes_other_seed_other_bytes(synthetic_root, tmp_path):
    paths = [tmp_path / f"m{i}" / "model.safetensors" for i in range(3)]
    train_quality(make_config(synthetic_root, seed=3, buckets=1 << 14), paths[0])
    train_quality(make_config(synthetic_root, seed=3, buckets=1 << 14), paths[1])
    train_quality(make_config(synthetic_root, seed=4, buckets=1 << 14), paths[2])
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()


@pytest.mark.slow
def test_same_bytes_in_another_process_with_another_hash_seed(synthetic_root, tmp_path):
    """Nothing may depend on Python's per-process string hashing (set order, hash())."""
    script = (
        "import sys; from pathlib import Path; sys.path[:0] = [sys.argv[3]];"
        "from test_quality import make_config; from smelt.data.quality import train_quality;"
        "train_quality(make_config(Path(sys.argv[1]), buckets=1 << 14, char_ngrams=5), Path(sys.argv[2]))"
    )
    here = str(Path(__file__).parent)
    paths = [tmp_path / f"p{seed}.safetensors" for seed in (1, 2)]
    for seed, path in zip((1, 2), paths, strict=True):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        subprocess.run(
            [sys.executable, "-c", script, str(synthetic_root), str(path), here], env=env, check=True
        )
    in_process = tmp_path / "here.safetensors"
    train_quality(make_config(synthetic_root, buckets=1 << 14, char_ngrams=5), in_process)
    assert paths[0].read_bytes() == paths[1].read_bytes() == in_process.read_bytes()


def test_max_docs_samples_deterministically(synthetic_root, tmp_path):
    a = train_quality(make_config(synthetic_root, max_docs=40, buckets=1 << 12), tmp_path / "a.safetensors")
    train_quality(make_config(synthetic_root, max_docs=40, buckets=1 << 12), tmp_path / "b.safetensors")
    assert a["docs_positive"] == a["docs_negative"] == 40 and a["docs_seen_positive"] == 150
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_scores_identical_after_save_and_load(tmp_path):
    good, poor = synthetic(60, 1)
    spec = HashSpec(buckets=1 << 12, char_ngrams=4)
    rows = [features(t, spec) for t in good + poor]
    model = fit(rows, np.array([1.0] * 60 + [0.0] * 60), spec, seed=0)
    path = tmp_path / "m.safetensors"
    model.save(path)
    loaded = QualityModel.load(path)
    assert loaded.spec == spec and loaded.bias == model.bias
    texts = good[:5] + poor[:5] + ["", "a completely different text"]
    assert np.array_equal(model.score_many(texts), loaded.score_many(texts))
    assert model.score("") == pytest.approx(1 / (1 + math.exp(-model.bias)))


def test_features_are_stable_hashes():
    spec = HashSpec(buckets=1 << 20)
    ids = features("The cat sat. The cat", spec)
    assert ids.dtype == np.uint32 and len(ids) == 5 + 4  # 5 words, 4 bigrams, repeats kept
    assert ids[0] == ids[3] and ids[1] == ids[4]  # "the" and "cat" again; lowercased
    assert features("the  cat\nsat.", spec)[:3].tolist() == ids[:3].tolist()  # whitespace-insensitive
    # the hash is CRC-32, not Python's per-process salted hash: a fixed value across runs and machines
    assert int(features("hello", HashSpec(buckets=1 << 30, word_ngrams=1))[0]) == 0x3610A686 % (1 << 30)
    assert len(features("x " * 10_000, HashSpec(max_chars=100, word_ngrams=1))) == 50


def test_roc_auc():
    assert roc_auc(np.array([0.9, 0.8, 0.2, 0.1]), np.array([1, 1, 0, 0])) == 1.0
    assert roc_auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([1, 1, 0, 0])) == 0.0
    assert roc_auc(np.array([0.5, 0.5, 0.5, 0.5]), np.array([1, 0, 1, 0])) == 0.5
    assert roc_auc(np.array([0.9, 0.4, 0.6, 0.1]), np.array([1, 1, 0, 0])) == 0.75
    assert math.isnan(roc_auc(np.array([0.3, 0.4]), np.array([1, 1])))


# ---------------------------------------------------------------------------------------------
# the curation step


@pytest.fixture
def trained(tmp_path):
    good, poor = synthetic(80, 2)
    spec = HashSpec(buckets=1 << 12)
    model = fit([features(t, spec) for t in good + poor], np.array([1.0] * 80 + [0.0] * 80), spec, seed=0)
    path = tmp_path / "quality" / "model.safetensors"
    model.save(path)
    return path, model


def data_config(model: str, **quality) -> DataConfig:
    sources = [SourceConfig(name="web"), SourceConfig(name="books"), SourceConfig(name="code", code=True)]
    return DataConfig(sources=sources, quality=QualityConfig(model=model, **quality))


def doc(text: str, source: str = "web", id: str = "a") -> Doc:
    return Doc(source, 0, id, text, "f")


def test_step_scores_drops_below_threshold_and_skips_code(trained):
    path, model = trained
    step = QualityScore.from_config(data_config(str(path), threshold=0.5))
    assert step.sources == frozenset({"web", "books"})  # every non-code source by default
    good, poor = synthetic(3, 5)
    docs = [doc(good[0], id="g"), doc(poor[0], id="p"), doc(poor[1], "code", id="c")]
    ledger = Ledger()
    kept = list(run_steps([step], docs, ledger))
    assert [d.id for d in kept] == ["g", "c"]
    assert kept[0].meta["quality"] == round(model.score(good[0]), 4) and kept[0].meta["quality"] >= 0.5
    assert "quality" not in kept[1].meta  # code is not scored
    [entry] = ledger.entries
    assert entry["reason"] == THRESHOLD_REASON and entry["id"] == "p" and entry["step"] == "quality"
    assert entry["score"] == round(model.score(poor[0]), 4) < 0.5 and entry["threshold"] == 0.5


def test_step_threshold_zero_keeps_everything_and_sources_scope(trained):
    path, _ = trained
    step = QualityScore.from_config(data_config(str(path), sources=["books"]))
    assert step.sources == frozenset({"books"})
    good, poor = synthetic(2, 6)
    out = list(run_steps([step], [doc(poor[0], "books"), doc(poor[1], "web")], Ledger()))
    assert len(out) == 2 and "quality" in out[0].meta and "quality" not in out[1].meta
    assert 0.0 <= out[0].meta["quality"] <= 1.0 and out[0].meta["quality"] == round(out[0].meta["quality"], 4)


def test_step_pickles_without_the_weights_and_reloads_lazily(trained):
    path, model = trained
    step = QualityScore.from_config(data_config(str(path)))
    blob = pickle.dumps(step)
    assert len(blob) < 2_000  # the 16 KB of weights stay behind
    copy = pickle.loads(blob)
    assert copy._model is None
    text = synthetic(1, 8)[0][0]
    assert copy.apply(doc(text), Ledger()).meta["quality"] == round(model.score(text), 4)


def test_step_off_without_model_or_without_prose_sources(trained):
    path, _ = trained
    assert QualityScore.from_config(data_config("")) is None
    only_code = DataConfig(
        sources=[SourceConfig(name="c", code=True)], quality=QualityConfig(model=str(path))
    )
    assert QualityScore.from_config(only_code) is None


@pytest.mark.parametrize("content", [None, b"not a model at all", b"\x08\x00\x00\x00\x00\x00\x00\x00{}"])
def test_missing_or_corrupt_model_is_a_user_error(tmp_path, content):
    path = tmp_path / "model.safetensors"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserError) as err:
        QualityScore.from_config(data_config(str(path)))
    message = str(err.value)
    assert (
        "data.quality.model" in message and "smelt curate quality-train" in message and str(path) in message
    )


def test_foreign_safetensors_file_is_a_user_error(tmp_path):
    from safetensors.numpy import save_file

    path = tmp_path / "other.safetensors"
    save_file({"weight": np.zeros(4, dtype=np.float32)}, str(path))
    with pytest.raises(UserError, match="not a smelt quality model"):
        QualityModel.load(path)


def test_unknown_scored_source_is_a_config_error(trained):
    path, _ = trained
    with pytest.raises(ConfigError) as err:
        QualityScore.from_config(data_config(str(path), sources=["wiki"]))
    assert "data.quality.sources" in str(err.value) and "web, books, code" in str(err.value)


# ---------------------------------------------------------------------------------------------
# top fraction


def test_top_fraction_cutoff():
    scores = [0.1, 0.9, 0.5, 0.7, 0.3]
    assert top_fraction_cutoff(scores, 0.4) == 0.7  # ceil(0.4 * 5) = 2 documents: 0.9 and 0.7
    assert top_fraction_cutoff(scores, 0.5) == 0.5  # ceil(2.5) = 3
    assert top_fraction_cutoff(scores, 1.0) == -math.inf
    assert top_fraction_cutoff(scores, 0.0) == math.inf
    assert top_fraction_cutoff([], 0.5) == -math.inf
    assert top_fraction_cutoff([0.3] * 10, 0.3) == 0.3  # 0.3 * 10 is 3.0000000000000004: still 3
    ties = [0.8, 0.6, 0.6, 0.6, 0.2]
    cutoff = top_fraction_cutoff(ties, 0.4)
    assert cutoff == 0.6 and sum(s >= cutoff for s in ties) == 4  # ties at the boundary all stay
    assert top_fraction_cutoff(list(reversed(ties)), 0.4) == cutoff  # order does not matter
    with pytest.raises(ValueError):
        top_fraction_cutoff(scores, 1.5)


# ---------------------------------------------------------------------------------------------
# user errors in training


def test_empty_class_names_the_key_and_the_valid_sources(synthetic_root, tmp_path):
    with pytest.raises(ConfigError) as err:
        train_quality(make_config(synthetic_root, positive_sources=[]), tmp_path / "m.safetensors")
    assert "data.quality.positive_sources" in str(err.value) and "good, poor" in str(err.value)


def test_unknown_source_names_the_key_and_the_valid_sources(synthetic_root, tmp_path):
    with pytest.raises(ConfigError) as err:
        train_quality(
            make_config(synthetic_root, negative_sources=["poor", "spam"]), tmp_path / "m.safetensors"
        )
    message = str(err.value)
    assert "data.quality.negative_sources" in message and "'spam'" in message and "good, poor" in message


def test_source_in_both_classes_is_a_config_error(synthetic_root, tmp_path):
    with pytest.raises(
        ConfigError, match="positive_sources and data.quality.negative_sources both name good"
    ):
        train_quality(make_config(synthetic_root, negative_sources=["good"]), tmp_path / "m.safetensors")


def test_model_path_ending_in_json_is_a_user_error(synthetic_root, tmp_path):
    with pytest.raises(UserError, match=r"ends in \.json"):
        train_quality(make_config(synthetic_root), tmp_path / "model.json")


def test_char_ngrams_below_three_is_a_config_error(synthetic_root, tmp_path):
    with pytest.raises(ConfigError, match=r"data\.quality\.char_ngrams = 2"):
        train_quality(make_config(synthetic_root, char_ngrams=2), tmp_path / "m.safetensors")


def test_class_with_too_few_documents_is_a_user_error(tmp_path):
    write_jsonl(tmp_path / "good.jsonl", ["only one good document"])
    write_jsonl(tmp_path / "poor.jsonl", ["poor one", "poor two", "poor three"])
    with pytest.raises(UserError) as err:
        train_quality(make_config(tmp_path), tmp_path / "m.safetensors")
    assert "data.quality.positive_sources (good) gave 1" in str(err.value)
    assert not (tmp_path / "m.safetensors").exists()


# ---------------------------------------------------------------------------------------------
# real data


def blocks(text: str, size: int = 2000) -> list[str]:
    """Paragraphs joined into blocks of at least `size` characters (books become many documents)."""
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", text.replace("\r\n", "\n")) if p.strip()]
    out, current = [], ""
    for paragraph in paragraphs:
        current = f"{current}\n\n{paragraph}" if current else paragraph
        if len(current) >= size:
            out.append(current)
            current = ""
    return out


@pytest.mark.slow
def test_real_books_and_wikipedia_against_raw_web_pages(shared_data, tmp_path):
    """Positives: Gutenberg books (without the first and last tenth: licence boilerplate) in 2,000-
    character blocks, and WikiText paragraphs. Negatives: all visible text of half of the 181 news and
    blog pages of the extraction benchmark (navigation included, as a crawler without extraction sees
    them) in blocks, and 20 Common Crawl documents. Measured over seeds 0-4 with 300 per class:
    held-out AUC 1.0, accuracy 0.983-1.0, and on the other half of the pages (91) the page's clean
    article text (the benchmark's ground truth) outscores its raw text on 98.9-100% of them. The bars
    (0.97, 0.9, 0.9) leave room for another split."""
    corpus = shared_data / "corpus"
    positives = []
    for path in sorted((corpus / "prose" / "gutenberg").glob("*.txt")):
        book = blocks(path.read_bytes().decode("utf-8-sig"))
        positives += book[len(book) // 10 : len(book) - len(book) // 10]
    wiki = (corpus / "prose" / "wikitext-2-raw" / "wiki.test.raw").read_text(encoding="utf-8")
    positives += [line.strip() for line in wiki.splitlines() if len(line.strip()) >= 500]
    bench = corpus / "web" / "article-extraction-benchmark"
    raw = json.loads((bench / "output" / "html-text.json").read_text(encoding="utf-8"))["output"]
    pages = sorted(raw)
    train_pages, test_pages = pages[: len(pages) // 2], pages[len(pages) // 2 :]
    negatives = [b for page in train_pages for b in blocks(raw[page]["articleBody"])]
    for path in sorted((corpus / "web" / "dolma-cc-sample").glob("*.jsonl")):
        negatives += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]
    write_jsonl(tmp_path / "data" / "good.jsonl", positives)
    write_jsonl(tmp_path / "data" / "poor.jsonl", negatives)

    out = tmp_path / "model.safetensors"
    metrics = train_quality(make_config(tmp_path / "data", seed=0, max_docs=300), out)
    assert metrics["docs_positive"] == 300 and metrics["docs_negative"] == 300
    assert metrics["holdout_auc"] >= 0.97 and metrics["holdout_accuracy"] >= 0.9

    model = QualityModel.load(out)
    truth = json.loads((bench / "ground-truth.json").read_text(encoding="utf-8"))
    wins = [model.score(truth[p]["articleBody"]) > model.score(raw[p]["articleBody"]) for p in test_pages]
    assert np.mean(wins) >= 0.9
