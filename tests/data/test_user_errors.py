import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smelt.data.curate import curate, resolve_sources
from smelt.errors import UserError


def raises(cfg, tmp_path, *fragments):
    with pytest.raises(UserError) as info:
        curate(cfg, tmp_path / "out")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    assert not (tmp_path / "out" / "stats.json").exists()
    return message


def test_no_sources(tmp_path, config):
    raises(config(), tmp_path, "data.sources is empty", "[[data.sources]]")
    with pytest.raises(UserError, match="data.sources is empty"):
        resolve_sources(config())


def test_globs_match_nothing(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.md": "text"})
    cfg = config(source("books", root, include=["*.txt"], exclude=["old/*"]))
    message = raises(
        cfg, tmp_path, "'books'", "'*.txt'", "old/*", str(root), "matches no files", "Fix the include"
    )
    assert "**/*.txt" in message  # the hint shows how to match recursively
    with pytest.raises(UserError, match="books"):
        resolve_sources(cfg)


def test_everything_excluded(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.txt": "text"})
    raises(
        config(source("s", root, include=["*.txt"], exclude=["*"])), tmp_path, "matches no files", "exclude"
    )


def test_missing_root(tmp_path, source, config):
    missing = tmp_path / "nowhere"
    raises(
        config(source("gone", missing)),
        tmp_path,
        "'gone'",
        str(missing),
        "does not exist",
        "Set data.sources root",
    )


def test_root_is_a_file(tmp_path, write, source, config):
    write(tmp_path, {"file.txt": "x"})
    raises(config(source("f", tmp_path / "file.txt")), tmp_path, "'f'", "is not a directory")


@pytest.mark.parametrize("pattern", ["/etc/*.txt", "../*.txt"])
def test_pattern_outside_root(tmp_path, write, source, config, pattern):
    root = write(tmp_path / "src", {"a.txt": "x"})
    raises(config(source("s", root, include=[pattern])), tmp_path, "'s'", pattern, "relative to root")


def test_all_files_empty(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.txt": "", "b.txt": "  \n\n \t\n"})
    raises(
        config(source("blank", root, include=["*.txt"])),
        tmp_path,
        "'blank'",
        "all 2 files",
        str(root),
        "empty",
        "Point include at files",
    )


def test_all_jsonl_files_empty(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.jsonl": "", "b.jsonl": "\n\n", "c.jsonl": json.dumps({"text": "  "})})
    raises(config(source("j", root, format="jsonl", include=["*.jsonl"])), tmp_path, "'j'", "empty")


def test_all_files_binary(tmp_path, write, source, config):
    root = write(
        tmp_path / "src", {"a.bin": b"\x00\x01\x02", "b.png": b"\x89PNG\x00\x00", "c.txt": b"\xff\xfe"}
    )
    raises(
        config(source("imgs", root)),
        tmp_path,
        "source 'imgs': all 3 files under",
        str(root),
        "binary",
        "Point include at text files",
    )


def test_all_records_lack_text_field(tmp_path, write, source, config):
    lines = "\n".join(json.dumps({"content": f"t{i}", "id": i}) for i in range(3))
    root = write(tmp_path / "src", {"a.jsonl": lines})
    raises(config(source("j", root, format="jsonl")), tmp_path, "'j'", "'text'", "content", "Set text_field")


def test_all_lines_bad_json(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.jsonl": "plain text\nnot json either\n"})
    raises(config(source("j", root, format="jsonl")), tmp_path, "'j'", "JSON", 'format = "text"')


def test_all_records_lack_id_field(tmp_path, write, source, config):
    root = write(tmp_path / "src", {"a.jsonl": json.dumps({"text": "hello"})})
    raises(config(source("j", root, format="jsonl", id_field="uid")), tmp_path, "'j'", "'uid'", "id_field")


def test_parquet_missing_text_column(tmp_path, source, config):
    root = tmp_path / "src"
    root.mkdir()
    pq.write_table(pa.table({"body": ["x"]}), root / "a.parquet")
    raises(config(source("pq", root, format="parquet")), tmp_path, "'pq'", "'text'", "body", "text_field")


def test_one_bad_source_among_good_ones_still_fails(tmp_path, write, source, config):
    good = write(tmp_path / "good", {"a.txt": "fine text"})
    bad = write(tmp_path / "bad", {"a.bin": b"\x00"})
    raises(config(source("good", good), source("bad", bad)), tmp_path, "source 'bad'", "binary")


def test_user_error_from_a_worker_process(tmp_path, source, config):
    root = tmp_path / "src"
    root.mkdir()
    for i in range(70):
        pq.write_table(pa.table({"text" if i != 42 else "body": [f"doc {i}"]}), root / f"{i:03d}.parquet")
    cfg = config(source("pq", root, format="parquet"), workers=2)
    raises(cfg, tmp_path, "'pq'", "042.parquet", "'text'", "Set text_field")
