"""Every kind of bad input is counted and logged with its reason, and the run continues."""

import gzip
import json

import pytest

from smelt.data.curate import curate


@pytest.mark.slow
def test_bad_inputs_are_counted_logged_and_the_run_continues(tmp_path, write, source, config):
    good = "A perfectly ordinary paragraph of prose. " * 5
    tree = write(
        tmp_path / "tree",
        {
            "good.txt": good,
            "few_bad_bytes.txt": good.encode() + b"caf\xe9\n",
            "latin1.txt": "d\u00e9j\u00e0 vu, \u00e9t\u00e9".encode("latin-1"),
            "binary.bin": bytes(range(256)) * 4,
            "empty.txt": "",
            "huge.txt": "word " * 10_000_000,  # a single 50 MB document
        },
    )
    records = [json.dumps({"text": f"record {i}: {good}"}) for i in range(300)]
    lines = [*records[:2], "{malformed json", json.dumps({"body": "no text field"}), *records[2:]]
    blob = gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0)
    web = write(tmp_path / "web", {"cut.jsonl.gz": blob[: len(blob) // 2], "empty.jsonl": ""})
    cfg = config(
        source("tree", tree, include=["*"], filters=[], part_chars=0),  # huge.txt stays one document
        source("web", web, format="jsonl", include=["*.jsonl*"], filters=[]),
        max_chars=1_000_000,
    )
    out = tmp_path / "out"
    stats = curate(cfg, out)

    tree_block, web_block = stats["sources"]["tree"], stats["sources"]["web"]
    assert tree_block["quarantined"] == {"binary": 1, "decode_error": 1}
    assert tree_block["dropped"] == {"empty": 1, "too_long": 1}
    assert tree_block["notes"] == {"utf8_replaced_records": 1}
    assert tree_block["documents_kept"] == 2 and tree_block["files_empty"] == 1
    assert web_block["quarantined"]["bad_json"] == 1
    assert web_block["quarantined"]["missing_text_field"] == 1
    assert web_block["quarantined"]["decode_error"] == 1  # the truncated gzip stream
    assert 0 < web_block["documents_kept"] < 300
    for block in (tree_block, web_block, stats):
        assert block["documents_in"] == (
            block["documents_kept"] + sum(block["dropped"].values()) + sum(block["quarantined"].values())
        )
    log = [json.loads(line) for line in (out / "quarantine" / "tree.jsonl").read_text().splitlines()]
    by_file = {e["file"]: e for e in log}
    assert by_file["binary.bin"]["reason"] == "binary" and by_file["latin1.txt"]["reason"] == "decode_error"
    assert by_file["huge.txt"]["reason"] == "too_long" and by_file["huge.txt"]["chars"] == 50_000_000
    assert len(by_file["huge.txt"]["text"]) <= 20_000  # the drop sample is capped, not the whole 50 MB
