import gzip
import importlib.util
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.data.curate import resolve_sources
from smelt.data.executor import read_shard
from smelt.data.ingest import readers
from smelt.data.ingest.readers import ReadSpec, check_readable
from smelt.data.ledger import Ledger
from smelt.data.split import split_hash
from smelt.data.work_units import WorkShard, line_ranges, plan_shards
from smelt.errors import UserError


def read(spec, root, rel):
    ledger = Ledger()
    docs = list(readers.read_file(spec, root / rel, ledger))
    return docs, ledger


def text_spec(root):
    return ReadSpec("t", 0, "text", str(root))


def test_text_reader_utf8_bom_and_relative_id(tmp_path, write):
    write(tmp_path, {"a/b/doc.txt": "\ufeffHello\r\nworld"})
    docs, ledger = read(text_spec(tmp_path), tmp_path, "a/b/doc.txt")
    (doc,) = docs
    assert (doc.id, doc.file, doc.line, doc.text) == ("a/b/doc.txt", "a/b/doc.txt", None, "Hello\r\nworld")
    assert ledger.records_in["t"] == 1 and ledger.files("t", "ok") == 1 and not ledger.entries


def test_text_reader_quarantines_binary_and_latin1(tmp_path, write):
    write(tmp_path, {"bin.dat": b"abc\x00def", "latin.txt": "Caf\u00e9 cr\u00e8me".encode("latin-1")})
    for rel, reason in (("bin.dat", "binary"), ("latin.txt", "decode_error")):
        docs, ledger = read(text_spec(tmp_path), tmp_path, rel)
        assert docs == []
        (entry,) = ledger.entries
        assert (entry["reason"], entry["kind"], entry["file"], entry["id"]) == (
            reason,
            "quarantined",
            rel,
            rel,
        )
        assert ledger.records_in["t"] == 1 and ledger.files("t", "unreadable") == 1


def test_text_reader_replaces_a_few_invalid_bytes(tmp_path, write):
    write(tmp_path, {"speech.txt": ("Fellow citizens " * 40).encode() + b"caf\xe9.\n"})
    (doc,), ledger = read(text_spec(tmp_path), tmp_path, "speech.txt")
    assert doc.text.endswith("caf\ufffd.\n") and doc.meta == {"invalid_utf8": 1}
    assert ledger.notes[("t", "utf8_replaced_records")] == 1 and not ledger.entries


def test_text_reader_empty_file_status(tmp_path, write):
    write(tmp_path, {"zero.txt": "", "blank.txt": " \n\n\t"})
    for rel in ("zero.txt", "blank.txt"):
        docs, ledger = read(text_spec(tmp_path), tmp_path, rel)
        assert len(docs) == 1 and ledger.files("t", "empty") == 1


JSONL_LINES = [
    json.dumps({"id": "r1", "text": "first", "url": "http://a"}),
    "",
    "{not json",
    json.dumps({"id": "r2", "body": "no text field"}),
    json.dumps({"id": "r3", "text": 42}),
    json.dumps([1, 2]),
    json.dumps({"text": "no id"}),
    json.dumps({"id": 7, "text": "int id", "url": ""}),
]


@pytest.mark.parametrize("name", ["data.jsonl", "data.jsonl.gz"])
def test_jsonl_reader_fields_and_quarantine(tmp_path, name):
    blob = ("\n".join(JSONL_LINES) + "\n").encode()
    (tmp_path / name).write_bytes(gzip.compress(blob, mtime=0) if name.endswith(".gz") else blob)
    spec = ReadSpec("j", 0, "jsonl", str(tmp_path), "text", "id", "url")
    docs, ledger = read(spec, tmp_path, name)
    assert [(d.id, d.text, d.url, d.line) for d in docs] == [
        ("r1", "first", "http://a", 1),
        ("7", "int id", None, 8),
    ]
    reasons = [(e["line"], e["reason"]) for e in ledger.entries]
    assert reasons == [
        (3, "bad_json"),
        (4, "missing_text_field"),
        (5, "missing_text_field"),
        (6, "bad_json"),
        (7, "missing_id"),
    ]
    assert ledger.entries[0]["id"] == f"{name}:3"  # default id names file and line
    assert ledger.records_in["j"] == 7  # the blank line is not a record


def test_jsonl_default_id_and_bad_utf8(tmp_path):
    long = b"x" * 300
    (tmp_path / "x.jsonl").write_bytes(
        b'{"text": "a"}\n{"text": "caf\xe9"}\n{"text": "' + long + b'\xe9 ok \xff\xfe"}\n'
    )
    docs, ledger = read(ReadSpec("j", 0, "jsonl", str(tmp_path)), tmp_path, "x.jsonl")
    assert [d.id for d in docs] == ["x.jsonl:1", "x.jsonl:3"]
    # a few bad bytes in a long record: decoded with replacement and counted; mostly bad: quarantined
    assert docs[1].text == "x" * 300 + "\ufffd ok \ufffd\ufffd" and docs[1].meta["invalid_utf8"] == 3
    assert ledger.notes[("j", "utf8_replaced_records")] == 1
    assert [(e["id"], e["reason"]) for e in ledger.entries] == [("x.jsonl:2", "decode_error")]


