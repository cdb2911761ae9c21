"""Held-out loss and bits-per-byte: exact byte accounting, batch-size independence, compressor floors."""

import math

import numpy as np
import pytest
import torch

from helpers import write_documents
from smelt.config import ModelConfig, TokenizerConfig, TokensConfig
from smelt.documents import read_texts
from smelt.errors import UserError
from smelt.eval.compress import gzip_bits_per_byte, xz_bits_per_byte
from smelt.eval.heldout import heldout_bits_per_byte, stream_nll
from smelt.model.transformer import Transformer
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.train import train_tokenizer
from smelt.tokens.shards import ShardSet
from smelt.tokens.tokenize import tokenize


@pytest.fixture(scope="module")
def run(tmp_path_factory, shared_data):
    root = tmp_path_factory.mktemp("heldout")
    documents = root / "documents"
    prose = (shared_data / "corpus/prose/tinyshakespeare/input.txt").read_text().split("\n\n")
    code = [line for line in (shared_data / "corpus/code/cpython_stdlib_lib.jsonl").open()][:40]
    import json

    code_texts = [json.loads(line)["text"] for line in code]
    write_documents(documents, "train", "prose", prose[:1500])
    write_documents(documents, "train", "code", code_texts[:30])
    write_documents(documents, "val", "prose", prose[1500:1530] + ["ünïcödé ✓ 日本語 and emoji 🙂"])
    write_documents(documents, "val", "code", code_texts[30:34])
    train_tokenizer(
        TokenizerConfig(vocab_size=700, sample_bytes=2_000_000), documents, root / "tokenizer", seed=0
    )
    tokenize(TokensConfig(shard_tokens=5_000), documents, root / "tokenizer", root / "tokens")
    return root


def tiny_model(vocab_size):
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    return Transformer(cfg, vocab_size)


