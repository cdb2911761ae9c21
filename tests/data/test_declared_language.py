"""A source's declared language (`declared_language`): kept in meta, counted in the stats with the
language id labels beside it, used for the split warnings and the per-language filter rules, and
checked at config time. On lingua's test sentences (one file per language), where language id labels
Malay `id` and merges other close pairs."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from smelt.data.curate import curate
from smelt.data.split import split_hash
from smelt.errors import ConfigError

SENTENCES = ("corpus", "multilingual", "lingua-testdata-A", "sentences")


def _rows(out):
    return [r for p in sorted(out.glob("*/*/part-*.parquet")) for r in pq.read_table(p).to_pylist()]


def test_declared_language_from_the_file_name(shared_data, tmp_path, source, config):
    root = shared_data.joinpath(*SENTENCES)
    langs = source("langs", root, include=["*.txt"], declared_language="file")
    stats = curate(config(langs, min_chars=64), tmp_path / "out")
    rows = _rows(tmp_path / "out")
    declared = {json.loads(r["meta"])["declared_lang"] for r in rows}
    assert len(rows) == len(declared) == 75 and len({r["lang"] for r in rows}) < 75
    ms = next(json.loads(r["meta"]) for r in rows if r["id"] == "ms.txt")
    assert ms["declared_lang"] == "ms" and ms["lang"] == "id"  # language id calls Malay Indonesian
    block = stats["sources"]["langs"]["declared_languages"]
    assert len(block) == 75 and block["ms"] == {"documents": 1, "language_id": {"id": 1}}
    assert block["pl"] == {"documents": 1, "language_id": {"pl": 1}}


def test_split_warning_names_the_declared_language(shared_data, tmp_path, source, config):
    """Source 'lingua51' sends ms.txt to validation. By language id label there is nothing to say
    (ms.txt is labelled `id`, and id.txt is in train); by the declared language, Malay is missing."""
    root = shared_data.joinpath(*SENTENCES)
    assert [p.name for p in sorted(root.glob("*.txt")) if split_hash("lingua51", p.name) / 2**64 < 0.02] == [
        "ms.txt"
    ]
    by_label = curate(config(source("lingua51", root), val_fraction=0.02), tmp_path / "label")
    assert by_label["warnings"] == []
    declared = source("lingua51", root, declared_language="file")
    stats = curate(config(declared, val_fraction=0.02), tmp_path / "declared")
    assert [w["language"] for w in stats["warnings"]] == ["ms"]


def test_a_declared_code_and_a_record_field(tmp_path, source, config, shared_data):
    lines = (shared_data.joinpath(*SENTENCES) / "bs.txt").read_text(encoding="utf-8").splitlines()[:40]
    web = tmp_path / "web"
    web.mkdir()
    with open(web / "a.jsonl", "w", encoding="utf-8") as handle:
        for i in range(0, 40, 10):
            record = {"text": "\n".join(lines[i : i + 10]), "language": "BS" if i < 20 else ""}
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    books = tmp_path / "books"
    books.mkdir()
    (books / "knjiga.txt").write_text("\n".join(lines), encoding="utf-8")
    cfg = config(
        source("web", web, format="jsonl", declared_language="field:language"),
        source("books", books, declared_language="bs"),
    )
    curate(cfg, tmp_path / "out")
    declared = {
        (r["source"], r["id"]): json.loads(r["meta"]).get("declared_lang") for r in _rows(tmp_path / "out")
    }
    assert declared == {
        ("web", "a.jsonl:1"): "bs",
        ("web", "a.jsonl:2"): "bs",
        ("web", "a.jsonl:3"): None,  # an empty field declares nothing
        ("web", "a.jsonl:4"): None,
        ("books", "knjiga.txt"): "bs",
    }


@pytest.mark.parametrize(
    ("value", "fmt", "expected"),
    [
        ("Polish", "text", "is not a language code"),
        ("pl.txt", "text", "is not a language code"),
        ("field:lang", "text", "only jsonl and parquet sources have"),
        ("field:", "jsonl", "only jsonl and parquet sources have"),
    ],
)
def test_a_bad_declared_language_is_a_config_error(tmp_path, source, config, value, fmt, expected):
    (tmp_path / "a.txt").write_text("text", encoding="utf-8")
    cfg = config(source("langs", tmp_path, format=fmt, declared_language=value))
    with pytest.raises(ConfigError, match=expected) as err:
        curate(cfg, tmp_path / "out")
    assert f"data.sources[0].declared_language = {value!r} (source 'langs')" in str(err.value)


def test_filters_use_the_declared_language(tmp_path, source, config, shared_data):
    """An English-labelled text declared German skips the English stop-word rule."""
    text = " ".join(["river stone garden window candle forest market bridge silver winter"] * 6) + "."
    (tmp_path / "de").mkdir()
    (tmp_path / "de" / "a.txt").write_text(text, encoding="utf-8")
    cfg = config(source("web", tmp_path, filters=["gopher_quality"], declared_language="dir"))
    stats = curate(cfg, tmp_path / "out")
    assert stats["documents_kept"] == 1
    assert stats["sources"]["web"]["notes"]["gopher_quality.min_stop_words.skipped.de"] == 1