def test_jsonl_truncated_gzip_is_quarantined(tmp_path):
    blob = gzip.compress(b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(500)))
    (tmp_path / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    docs, ledger = read(ReadSpec("j", 0, "jsonl", str(tmp_path)), tmp_path, "cut.jsonl.gz")
    assert ledger.entries[-1]["reason"] == "decode_error"
    assert ledger.records_in["j"] == len(docs) + 1


def test_jsonl_zst_reads_and_truncation_is_quarantined(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    blob = b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(300))
    packed = zstandard.ZstdCompressor().compress(blob)
    (tmp_path / "a.jsonl.zst").write_bytes(packed)
    (tmp_path / "cut.jsonl.zst").write_bytes(packed[: len(packed) // 2])
    spec = ReadSpec("z", 0, "jsonl", str(tmp_path))
    docs, ledger = read(spec, tmp_path, "a.jsonl.zst")
    assert [d.text for d in docs] == [f"doc {i}" for i in range(300)] and not ledger.entries
    docs, ledger = read(spec, tmp_path, "cut.jsonl.zst")
    assert len(docs) < 300 and ledger.entries[-1]["reason"] == "decode_error"


def test_jsonl_zst_without_zstandard_is_a_user_error(tmp_path, monkeypatch):
    path = tmp_path / "x.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "zstandard" else real(name))
    with pytest.raises(UserError, match="pip install zstandard") as info:
        check_readable(ReadSpec("zsrc", 0, "jsonl", str(tmp_path)), [path])
    assert "zsrc" in str(info.value)


def write_parquet(path, rows, row_group_size=None):
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def test_parquet_reader_batches_and_default_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(readers, "BATCH_ROWS", 3)
    rows = [{"content": f"text {i}" if i != 4 else None, "link": f"u{i}", "other": i} for i in range(10)]
    write_parquet(tmp_path / "p.parquet", rows, row_group_size=4)
    spec = ReadSpec("p", 0, "parquet", str(tmp_path), "content", "", "link")
    docs, ledger = read(spec, tmp_path, "p.parquet")
    assert [d.id for d in docs] == [f"p.parquet:{i}" for i in range(10) if i != 4]
    assert docs[0].text == "text 0" and docs[0].url == "u0" and docs[-1].line == 9
    assert [(e["line"], e["reason"]) for e in ledger.entries] == [(4, "missing_text_field")]
    assert ledger.records_in["p"] == 10


def test_parquet_missing_column_is_a_user_error(tmp_path):
    write_parquet(tmp_path / "p.parquet", [{"body": "x"}])
    with pytest.raises(UserError, match="text_field") as info:
        read(ReadSpec("psrc", 0, "parquet", str(tmp_path)), tmp_path, "p.parquet")
    assert "psrc" in str(info.value) and "body" in str(info.value)


def test_parquet_corrupt_file_is_quarantined(tmp_path):
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    docs, ledger = read(ReadSpec("p", 0, "parquet", str(tmp_path)), tmp_path, "bad.parquet")
    assert docs == [] and ledger.entries[0]["reason"] == "decode_error"


def test_globs_exclude_sorting_and_max_files(tmp_path, write, source, config):
    write(
        tmp_path,
        {
            "b.txt": "b",
            "a.txt": "a",
            "sub/c.txt": "c",
            "sub/deep/d.txt": "d",
            "sub/e.md": "e",
            "skip/f.txt": "f",
        },
    )
    cfg = config(source("s", tmp_path, include=["**/*.txt"], exclude=["skip/**"]))
    rels = [p.relative_to(tmp_path).as_posix() for p in resolve_sources(cfg)["s"]]
    assert rels == ["a.txt", "b.txt", "sub/c.txt", "sub/deep/d.txt"]
    cfg = config(source("s", tmp_path, include=["*.txt", "sub/*.txt"]))
    assert [p.name for p in resolve_sources(cfg)["s"]] == ["a.txt", "b.txt", "c.txt"]
    cfg = config(source("s", tmp_path, include=["**/*.txt"], max_files=2))
    assert [p.name for p in resolve_sources(cfg)["s"]] == ["a.txt", "b.txt"]


def test_read_shard_counts_read_step(tmp_path, write):
    write(tmp_path, {"a.txt": "one", "b.txt": b"\x00"})
    spec = text_spec(tmp_path)
    shard = WorkShard("0000-0000000", spec, (str(tmp_path / "a.txt"), str(tmp_path / "b.txt")), 4)
    docs, ledger = read_shard(shard, [])
    assert len(docs) == 1 and docs[0].unit_hash == split_hash("t", "a.txt")
    assert ledger.steps[("read", "t", "in")] == 2 and ledger.steps[("read", "t", "out")] == 1
    assert ledger.chars[("read", "t", "out")] == 3


def test_jsonl_byte_ranges_cover_every_line_once(tmp_path):
    lines = [json.dumps({"text": f"record {i} " + "x" * (i % 37)}) for i in range(500)]
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    spec = ReadSpec("t", 0, "jsonl", str(tmp_path))
    ranges = line_ranges(path, 997)
    assert len(ranges) > 10 and ranges[0][0] == 0 and ranges[-1][1] == path.stat().st_size
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    ledger = Ledger()
    docs = [
        d for start, end, first in ranges for d in readers.read_file(spec, path, ledger, start, end, first)
    ]
    assert [d.line for d in docs] == list(range(1, 501))
    assert [d.text for d in docs] == [json.loads(line)["text"] for line in lines]
    assert ledger.records_in["t"] == 500 and ledger.files("t", "ok") == 1
    shards = plan_shards([(spec, [path])], 997)
    assert [(s.start, s.end, s.first_line) for s in shards] == ranges
