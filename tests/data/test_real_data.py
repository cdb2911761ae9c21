"""Curate real third-party text from the shared data set (see shared/data/README.md section 1)."""

import gzip
import json
import sysconfig
import unicodedata

import pyarrow.parquet as pq
import pytest

from smelt.data.curate import curate, resolve_sources


def kept_rows(out, source):
    rows = []
    for path in sorted(out.glob(f"*/{source}/part-*.parquet")):
        rows += pq.read_table(path).to_pylist()
    return rows


def check_invariant(stats):
    for block in [stats, *stats["sources"].values()]:
        assert block["documents_in"] == (
            block["documents_kept"] + sum(block["dropped"].values()) + sum(block["quarantined"].values())
        )


def test_inaugural_text_tree(shared_data, tmp_path, source, config):
    root = shared_data / "corpus" / "prose" / "nltk_inaugural"
    cfg = config(source("inaugural", root, include=["*.txt"], filters=[]), min_chars=64, val_fraction=0.1)
    stats = curate(cfg, tmp_path / "out")
    check_invariant(stats)
    assert stats["documents_in"] == 59
    assert stats["quarantined"] == {}
    # the one Latin-1 speech has a few non-UTF-8 bytes: decoded with replacement and counted
    assert stats["sources"]["inaugural"]["notes"] == {"utf8_replaced_records": 1}
    rows = kept_rows(tmp_path / "out", "inaugural")
    assert len(rows) == stats["documents_kept"] == 59
    replaced = [r for r in rows if "invalid_utf8" in json.loads(r["meta"])]
    assert len(replaced) == 1 and "\ufffd" in replaced[0]["text"]
    assert stats["splits"]["val"]["documents"] >= 1
    washington = next(r for r in rows if r["id"] == "1789-Washington.txt")
    assert washington["text"].startswith("Fellow-Citizens of the Senate")
    assert all(unicodedata.is_normalized("NFC", r["text"]) and "\r" not in r["text"] for r in rows)
    assert all("\n\n\n" not in r["text"] for r in rows)


def test_dolma_web_jsonl_with_id_field(shared_data, tmp_path, source, config):
    root = shared_data / "corpus" / "web" / "dolma-cc-sample"
    cfg = config(source("web", root, format="jsonl", include=["*.jsonl"], id_field="id"), min_chars=64)
    stats = curate(cfg, tmp_path / "out")
    check_invariant(stats)
    assert stats["documents_in"] == 20 and not stats["quarantined"]
    rows = kept_rows(tmp_path / "out", "web")
    assert len(rows) == stats["documents_kept"] > 10
    assert all(r["id"].startswith("http") for r in rows)
    assert {json.loads(r["meta"])["file"] for r in rows} <= {"cc_en_head-0091.jsonl", "cc_en_head-0174.jsonl"}


@pytest.mark.slow
def test_cpython_code_slice(shared_data, tmp_path, source, config):
    """The first 120 records of the stdlib JSONL, split over three gzip files; max_files keeps two."""
    lines = (
        (shared_data / "corpus" / "code" / "cpython_stdlib_lib.jsonl").read_bytes().splitlines(keepends=True)
    )
    root = tmp_path / "code"
    root.mkdir()
    for i in range(3):
        (root / f"part{i}.jsonl.gz").write_bytes(
            gzip.compress(b"".join(lines[i * 40 : (i + 1) * 40]), mtime=0)
        )
    cfg = config(
        source("code", root, format="jsonl", include=["*.jsonl.gz"], id_field="path", code=True, max_files=2),
        min_chars=1,
        val_fraction=0.05,
    )
    stats = curate(cfg, tmp_path / "out")
    check_invariant(stats)
    assert stats["sources"]["code"]["files"] == 2 and stats["documents_in"] == 80
    originals = {r["path"]: r["text"] for r in map(json.loads, lines[:80])}
    rows = kept_rows(tmp_path / "out", "code")
    assert len(rows) == stats["documents_kept"] and rows
    for row in rows:  # code keeps its whitespace: unchanged unless it had CR, control chars or non-NFC text
        original = originals[row["id"]]
        if json.loads(row["meta"]).get("pii"):  # e-mail addresses and IPs became placeholders
            assert "<EMAIL>" in row["text"] or "<IP_ADDRESS>" in row["text"]
        elif original == unicodedata.normalize("NFC", original) and not any(
            ord(c) < 32 and c not in "\n\t" for c in original
        ):
            assert row["text"] == original


@pytest.mark.slow
def test_stdlib_root_excludes_site_packages(tmp_path, source, config):
    cfg = config(source("stdlib", "{stdlib}", include=["**/*.py"], code=True, max_files=40))
    files = resolve_sources(cfg)["stdlib"]
    stdlib = sysconfig.get_paths()["stdlib"]
    assert len(files) == 40 and all(str(f).startswith(stdlib) for f in files)
    every = resolve_sources(
        config(source("stdlib", "{stdlib}", include=["site-packages/**/*.py", "**/*.py"]))
    )
    assert every["stdlib"] and not any("site-packages" in f.parts for f in every["stdlib"])
    stats = curate(cfg, tmp_path / "out")
    check_invariant(stats)
    assert stats["documents_kept"] > 0
