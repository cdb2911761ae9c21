import json

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.data.curate import build_steps, curate
from smelt.data.split import assign_split, split_hash


def corpus(tmp_path, write):
    prose = write(
        tmp_path / "prose",
        {
            "a.txt": "Alpha text.\r\n\r\n\r\n\r\nSecond paragraph.",
            "b.txt": "Shared text that appears twice.",
            "c.txt": "short",
            "d.txt": "",
            "e.txt": b"\x00\x01binary",
            "f.txt": "Caf\u00e9".encode("latin-1"),
            "g.txt": "x" * 500,
        },
    )
    records = [
        {"id": "w2", "text": "Shared text that appears twice.", "url": "http://w2"},
        {"id": "w1", "text": "Web page\n\n\n\nwith blank lines and control\x07 chars."},
        "garbage",
        {"id": "w3", "body": "no text"},
    ]
    lines = [r if isinstance(r, str) else json.dumps(r) for r in records]
    web = write(tmp_path / "web", {"dump.jsonl": "\n".join(lines) + "\n"})
    code = write(
        tmp_path / "code",
        {"m.py": "def f():\n\n\n\n    return 1\n", "n.py": "Shared text that appears twice."},
    )
    return prose, web, code


def make_cfg(tmp_path, write, source, config, **kw):
    prose, web, code = corpus(tmp_path, write)
    return config(
        source("prose", prose, include=["*.txt"]),
        source("web", web, format="jsonl", include=["*.jsonl"], id_field="id", url_field="url"),
        source("code", code, include=["**/*.py"], code=True),
        min_chars=10,
        max_chars=400,
        **kw,
    )


def read_docs(out):
    rows = []
    for path in sorted(out.glob("*/*/part-*.parquet")):
        rows += [(path.parent.parent.name, r) for r in pq.read_table(path).to_pylist()]
    return rows


def test_curate_end_to_end(tmp_path, write, source, config):
    cfg = make_cfg(tmp_path, write, source, config)
    out = tmp_path / "out"
    stats = curate(cfg, out)

    assert stats["documents_in"] == 13
    assert stats["documents_kept"] == 4
    assert stats["dropped"] == {"too_short": 1, "empty": 1, "too_long": 1, "exact_duplicate": 2}
    assert stats["quarantined"] == {"binary": 1, "decode_error": 1, "bad_json": 1, "missing_text_field": 1}
    total = stats["documents_kept"] + sum(stats["dropped"].values()) + sum(stats["quarantined"].values())
    assert total == stats["documents_in"]
    for block in stats["sources"].values():
        assert block["documents_in"] == (
            block["documents_kept"] + sum(block["dropped"].values()) + sum(block["quarantined"].values())
        )
    assert [s["step"] for s in stats["steps"]] == ["read", *[s.name for s in build_steps(cfg)]]
    assert [s["step"] for s in stats["steps"]] == [
        "read",
        "normalize",
        "boilerplate",
        "language_id",
        "length_filter",
        "pii",
        "unique_id",
        "exact_dedup",
        "split",
    ]
    read = stats["steps"][0]
    assert (read["step"], read["in"], read["out"], read["chars_in"]) == ("read", 13, 9, None)
    assert read["sources"]["web"]["out"] == 2 and read["sources"]["prose"]["in"] == 7
    norm = stats["steps"][1]
    assert norm["chars_in"] == read["chars_out"] and norm["chars_out"] < norm["chars_in"]
    for before, after in zip(stats["steps"], stats["steps"][1:], strict=False):
        assert after["in"] == before["out"]
    assert stats["steps"][-1]["out"] == stats["documents_kept"]
    assert json.loads((out / "stats.json").read_text()) == stats

    docs = {(r["source"], r["id"]): r for _, r in read_docs(out)}
    # the shared text is kept from the first source in config order (prose), dropped from web and code
    assert set(docs) == {("prose", "a.txt"), ("prose", "b.txt"), ("web", "w1"), ("code", "m.py")}
    assert docs[("prose", "a.txt")]["text"] == "Alpha text.\n\nSecond paragraph."
    assert docs[("web", "w1")]["text"] == "Web page\n\nwith blank lines and control chars."
    assert docs[("code", "m.py")]["text"] == "def f():\n\n\n\n    return 1\n"
    meta = json.loads(docs[("web", "w1")]["meta"])
    assert (
        meta["file"] == "dump.jsonl"
        and meta["line"] == 2
        and meta["chars"] == len(docs[("web", "w1")]["text"])
    )
    assert docs[("prose", "a.txt")]["url"] is None and docs[("prose", "a.txt")]["lang"] == "en"
    assert docs[("code", "m.py")]["lang"] is None  # code is not language-identified

    log = [json.loads(line) for line in (out / "quarantine" / "web.jsonl").read_text().splitlines()]
    dup = next(e for e in log if e["reason"] == "exact_duplicate")
    assert (dup["id"], dup["kept_source"], dup["kept_id"]) == ("w2", "prose", "b.txt")
    assert {e["reason"] for e in log} == {"exact_duplicate", "bad_json", "missing_text_field"}
    assert all({"id", "source", "file", "line", "reason"} <= set(e) for e in log)
    assert all(("text" in e) == (e["kind"] == "dropped") for e in log)
    n_logged = sum(
        len((out / "quarantine" / f"{s}.jsonl").read_text().splitlines()) for s in stats["sources"]
    )
    assert n_logged == sum(stats["dropped"].values()) + sum(stats["quarantined"].values())


