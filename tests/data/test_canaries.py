"""data.canaries = N plants N random strings in the first source's train split, string i 2^(i mod 6) times,
and records them for the contamination meter; 0 plants nothing and leaves the stage's hash alone."""

import json
from collections import Counter

import pyarrow.parquet as pq

from smelt.canaries import copies_of, make_record, read_record
from smelt.data.curate import curate


def inaugural_config(shared_data, source, config, canaries: int):
    root = shared_data / "corpus" / "prose" / "nltk_inaugural"
    cfg = config(
        source("speeches", root, include=["19*.txt"]),
        source("more", root, include=["20*.txt"]),
        canaries=canaries,
        val_fraction=0.2,
    )
    cfg.langid.enabled = False
    return cfg


def train_docs(out, source):
    rows = []
    for part in sorted((out / "train" / source).glob("part-*.parquet")):
        rows += pq.read_table(part).to_pylist()
    return rows


def test_canaries_are_planted_with_their_exposures_and_recorded(tmp_path, shared_data, source, config):
    out = tmp_path / "documents"
    stats = curate(inaugural_config(shared_data, source, config, 12), out)
    record = read_record(out)
    assert record is not None and record["source"] == "speeches"
    assert [c["copies"] for c in record["canaries"]] == [1, 2, 4, 8, 16, 32] * 2
    assert len(record["controls"]) == 16 and not set(record["controls"]) & {
        c["text"] for c in record["canaries"]
    }

    rows = train_docs(out, "speeches")
    planted = Counter(r["text"] for r in rows if json.loads(r["meta"]).get("canary"))
    assert planted == {c["text"]: c["copies"] for c in record["canaries"]}
    assert len({r["id"] for r in rows}) == len(rows)  # every copy has an id of its own
    assert not any("canary" in r["meta"] for r in train_docs(out, "more"))
    val = [r for p in sorted((out / "val").glob("*/part-*.parquet")) for r in pq.read_table(p).to_pylist()]
    assert val and not any("canary" in r["meta"] for r in val)
    assert stats["canaries"] == {"source": "speeches", "strings": 12, "documents": 126}
    # The accounting is about the raw records: the canaries are counted beside it, not in it.
    kept = len(rows) - 126 + len(train_docs(out, "more")) + len(val)
    assert stats["documents_kept"] == kept
    # The same N gives the same strings; 0 removes what an earlier curation planted.
    assert make_record(12, "speeches") == record
    curate(inaugural_config(shared_data, source, config, 0), out)
    assert read_record(out) is None
    assert not any("canary" in r["meta"] for r in train_docs(out, "speeches"))


def test_exposures_double_up_to_32_and_repeat():
    assert [copies_of(i) for i in range(8)] == [1, 2, 4, 8, 16, 32, 1, 2]
    texts = [c["text"] for c in make_record(30, "x")["canaries"]]
    assert len(set(texts)) == 30 and all(len(t) > 40 for t in texts)


def test_no_canaries_leave_the_curate_stage_hash_as_before_the_key_existed():
    from smelt.config import Config
    from smelt.run.pipeline import _stage_config

    cfg = Config()
    assert "canaries" not in _stage_config(cfg, "curate")["data"]  # a manifest written before the key matches
    cfg.data.canaries = 6
    assert _stage_config(cfg, "curate")["data"]["canaries"] == 6  # planting changes the documents


def test_a_negative_canary_count_is_a_user_error(tmp_path, capsys):
    from smelt.cli import main

    path = tmp_path / "pipeline.toml"
    path.write_text(f"[run]\ndir = '{tmp_path}'\n")
    assert main(["curate", str(path), "--set", "data.canaries=-1"]) == 2
    err = capsys.readouterr().err
    assert "data.canaries = -1 is out of range" in err and "[0, 10,000]" in err and "Traceback" not in err
