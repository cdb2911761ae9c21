"""Long files of a text tree (books) become documents of about `part_chars` characters, not one
document that Gopher's max_words drops whole."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from smelt.config import SourceConfig
from smelt.data.curate import curate
from smelt.data.ingest.readers import ReadSpec, cut_points


def paragraphs(n: int, words: int = 60) -> str:
    """n paragraphs of English-like prose, separated by blank lines."""
    sentence = "The old man walked to the harbour and looked at the boats that came in with the tide. "
    return "\n\n".join(f"Chapter {i}. " + sentence * (words // 16) for i in range(n)) + "\n"


def read_docs(out):
    rows = []
    for path in sorted(out.glob("*/*/part-*.parquet")):
        rows += [(path.parent.parent.name, r) for r in pq.read_table(path).to_pylist()]
    return rows


def test_cuts_fall_on_paragraph_breaks_and_the_parts_join_to_the_text():
    text = paragraphs(400)
    cuts = cut_points(text, 20_000)
    parts = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert "".join(parts) == text and len(parts) == -(-len(text) // 20_000)
    assert all(text[c - 2 : c] == "\n\n" and text[c : c + 8] == "Chapter " for c in cuts)
    assert all(0.75 * len(text) / len(parts) <= len(p) <= 1.25 * len(text) / len(parts) for p in parts)
    assert cut_points(text, len(text)) == [] and cut_points(text, 0) == []


def test_cuts_fall_back_to_line_breaks_then_spaces():
    lines = "".join(f"line {i} of a poem without stanzas\r\n" for i in range(3000))
    cuts = cut_points(lines, 10_000)
    assert cuts and all(lines[c - 2 : c] == "\r\n" and lines[c:].startswith("line ") for c in cuts)
    one_line = " ".join(["word"] * 10_000)
    cuts = cut_points(one_line, 9_000)
    assert len(cuts) == 5 and all(one_line[c - 1] == " " and one_line[c] == "w" for c in cuts)
    assert cut_points("x" * 100, 30) == [25, 50, 75]  # no break at all: cut where the parts are even


def test_a_book_becomes_parts_with_ids_lines_and_one_split(tmp_path, write, source, config):
    book = paragraphs(300)  # 81,789 characters: 5 parts
    n = -(-len(book) // 20_000)
    books = write(tmp_path / "books", {"austen.txt": book, "short.txt": paragraphs(3)})
    code = write(tmp_path / "code", {"big.py": "x = 1\n\n" * 30_000})
    cfg = config(
        source("books", books, include=["*.txt"], part_chars=20_000),
        source("code", code, include=["*.py"], code=True, part_chars=20_000),
        val_fraction=0.5,
        max_chars=10**6,
    )
    stats = curate(cfg, tmp_path / "out")
    docs = read_docs(tmp_path / "out")
    parts = [r for _, r in docs if r["source"] == "books" and r["id"].startswith("austen.txt#part")]
    assert n == 5 and [r["id"] for r in parts] == [f"austen.txt#part{i:04d}" for i in range(n)]
    assert len({split for split, r in docs if r["id"].startswith("austen.txt")}) == 1  # a book is one unit
    assert {r["id"] for _, r in docs} >= {"short.txt", "big.py"}  # short files and code stay whole
    lines = [json.loads(r["meta"])["line"] for r in parts]
    assert lines[0] == 1 and lines == sorted(lines) and len(set(lines)) == n
    assert parts[1]["text"].startswith("Chapter ")
    assert (
        stats["sources"]["books"]["documents_in"] == n + 1
        and stats["sources"]["books"]["documents_kept"] == n + 1
    )
    # no source lost text; the code source, one file at val_fraction 0.5, went wholly to validation
    assert [w.get("source") for w in stats["warnings"]] == ["code"]
    assert stats["warnings"][0]["kind"] == "no_train"


def test_part_chars_zero_keeps_one_document_per_file(tmp_path, write, source, config):
    books = write(tmp_path / "books", {"austen.txt": paragraphs(300)})
    cfg = config(source("books", books, include=["*.txt"], part_chars=0), max_chars=10**6)
    curate(cfg, tmp_path / "out")
    assert [r["id"] for _, r in read_docs(tmp_path / "out")] == ["austen.txt"]


def test_text_sources_split_long_files_by_default():
    spec = ReadSpec.of(SourceConfig(name="books", format="text"), 0, tmp_root := "/books")
    assert spec.part_chars == 200_000 and spec.split_unit == "file" and spec.root == tmp_root
    assert ReadSpec.of(SourceConfig(name="code", format="text", code=True), 0, "/c").part_chars == 0
    assert ReadSpec.of(SourceConfig(name="web", format="jsonl"), 0, "/w").part_chars == 0
    unit = ReadSpec.of(SourceConfig(name="books", split_unit="dir"), 0, "/b").split_unit
    assert unit == "dir"


@pytest.mark.parametrize("name", ["2701-0.txt", "1342-0.txt"])
@pytest.mark.slow
def test_a_real_book_survives_gopher_with_default_settings(shared_data, tmp_path, source, config, name):
    """Moby Dick (215,000 words) and Pride and Prejudice: one document each used to exceed Gopher's
    max_words = 100,000 (Moby Dick) or come close; as parts, nearly all of the text is kept."""
    root = shared_data / "corpus" / "prose" / "gutenberg"
    cfg = config(source("books", root, include=[name], filters=["auto"]), min_chars=200, max_chars=5_000_000)
    stats = curate(cfg, tmp_path / "out")
    block = stats["sources"]["books"]
    chars_read = stats["steps"][0]["sources"]["books"]["chars_out"]
    kept = sum(split["chars"] for split in block["splits"].values())
    assert block["documents_in"] >= 4 and kept >= 0.9 * chars_read, block
    assert "gopher_quality.max_words" not in block["dropped"] and stats["warnings"] == []
