"""A source or a language that is one split unit can land wholly in validation: curate warns, naming
it, and `split_unit = "document"` with smaller parts keeps it in training. On real text: lingua's
test sentences, one file per language."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from smelt.data.curate import curate
from smelt.data.split import split_hash

SENTENCES = ("corpus", "multilingual", "lingua-testdata-A", "sentences")


def _languages(out, split: str) -> set[str]:
    rows = [r for p in sorted(out.glob(f"{split}/*/part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    return {json.loads(r["meta"])["lang"] for r in rows}


def test_a_language_that_is_one_file_in_validation_is_named(shared_data, tmp_path, source, config):
    """75 files, one per language, val_fraction 0.02: sr.txt hashes into validation, so Serbian has no
    training document (and the tokenizer would never see it)."""
    root = shared_data.joinpath(*SENTENCES)
    assert split_hash("langs", "sr.txt") / 2**64 < 0.02
    cfg = config(source("langs", root, include=["*.txt"]), val_fraction=0.02, min_chars=64)
    stats = curate(cfg, tmp_path / "out")
    assert stats["splits"]["val"]["documents"] == 1 and "sr" in _languages(tmp_path / "out", "val")
    assert "sr" not in _languages(tmp_path / "out", "train")
    warnings = [w for w in stats["warnings"] if w.get("kind") == "no_train"]
    assert [w.get("language") for w in warnings] == ["sr"]
    message = warnings[0]["message"]
    assert message.startswith("language 'sr' has no training documents: 1 document (")
    assert "all in val, from source 'langs' (split_unit = 'id' (the file))" in message
    assert "Choosing split_unit" in message
    on_disk = json.loads((tmp_path / "out" / "stats.json").read_text())
    assert on_disk["warnings"] == stats["warnings"]


def test_split_unit_document_splits_the_parts_of_a_file(shared_data, tmp_path, source, config):
    root = shared_data.joinpath(*SENTENCES)
    langs = source(
        "langs", root, include=["sr.txt", "hr.txt", "pl.txt"], split_unit="document", part_chars=4000
    )
    stats = curate(config(langs, val_fraction=0.2, min_chars=64), tmp_path / "out")
    assert not stats["warnings"]
    assert {"sr", "pl"} <= _languages(tmp_path / "out", "train")
    assert stats["splits"]["val"]["documents"] > 0


def test_a_source_with_no_training_documents_is_named(shared_data, tmp_path, source, config):
    root = shared_data / "corpus" / "prose" / "nltk_inaugural"
    name = next(p.name for p in sorted(root.glob("*.txt")) if split_hash("one", p.name) / 2**64 < 0.3)
    other = next(p.name for p in sorted(root.glob("*.txt")) if split_hash("two", p.name) / 2**64 > 0.3)
    cfg = config(
        source("one", root, include=[name]),
        source("two", root, include=[other]),
        val_fraction=0.3,
        min_chars=64,
    )
    stats = curate(cfg, tmp_path / "out")
    assert stats["sources"]["one"]["splits"]["train"]["documents"] == 0
    (warning,) = [w for w in stats["warnings"] if w.get("source")]
    assert warning["source"] == "one" and warning["splits"] == {"val": 1}
    assert warning["message"].startswith(
        "source 'one' has no training documents: 1 document kept, all in val"
    )
    assert "data.val_fraction = 0.3" in warning["message"]
    # English is in the train split through source 'two': no language warning
    assert not [w for w in stats["warnings"] if w.get("language")]


def test_no_warning_when_nothing_is_held_out(shared_data, tmp_path, source, config):
    root = shared_data.joinpath(*SENTENCES)
    stats = curate(config(source("langs", root, include=["sr.txt"]), val_fraction=0.0), tmp_path / "out")
    assert stats["warnings"] == []