def test_parquet_schema_and_compression(tmp_path, write, source, config):
    cfg = make_cfg(tmp_path, write, source, config)
    curate(cfg, tmp_path / "out")
    path = tmp_path / "out" / "train" / "prose" / "part-00000.parquet"
    schema = pq.read_schema(path)
    assert schema.names == ["id", "text", "source", "url", "lang", "meta"]
    assert all(schema.field(n).type == pa.string() for n in schema.names)
    assert schema.field("url").nullable and schema.field("lang").nullable and not schema.field("id").nullable
    assert pq.ParquetFile(path).metadata.row_group(0).column(1).compression == "ZSTD"


def test_output_is_byte_identical_across_runs(tmp_path, write, source, config):
    cfg = make_cfg(tmp_path, write, source, config, val_fraction=0.3, docs_per_part=1, min_split_docs=0)
    a, b = tmp_path / "a", tmp_path / "b"
    curate(cfg, a)
    curate(cfg, b)
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files_a == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert all((a / p).read_bytes() == (b / p).read_bytes() for p in files_a)
    assert any(p.name == "part-00001.parquet" for p in files_a)


def test_parts_order_split_and_rerun_clears_old_parts(tmp_path, write, source, config):
    texts = {f"doc{i:03d}.txt": f"document number {i} " * 3 for i in range(40)}
    root = write(tmp_path / "src", texts)
    out = tmp_path / "out"
    curate(config(source("s", root, include=["*.txt"]), docs_per_part=7, val_fraction=0.25), out)
    stats = curate(config(source("s", root, include=["*.txt"]), docs_per_part=100, val_fraction=0.25), out)
    assert sorted(p.name for p in (out / "train" / "s").iterdir()) == ["part-00000.parquet"]
    for split in ("train", "val"):
        ids = pq.read_table(out / split / "s" / "part-00000.parquet").column("id").to_pylist()
        assert ids == sorted(ids)
        assert all(assign_split(split_hash("s", i), 0.25) == split for i in ids)
        assert stats["splits"][split]["documents"] == len(ids)
    assert stats["splits"]["val"]["documents"] > 0
    chars = sum(len(t) for t in texts.values())
    assert stats["splits"]["train"]["chars"] + stats["splits"]["val"]["chars"] == chars
    assert stats["sources"]["s"]["splits"]["val"] == stats["splits"]["val"]


def test_val_forced_when_it_would_be_empty(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.txt": "first doc", "b.txt": "second doc"})
    stats = curate(config(source("s", root), val_fraction=1e-12), tmp_path / "out")
    assert stats["splits"]["val"]["documents"] == 1 and stats["splits"]["train"]["documents"] == 1
    assert stats["units_forced"] == {"s": {"val": 1, "test": 0}}


def test_parallel_matches_serial(tmp_path, write, source, config):
    files = {f"d/{i:03d}.txt": f"text of file {i % 50}\n\n\n\nend" for i in range(80)}
    files["d/bad.txt"] = b"\xff\xfe\x00"
    root = write(tmp_path / "src", files)
    serial = curate(config(source("s", root), workers=1, val_fraction=0.2), tmp_path / "serial")
    parallel = curate(
        config(source("s", root), workers=2, val_fraction=0.2, shard_bytes=1000), tmp_path / "parallel"
    )
    assert serial == parallel
    assert serial["dropped"]["exact_duplicate"] == 30
    for path in sorted((tmp_path / "serial").rglob("*")):
        if path.is_file():
            assert (
                path.read_bytes()
                == (tmp_path / "parallel" / path.relative_to(tmp_path / "serial")).read_bytes()
            )


def test_exact_dedup_can_be_turned_off(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.txt": "same", "b.txt": "same"})
    stats = curate(config(source("s", root), exact_dedup=False), tmp_path / "out")
    assert stats["documents_kept"] == 2 and "exact_dedup" not in [s["step"] for s in stats["steps"]]
