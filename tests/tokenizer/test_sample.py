"""The tokenizer's training sample: every source (and language) drawn within 10% of its target."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.config import TokenizerConfig
from smelt.report.data_sections import tokenizer_section
from smelt.report.run import Run
from smelt.tokenizer.sample import Sample, Weighting, sample_texts
from smelt.tokenizer.train import train_tokenizer


def write_part(root: Path, source: str, docs: list[tuple[str, str | None]], part: int = 0) -> None:
    """One documents part; `lang` None or "" is a document without a language label."""
    directory = root / "train" / source
    directory.mkdir(parents=True, exist_ok=True)
    n = len(docs)
    table = pa.table(
        {
            "id": [f"{source}:{part}:{i}" for i in range(n)],
            "text": [text for text, _ in docs],
            "source": [source] * n,
            "url": [""] * n,
            "lang": pa.array([lang for _, lang in docs], type=pa.string()),
            "meta": ["{}"] * n,
        }
    )
    pq.write_table(table, directory / f"part-{part:05d}.parquet", row_group_size=50)


def docs(prefix: str, lang: str | None, n: int, words: int = 30) -> list[tuple[str, str | None]]:
    """n documents of varied length (words .. 2 x words), distinct from every other call's."""
    return [(" ".join(f"{prefix}{i}w{k}" for k in range(words + i % words)), lang) for i in range(n)]


def mixed_corpus(root: Path) -> None:
    """Prose labelled en/fr, web labelled in one part and unlabelled in another, code with no labels."""
    write_part(root, "prose", docs("p", "en", 300) + docs("q", "fr", 60))
    write_part(root, "web", docs("w", "en", 200) + docs("x", "de", 40) + docs("y", "", 30))
    write_part(root, "web", docs("z", None, 80), part=1)
    write_part(root, "code", docs("c", None, 400, words=20))


def draw(root: Path, budget: int, weighting: Weighting) -> tuple[Sample, list[str]]:
    sample = Sample()
    texts = [
        t for batch in sample_texts(root, "train", budget, 0, sample, weighting=weighting) for t in batch
    ]
    assert sample.bytes == sum(len(t.encode()) for t in texts) <= budget
    return sample, texts


def assert_within(sample: Sample, tolerance: float = 0.1) -> None:
    for unit, row in sample.units.items():
        assert row["target"] > 0, unit
        assert abs(row["drawn"] - row["target"]) <= tolerance * row["target"], (unit, row)
    assert sample.short_units() == []


def test_a_split_that_fits_the_budget_is_drawn_whole_with_language_labels(tmp_path):
    """lang_alpha != 1 with a corpus below sample_bytes: labelled sources used to be drawn 0 bytes."""
    mixed_corpus(tmp_path)
    whole = sum(
        len(t.encode())
        for part in tmp_path.rglob("*.parquet")
        for t in pq.read_table(part)["text"].to_pylist()
    )
    sample, texts = draw(tmp_path, 10 * whole, Weighting(lang_alpha=0.3))
    assert sample.bytes == whole and len(texts) == 300 + 60 + 200 + 40 + 30 + 80 + 400
    for unit in ("prose", "web", "code", "prose/en", "prose/fr", "web/en", "web/de", "web/und"):
        row = sample.units[unit]
        assert row["drawn"] == row["target"] == row["size"] > 0, (unit, row)
    assert sample.units["web/und"]["drawn"] == sum(
        len(t.encode()) for t, _ in docs("y", "", 30) + docs("z", None, 80)
    )