class Uniform(torch.nn.Module):
    """Equal logits for every token: the loss of each token is exactly ln V."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, idx, targets=None):
        return torch.zeros(*idx.shape, self.vocab_size), None


def score_uniform(run, **kwargs):
    tokenizer = Tokenizer.load(run / "tokenizer")
    model = Uniform(tokenizer.vocab_size)
    return heldout_bits_per_byte(
        model, run / "tokens", run / "documents", tokenizer.eos_id, seq_len=32, **kwargs
    )


@pytest.mark.slow
def test_uniform_model_scores_ln_v_per_token_and_counts_every_byte(run):
    tokenizer = Tokenizer.load(run / "tokenizer")
    result = score_uniform(run, batch_size=4)
    for source in ("prose", "code"):
        figures = result["per_source"][source]
        texts = read_texts(run / "documents", "val", source)
        assert figures["bytes"] == sum(len(t.encode()) for t in texts)
        shards = ShardSet(run / "tokens", "val", source)
        assert figures["tokens"] == shards.total_tokens  # every token predicted once, EOS included
        assert figures["loss"] == pytest.approx(math.log(tokenizer.vocab_size), rel=1e-6)
        expected = figures["tokens"] * math.log2(tokenizer.vocab_size) / figures["bytes"]
        assert figures["bits_per_byte"] == pytest.approx(expected, rel=1e-6)
    overall = result["overall"]
    assert overall["bytes"] == sum(result["per_source"][s]["bytes"] for s in ("prose", "code"))
    # Loss by context position: every scored token lands in one bucket (windows of 32: 0-7, 8-31).
    buckets = overall["loss_by_position"]
    assert list(buckets) == ["0-7", "8-31"]
    assert sum(b["tokens"] for b in buckets.values()) == overall["tokens"]
    assert all(b["loss"] == pytest.approx(math.log(tokenizer.vocab_size), rel=1e-6) for b in buckets.values())


def test_loss_by_position_counts_each_token_in_its_context_bucket():
    from smelt.eval.heldout import position_bucket_names

    assert position_bucket_names()[:3] == ["0-7", "8-31", "32-127"] and position_bucket_names()[-1] == "8192+"
    by_position = np.zeros((7, 2))
    stream = np.arange(200) % 7
    model = tiny_model(16)
    stream_nll(model, stream, seq_len=40, batch_size=3, device=torch.device("cpu"), by_position=by_position)
    # 5 windows of up to 40 targets: positions 0-7 and 8-31 of each, then 32-39 (the last window has 39)
    assert by_position[:, 1].tolist() == [40, 120, 39, 0, 0, 0, 0]
    assert by_position[:, 0].sum() > 0


@pytest.mark.slow
def test_token_bytes_match_text_bytes(run):
    tokenizer = Tokenizer.load(run / "tokenizer")
    lengths = tokenizer.token_byte_lengths()
    for source in ("prose", "code"):
        stream = ShardSet(run / "tokens", "val", source).read(
            0, ShardSet(run / "tokens", "val", source).total_tokens
        )
        texts = read_texts(run / "documents", "val", source)
        assert int(lengths[stream.astype(np.int64)].sum()) == sum(len(t.encode()) for t in texts)


@pytest.mark.slow
def test_score_does_not_depend_on_batch_size(run):
    tokenizer = Tokenizer.load(run / "tokenizer")
    model = tiny_model(tokenizer.vocab_size)
    shards = ShardSet(run / "tokens", "val", "prose")
    stream = np.concatenate([[tokenizer.eos_id], shards.read(0, shards.total_tokens).astype(np.int64)])
    one = stream_nll(model, stream, seq_len=48, batch_size=1, device=torch.device("cpu"))
    sixteen = stream_nll(model, stream, seq_len=48, batch_size=16, device=torch.device("cpu"))
    assert one[1] == sixteen[1] == len(stream) - 1
    assert abs(one[0] - sixteen[0]) / one[0] < 1e-6
    eos = tokenizer.eos_id
    masked_1 = stream_nll(model, stream, seq_len=48, batch_size=1, device=torch.device("cpu"), eos_id=eos)
    masked_16 = stream_nll(model, stream, seq_len=48, batch_size=16, device=torch.device("cpu"), eos_id=eos)
    assert abs(masked_1[0] - masked_16[0]) / masked_1[0] < 1e-6
    assert masked_1[0] != one[0]  # attention within documents scores differently from across them


@pytest.mark.slow
@pytest.mark.parametrize("max_bytes", [2_000, 9_000, 30_001])
def test_max_bytes_is_met_by_cutting_the_last_document(run, max_bytes):
    # eval.max_bytes = 100_000 once scored 245,786 bytes: each source took whole documents until one
    # crossed its share, and a code file is tens of kilobytes. Now the crossing document is cut at
    # the last token that ends within the share, and the bytes scored are exactly those tokens' text.
    tokenizer = Tokenizer.load(run / "tokenizer")
    lengths = tokenizer.token_byte_lengths()
    full = score_uniform(run, batch_size=8)
    capped = score_uniform(run, batch_size=8, max_bytes=max_bytes, token_bytes=lengths)
    assert capped["overall"]["bytes"] <= max_bytes
    for source in ("prose", "code"):
        figures, longest = capped["per_source"][source], int(lengths.max())
        share = min(max_bytes // 2, full["per_source"][source]["bytes"])  # a small source is all scored
        assert share - longest < figures["bytes"] <= share, (source, figures["bytes"])
        assert figures["documents"] <= full["per_source"][source]["documents"]
        # Uniform logits: ln V per token, so the token count is the cut's; its bytes are its tokens'.
        shards = ShardSet(run / "tokens", "val", source)
        ids = shards.read(0, figures["tokens"]).astype(np.int64)  # targets: the first token is EOS
        assert int(lengths[ids].sum()) == figures["bytes"]
        texts = read_texts(run / "documents", "val", source)
        data = b"".join(t.encode() for t in texts)
        assert figures["gzip_bits_per_byte"] == pytest.approx(gzip_bits_per_byte(data[: figures["bytes"]]))
    # Without the byte lengths the cut is in proportion to the document's tokens, still within the cap.
    rough = score_uniform(run, batch_size=8, max_bytes=max_bytes)
    assert rough["overall"]["bytes"] <= max_bytes


def test_stale_tokens_are_reported(run, tmp_path):
    documents = tmp_path / "documents"
    write_documents(documents, "val", "prose", ["only one document"])
    write_documents(documents, "val", "code", ["x = 1"])
    tokenizer = Tokenizer.load(run / "tokenizer")
    with pytest.raises(UserError, match="stale"):
        heldout_bits_per_byte(
            Uniform(tokenizer.vocab_size), run / "tokens", documents, tokenizer.eos_id, 32, 4
        )


def test_compressor_floors():
    repetitive = b"def f(x):\n    return x\n" * 2000
    assert gzip_bits_per_byte(repetitive) < 0.2 and xz_bits_per_byte(repetitive) < 0.2
    noise = np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    assert 7.9 < gzip_bits_per_byte(noise) < 8.2 and 7.9 < xz_bits_per_byte(noise) < 8.2
    text = b"the quick brown fox jumps over the lazy dog; " * 50 + bytes(range(256))
    assert xz_bits_per_byte(text) < gzip_bits_per_byte(bytes(range(256)) * 3)
