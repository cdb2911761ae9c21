"""The run's drop list: tokenize leaves its documents out (the shards equal those of documents without
them) and records them; a step still maps to the right documents when rows were dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import write_documents
from smelt.config import TokenizerConfig, TokensConfig, config_from_dict
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.train import train_tokenizer
from smelt.tokens.batches import step_rows
from smelt.tokens.drop_list import (
    DROPPED,
    add_to_drop_list,
    document_row,
    drop_list_hash,
    dropped_rows,
    read_drop_list,
)
from smelt.tokens.loader import TokenLoader
from smelt.tokens.step_documents import _ordinal, _segments, batch_documents
from smelt.tokens.tokenize import tokenize

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet"]
TEXTS = [
    f"document {k} says " + " ".join(WORDS[(k + i) % len(WORDS)] for i in range(40 + 4 * k))
    for k in range(12)
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("drops")
    write_documents(root / "documents", "train", "web", TEXTS[:7])
    write_documents(root / "documents", "train", "web", TEXTS[7:], part=1)
    train_tokenizer(
        TokenizerConfig(vocab_size=400, sample_bytes=100_000), root / "documents", root / "tokenizer", seed=0
    )
    return root / "documents", root / "tokenizer"


def _entry(doc_id: str, step: int = 7) -> dict:
    return {
        "source": "web",
        "id": doc_id,
        "split": "train",
        "reason": f"spike at step {step}",
        "spike_step": step,
    }


def test_drop_list_appends_once_per_document_and_hashes_its_pairs(tmp_path):
    path = tmp_path / "drops.jsonl"
    assert read_drop_list(path) == [] and drop_list_hash(path) is None
    assert len(add_to_drop_list(path, [_entry("web:0:3"), _entry("web:0:3", 9), _entry("web:1:1")])) == 2
    first = drop_list_hash(path)
    assert add_to_drop_list(path, [_entry("web:1:1", 11)]) == []  # listed already: the first reason stays
    assert drop_list_hash(path) == first and [e["spike_step"] for e in read_drop_list(path)] == [7, 7]
    add_to_drop_list(path, [_entry("web:1:2")])
    assert drop_list_hash(path) != first


def test_a_damaged_drop_list_names_the_file_and_line(tmp_path):
    path = tmp_path / "drops.jsonl"
    path.write_text(json.dumps(_entry("web:0:1")) + "\n{not json\n")
    with pytest.raises(UserError, match=r"drops.jsonl, line 2: not a drop list entry"):
        read_drop_list(path)


def test_document_rows_count_the_dropped_rows_back_in():
    assert [document_row(k, [1, 4]) for k in range(5)] == [0, 2, 3, 5, 6]
    assert document_row(3, []) == 3


def test_tokenize_leaves_the_listed_documents_out_and_records_them(tmp_path, corpus):
    documents, tokenizer = corpus
    cfg = TokensConfig(shard_tokens=100_000, batch_docs=3)
    drops = [_entry("web:0:3"), _entry("web:1:2"), _entry("absent-id")]
    stats = tokenize(cfg, documents, tokenizer, tmp_path / "dropped", drops=drops)
    assert stats["splits"]["train"]["sources"]["web"]["documents"] == 10
    assert stats["splits"]["train"]["sources"]["web"]["dropped"] == 2
    recorded = [json.loads(line) for line in (tmp_path / "dropped" / DROPPED).read_text().splitlines()]
    assert [(r["id"], r["row"], r["reason"]) for r in recorded] == [
        ("web:0:3", 3, "spike at step 7"),
        ("web:1:2", 9, "spike at step 7"),
    ]
    assert dropped_rows(tmp_path / "dropped", "train", "web") == [3, 9]
    # The same shards as documents that never held them.
    kept = [t for i, t in enumerate(TEXTS) if i not in (3, 9)]
    write_documents(tmp_path / "clean", "train", "web", kept)
    tokenize(cfg, tmp_path / "clean", tokenizer, tmp_path / "expected")
    shard = Path("train") / "web" / "00000.bin"
    assert (tmp_path / "dropped" / shard).read_bytes() == (tmp_path / "expected" / shard).read_bytes()


def test_shards_written_before_a_drop_are_not_kept_by_the_next_tokenize(tmp_path, corpus):
    documents, tokenizer = corpus
    cfg = TokensConfig(shard_tokens=100_000)
    out = tmp_path / "tokens"
    tokenize(cfg, documents, tokenizer, out)
    before = (out / "train" / "web" / "00000.bin").read_bytes()
    tokenize(cfg, documents, tokenizer, out, drops=[_entry("web:0:0")])
    after = (out / "train" / "web" / "00000.bin").read_bytes()
    assert after != before and len(after) < len(before)


def test_each_step_maps_to_its_documents_by_id_after_drops(tmp_path, corpus):
    documents, tokenizer_dir = corpus
    tokens = tmp_path / "tokens"
    tokenize(TokensConfig(shard_tokens=100_000), documents, tokenizer_dir, tokens, drops=[_entry("web:0:3")])
    cfg = config_from_dict({
        "run": {"seed": 3},
        "train": {"seq_len": 16, "micro_batch": 2, "batch_tokens": 64, "tokens": 64 * 8},
        "tokens": {"prefetch": 0},
    })  # fmt: skip
    loader = TokenLoader.from_config(cfg, tokens, tokenizer_dir, verify="size")
    tokenizer = Tokenizer.load(tokenizer_dir)
    texts = {
        f"web:{0 if k < 7 else 1}:{k if k < 7 else k - 7}": " ".join(t.split()) for k, t in enumerate(TEXTS)
    }
    seen = set()
    for step in range(1, 9):
        docs = batch_documents(loader, [step], tokens, documents, tokenizer)
        assert sum(d["tokens"] for d in docs) == 4 * 16  # every input position of the batch, once
        for doc in docs:
            assert doc["id"] != "web:0:3"
            assert doc["snippet"].rstrip("…").replace("<|eos|>", "").strip() in texts[doc["id"]], (step, doc)
            seen.add(doc["id"])
    assert len(seen) >= 8


def test_a_document_far_above_the_batch_is_the_suspect(tmp_path, corpus):
    documents, tokenizer_dir = corpus
    tokens = tmp_path / "tokens"
    tokenize(TokensConfig(shard_tokens=100_000), documents, tokenizer_dir, tokens)
    cfg = config_from_dict(
        {"train": {"seq_len": 16, "micro_batch": 4, "batch_tokens": 128, "tokens": 128 * 2}}
    )
    loader = TokenLoader.from_config(cfg, tokens, tokenizer_dir, verify="size")
    stream = loader.streams[0]
    target = batch_documents(loader, [1], tokens, documents)[-1]
    # A probe in which every position costs 2 nats, but those of one document 12.
    probe = []
    for row in step_rows(loader, 1):
        first = row["sequence"] * 16
        segments = _segments(stream, first, 16)
        for segment in segments:
            cost = 12.0 if _ordinal(stream.shards, first + segment[0]) == target["document"] else 2.0
            segment[2] = cost * segment[1]
        probe.append(segments)
    docs = batch_documents(loader, [1], tokens, documents, probe=probe)
    assert docs[0]["id"] == target["id"] and docs[0]["loss"] == pytest.approx(12.0)
    assert [d["id"] for d in docs if d["suspect"]] == [target["id"]]
    assert all(d["loss"] == pytest.approx(2.0) for d in docs[1:])