@pytest.mark.parametrize("lang_alpha", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("budget", [50_000, 100_000, 200_000])
@pytest.mark.slow
def test_every_source_and_language_drawn_within_ten_percent(tmp_path, lang_alpha, budget):
    mixed_corpus(tmp_path)
    sample, _ = draw(tmp_path, budget, Weighting(lang_alpha=lang_alpha))
    assert_within(sample)
    assert set(sample.units) >= {"prose", "web", "code"}
    assert ("web/und" in sample.units) == (lang_alpha != 1.0)
    assert sum(sample.units[s]["drawn"] for s in ("prose", "web", "code")) == sample.bytes
    assert sample.bytes >= 0.9 * budget


def test_a_weight_of_zero_drops_a_source_even_when_everything_fits(tmp_path):
    mixed_corpus(tmp_path)
    sample, texts = draw(
        tmp_path, 10**9, Weighting(source_weights=(("code", 0.0),), lang_weights=(("fr", 0.0),))
    )
    assert sample.units["code"]["drawn"] == sample.units["code"]["target"] == 0
    assert sample.units["prose/fr"]["drawn"] == 0
    assert (
        sample.units["prose"]["drawn"] == sample.units["prose"]["target"] == sample.units["prose/en"]["size"]
    )
    assert not any(t.startswith(("c0w", "q0w")) for t in texts)


def test_the_sample_is_seeded(tmp_path):
    mixed_corpus(tmp_path)
    runs = []
    for seed in (0, 0, 1):
        sample = Sample()
        runs.append(
            [
                t
                for b in sample_texts(
                    tmp_path, "train", 30_000, seed, sample, weighting=Weighting(lang_alpha=0.3)
                )
                for t in b
            ]
        )
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_tokenizer_records_and_the_report_shows_target_and_drawn_per_source(tmp_path):
    documents = tmp_path / "run" / "documents"
    mixed_corpus(documents)
    tokenizer_dir = tmp_path / "run" / "tokenizer"
    cfg = TokenizerConfig(vocab_size=512, sample_bytes=40_000, min_frequency=1)  # lang_alpha 0.3
    train_tokenizer(cfg, documents, tokenizer_dir, seed=0)
    units = json.loads((tokenizer_dir / "smelt.json").read_text())["sample_units"]
    for source in ("prose", "web", "code"):
        assert abs(units[source]["drawn"] - units[source]["target"]) <= 0.1 * units[source]["target"]
    html = tokenizer_section(Run(tmp_path / "run", tmp_path / "run" / "metrics.jsonl", []))
    assert "Training sample per source" in html and "every source drawn within 10% of its target" in html
    assert f'<td>web/und</td><td class="num">{units["web/und"]["size"]:,}</td>' in html
    assert f'<td class="num">{units["code"]["drawn"]:,}</td>' in html


def test_the_report_flags_a_source_drawn_short(tmp_path):
    info = {
        "sample_units": {
            "prose": {"size": 900, "target": 500, "drawn": 0},
            "code": {"size": 10, "target": 10, "drawn": 10},
        }
    }
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "smelt.json").write_text(json.dumps(info))
    html = tokenizer_section(Run(tmp_path, tmp_path / "metrics.jsonl", []))
    assert '<tr class="diff"><td>prose</td>' in html
    assert "drawn more than 10% below target: prose." in html


def test_a_source_of_a_few_long_documents_is_drawn_in_pieces_close_to_its_target(tmp_path):
    """Five 64 kB books get a 94 kB target: whole documents could only give 64 or 128 kB."""
    books = [
        ("\n".join(f"Book {b} line {i} of the long story." for i in range(1800)), None) for b in range(5)
    ]
    write_part(tmp_path, "books", books)
    write_part(tmp_path, "notes", docs("n", None, 800, words=10))
    sample, texts = draw(tmp_path, 120_000, Weighting())
    assert_within(sample)
    assert abs(sample.units["books"]["drawn"] - sample.units["books"]["target"]) < 0.05 * 94_000
    whole = [text for text, _ in books]
    pieces = [t for t in texts if t.startswith("Book")]
    assert len(pieces) > 5 and all(any(piece in book for book in whole) for piece in pieces)
    assert all(piece.endswith("\n") or any(book.endswith(piece) for book in whole) for piece in pieces)
