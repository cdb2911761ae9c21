"""Token shards: format, splitting, determinism, reader and validation errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from smelt.config import TokenizerConfig, TokensConfig
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.train import train_tokenizer
from smelt.tokens.shards import ShardSet, token_dtype
from smelt.tokens.tokenize import tokenize

from .conftest import TEXTS, write_documents


def _texts(documents: Path, split: str, source: str) -> list[str]:
    texts = []
    for part in sorted((documents / split / source).glob("part-*.parquet")):
        texts += pq.read_table(part).column("text").to_pylist()
    return texts


def test_shard_format(tmp_path, documents, tokenizer_dir):
    out = tmp_path / "tokens"
    stats = tokenize(TokensConfig(shard_tokens=100_000, batch_docs=4), documents, tokenizer_dir, out)
    tok = Tokenizer.load(tokenizer_dir)
    meta = json.loads((out / "meta.json").read_text())
    assert meta == {
        "dtype": "uint16",
        "vocab_size": 512,
        "eos_id": 1,
        "bos_id": 0,
        "pad_id": 2,
        "bos": False,
        "tokenizer_hash": tok.hash,
        "checksummed": True,
    }
    for split, source in (("train", "web"), ("train", "code"), ("val", "web")):
        texts = _texts(documents, split, source)
        bins = sorted((out / split / source).glob("*.bin"))
        assert [b.name for b in bins] == ["00000.bin"]
        data = np.fromfile(bins[0], dtype="<u2")
        offsets = np.fromfile(bins[0].with_suffix(".idx"), dtype="<i8")
        assert len(offsets) == len(texts) and offsets[0] == 0
        ends = list(offsets[1:]) + [len(data)]
        for text, start, end in zip(texts, offsets, ends, strict=True):
            doc = data[start:end]
            assert doc[-1] == tok.eos_id and tok.eos_id not in doc[:-1]
            assert doc[:-1].tolist() == tok.encode(text)
            assert tok.decode(doc[:-1]) == text
        row = stats["splits"][split]["sources"][source]
        assert row["documents"] == len(texts) and row["tokens"] == len(data) and row["shards"] == 1
        assert row["bytes"] == sum(len(t.encode()) for t in texts)
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["documents"] == stats["documents"] == len(TEXTS) * 4 + 5 + 4
    assert on_disk["tokens"] == sum(s["tokens"] for s in on_disk["splits"].values())
    assert stats["mb_per_s"] > 0


def test_shard_splitting(tmp_path, documents, tokenizer_dir):
    out = tmp_path / "tokens"
    limit = 60
    tokenize(TokensConfig(shard_tokens=limit, batch_docs=3), documents, tokenizer_dir, out)
    tok = Tokenizer.load(tokenizer_dir)
    texts = _texts(documents, "train", "web")
    expected = np.concatenate([np.array([*tok.encode(t), tok.eos_id]) for t in texts])
    bins = sorted((out / "train" / "web").glob("*.bin"))
    assert len(bins) > 3
    stream, docs = [], 0
    for i, path in enumerate(bins):
        data = np.fromfile(path, dtype="<u2")
        offsets = np.fromfile(path.with_suffix(".idx"), dtype="<i8")
        assert path.name == f"{i:05d}.bin"
        assert len(data) <= limit or len(offsets) == 1  # only a lone oversized document exceeds the limit
        assert data[-1] == tok.eos_id  # documents are never split across shards
        assert all(data[o - 1] == tok.eos_id for o in offsets[1:])
        if i + 1 < len(bins):  # a shard is closed only when the next document does not fit
            nxt = np.fromfile(bins[i + 1].with_suffix(".idx"), dtype="<i8")
            first_next = np.fromfile(bins[i + 1], dtype="<u2")[: (nxt[1] if len(nxt) > 1 else None)]
            assert len(data) + len(first_next) > limit
        stream.append(data)
        docs += len(offsets)
    assert docs == len(texts)
    assert np.array_equal(np.concatenate(stream), expected)
    assert any(len(np.fromfile(b, dtype="<u2")) > limit for b in bins)  # the long document
    shards = ShardSet(out, "train", "web")
    assert shards.num_documents == len(texts) and shards.total_tokens == len(expected)
    assert np.array_equal(shards.read(0, len(expected)), expected)
    starts = shards.document_starts()
    assert np.array_equal(shards.document(7), expected[starts[7] : starts[8]])


def test_deterministic(tmp_path, documents, tokenizer_dir):
    cfg = TokensConfig(shard_tokens=80, batch_docs=5)
    tokenize(cfg, documents, tokenizer_dir, tmp_path / "a")
    tokenize(cfg, documents, tokenizer_dir, tmp_path / "b")
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*") if p.is_file())
    assert files_a == files_b and len(files_a) > 5
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    # batch size changes nothing either, and a rerun replaces stale shards
    tokenize(TokensConfig(shard_tokens=80, batch_docs=1000), documents, tokenizer_dir, tmp_path / "a")
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes(), rel
    tokenize(TokensConfig(shard_tokens=100_000), documents, tokenizer_dir, tmp_path / "a")
    assert [p.name for p in sorted((tmp_path / "a" / "train" / "web").iterdir())] == [
        "00000.bin",
        "00000.done",
        "00000.idx",
    ]


def test_shardset_reads_across_shards_and_sources(counting_stream):
    tokens_dir, stream = counting_stream
    shards = ShardSet(tokens_dir, "train")
    assert shards.sources == ["a", "b"] and len(shards.shards) == 7
    assert shards.total_tokens == len(stream)
    assert np.array_equal(shards.read(0, len(stream)), stream)
    for start, length in ((0, 1), (899, 2), (1233, 1000), (9990, 50), (10_001, 5)):
        assert np.array_equal(shards.read(start, length), stream[start : start + length])
    assert np.array_equal(shards.document_starts(), [0, 37, 500, 1234, 3000, 5000, 5001, 7777])
    only_b = ShardSet(tokens_dir, "train", "b")
    assert np.array_equal(only_b.read(0, 10_000), stream[5000:])
    selected = shards.select("b")  # the same view without opening and verifying the shards again
    assert selected.sources == ["b"] and selected.total_tokens == only_b.total_tokens
    assert np.array_equal(selected.read(0, 10_000), stream[5000:])
    assert np.array_equal(selected.document_starts(), [0, 1, 2777])
    with pytest.raises(UserError, match="no token shards for source 'c'"):
        shards.select("c")
    with pytest.raises(UserError, match="no token shards for split 'val'.*splits present: train"):
        ShardSet(tokens_dir, "val")


def test_token_dtype():
    assert token_dtype(384) == np.dtype("<u2") and token_dtype(65536) == np.dtype("<u2")
    assert token_dtype(65537) == np.dtype("<u4")


def test_corrupt_shards_are_user_errors(counting_stream):
    tokens_dir, _ = counting_stream
    first = tokens_dir / "train" / "a" / "00000.bin"
    with open(first, "ab") as handle:
        handle.write(b"\x00")
    with pytest.raises(UserError, match=r"00000.bin is 1001 bytes.*re-run `smelt tokenize CONFIG --force`"):
        ShardSet(tokens_dir, "train")
    first.write_bytes(first.read_bytes()[:-1])
    idx = tokens_dir / "train" / "b" / "00001.idx"
    offsets = np.fromfile(idx, dtype="<i8")
    offsets[-1] = 10**6
    offsets.tofile(idx)
    with pytest.raises(UserError, match=r"b/00001.idx has document offsets outside.*--force"):
        ShardSet(tokens_dir, "train")


def test_missing_inputs_are_user_errors(tmp_path, documents, tokenizer_dir):
    with pytest.raises(UserError, match="Run `smelt curate CONFIG` first"):
        tokenize(TokensConfig(), tmp_path / "none", tokenizer_dir, tmp_path / "out")
    with pytest.raises(UserError, match="Run `smelt tokenizer train CONFIG` first"):
        tokenize(TokensConfig(), documents, tmp_path / "none", tmp_path / "out")
    with pytest.raises(UserError, match="meta.json is missing. Run `smelt tokenize CONFIG` first"):
        ShardSet(tmp_path / "none", "train")


def test_real_text(tmp_path, shared_data):
    corpus = shared_data / "corpus"
    prose = (corpus / "prose" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    docs = tmp_path / "documents"
    write_documents(docs, "train", "prose", [prose[i : i + 2000] for i in range(0, 400_000, 2000)])
    write_documents(docs, "val", "prose", [prose[i : i + 2000] for i in range(400_000, 440_000, 2000)])
    zh = (corpus / "multilingual" / "lingua-testdata-A" / "sentences" / "zh.txt").read_text(encoding="utf-8")
    write_documents(docs, "train", "zh", zh.splitlines()[:200])
    train_tokenizer(TokenizerConfig(vocab_size=800, sample_bytes=300_000), docs, tmp_path / "tok", seed=1)
    stats = tokenize(TokensConfig(shard_tokens=20_000), docs, tmp_path / "tok", tmp_path / "tokens")
    assert stats["splits"]["val"]["sources"]["prose"]["bytes_per_token"] > 2.0
    assert stats["splits"]["train"]["sources"]["prose"]["shards"] > 1
    tok = Tokenizer.load(tmp_path / "tok")
    shards = ShardSet(tmp_path / "tokens", "train", "zh")
    for index in (0, 57, 199):
        assert tok.decode(shards.document(index)[:-1]) == zh.splitlines()[index]


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_parallel_output_is_byte_identical_to_serial(tmp_path, documents, tokenizer_dir):
    cfg = TokensConfig(shard_tokens=70, batch_docs=3)
    serial = tokenize(cfg, documents, tokenizer_dir, tmp_path / "serial", workers=1)
    # batches cut by bytes (down to one document each) are sent as compact copies of their slice
    by_bytes = TokensConfig(shard_tokens=70, batch_docs=1000, batch_bytes=40)
    parallel = tokenize(by_bytes, documents, tokenizer_dir, tmp_path / "parallel", workers=2)
    assert serial["workers"] == 1 and parallel["workers"] == 2
    assert _tree(tmp_path / "serial") == _tree(tmp_path / "parallel")
    manifest = json.loads((tmp_path / "parallel" / "shards.json").read_text())
    web = manifest["splits"]["train"]["web"]
    assert web["tokens"] == parallel["splits"]["train"]["sources"]["web"]["tokens"]
    for row in web["shards"]:
        path = tmp_path / "parallel" / "train" / "web" / f"{row['shard']}.bin"
        assert row["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert row["tokens"] == path.stat().st_size // 2


def test_resume_keeps_finished_shards_and_redoes_the_rest(tmp_path, documents, tokenizer_dir):
    cfg = TokensConfig(shard_tokens=70, batch_docs=3)
    reference = tokenize(cfg, documents, tokenizer_dir, tmp_path / "ref")
    out = tmp_path / "tokens"
    tokenize(cfg, documents, tokenizer_dir, out)
    web = out / "train" / "web"
    shards = sorted(web.glob("*.bin"))
    assert len(shards) > 4
    # a crash in the middle of shard 3: its marker never got written, its .bin is half there, nothing after
    (web / "00003.done").unlink()
    (web / "00003.bin").write_bytes((web / "00003.bin").read_bytes()[:10])
    for later in shards[4:]:
        later.unlink()
        later.with_suffix(".idx").unlink()
        later.with_suffix(".done").unlink()
    (out / "shards.json").unlink()
    before = {p: p.stat().st_mtime_ns for p in shards[:3]}
    result = tokenize(cfg, documents, tokenizer_dir, out)
    others = len(list((out / "train" / "code").glob("*.bin"))) + len(
        list((out / "val" / "web").glob("*.bin"))
    )
    assert result["resumed_shards"] == 3 + others  # web's first three, and every shard of the other sources
    assert {p: p.stat().st_mtime_ns for p in shards[:3]} == before  # not rewritten
    assert _tree(out) == _tree(tmp_path / "ref")
    assert result["splits"] == reference["splits"]
    # a corrupt finished shard is not trusted: it and everything after it are redone
    data = bytearray((web / "00001.bin").read_bytes())
    data[0] ^= 1
    (web / "00001.bin").write_bytes(bytes(data))
    again = tokenize(cfg, documents, tokenizer_dir, out)
    assert again["resumed_shards"] == 1 + others
    assert _tree(out) == _tree(tmp_path / "ref")


def test_bos_option(tmp_path, documents, tokenizer_dir):
    tok = Tokenizer.load(tokenizer_dir)
    stats = tokenize(TokensConfig(bos=True), documents, tokenizer_dir, tmp_path / "tokens")
    shards = ShardSet(tmp_path / "tokens", "val", "web")
    texts = _texts(documents, "val", "web")
    for i, text in enumerate(texts):
        doc = shards.document(i)
        assert doc[0] == tok.bos_id and doc[-1] == tok.eos_id and tok.decode(doc[1:-1]) == text
    row = stats["splits"]["val"]["sources"]["web"]
    assert row["tokens"] == sum(len(tok.encode(t)) + 2 for t in texts)


def test_other_tokenizer_is_a_user_error(tmp_path, documents, tokenizer_dir):
    out = tmp_path / "tokens"
    tokenize(TokensConfig(), documents, tokenizer_dir, out)
    other = tmp_path / "other_tokenizer"
    train_tokenizer(TokenizerConfig(vocab_size=420, sample_bytes=100_000), documents, other, seed=0)
    with pytest.raises(
        UserError, match=r"made with another tokenizer .*Point the run at the tokenizer.*--force"
    ):
        tokenize(TokensConfig(), documents, other, out)
    assert ShardSet(out, "train").total_tokens > 0  # the existing shards are untouched


def test_missing_or_corrupt_shard_at_read_time(tmp_path, documents, tokenizer_dir):
    out = tmp_path / "tokens"
    tokenize(TokensConfig(shard_tokens=70, batch_docs=3), documents, tokenizer_dir, out)
    web = out / "train" / "web"
    ShardSet(out, "train")  # verifies every checksum
    original = (web / "00002.bin").read_bytes()
    flipped = bytearray(original)
    flipped[-1] ^= 1
    (web / "00002.bin").write_bytes(bytes(flipped))
    with pytest.raises(
        UserError, match=r"00002.bin is corrupt: its sha256 .* differs .*shards.json.*--force"
    ):
        ShardSet(out, "train", "web")
    assert ShardSet(out, "train", "web", verify="size").total_tokens > 0  # same length: only checksums see it
    (web / "00002.bin").write_bytes(original)
    (web / "00002.bin").rename(tmp_path / "moved.bin")
    with pytest.raises(UserError, match=r"00002.bin is missing .*--force"):
        ShardSet(out, "train")
    (tmp_path / "moved.bin").rename(web / "00002.bin")
    (out / "shards.json").unlink()
    with pytest.raises(UserError, match=r"incomplete: shards.json is missing.*smelt tokenize CONFIG"):
        ShardSet(out, "train")


def test_byte_batches_are_compact_slices():
    import pickle

    import pyarrow as pa

    from smelt.tokens.tokenize import _split_by_bytes

    column = pa.array(["x" * 100] * 9 + ["y" * 1000])
    sizes = np.array([100] * 9 + [1000], dtype=np.int64)
    batches = list(_split_by_bytes(column, sizes, 250))
    assert [len(b) for b, _ in batches] == [2, 2, 2, 2, 1, 1]  # a document over the limit goes alone
    assert [s.sum() for _, s in batches] == [200, 200, 200, 200, 100, 1000]
    assert all(len(pickle.dumps(b)) < 2 * 1000 for b, _ in batches)  # not the whole parent buffer
    assert pa.concat_arrays([b for b, _ in batches]).equals(column)
    whole = list(_split_by_bytes(column, sizes, 10**6))
    assert len(whole) == 1 and whole[0][0] is column


def test_worker_count_follows_cores_batches_and_text(monkeypatch):
    from smelt.tokens.tokenize import BYTES_PER_EXTRA_WORKER, resolve_workers

    monkeypatch.setattr("os.cpu_count", lambda: 8)
    auto = TokensConfig()
    assert resolve_workers(auto, batches=100, text_bytes=10_000_000) == 1  # start-up would dominate
    assert resolve_workers(auto, batches=100, text_bytes=3 * BYTES_PER_EXTRA_WORKER) == 4
    assert resolve_workers(auto, batches=100, text_bytes=10**12) == 8
    assert resolve_workers(auto, batches=3, text_bytes=10**12) == 3
    assert resolve_workers(TokensConfig(workers=6), batches=100, text_bytes=1) == 6  # asked for
