"""Fixtures for token-shard and loader tests."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import write_documents
from smelt.config import TokenizerConfig
from smelt.tokenizer.train import train_tokenizer
from smelt.tokens.shards import META_JSON, ShardWriter

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n\treturn a + b  \n",
    "Numbers 1234567 and 3.14159.",
    "Grüße, café, naïve — 東京 北京 مرحبا Привет 🙂🚀",
    "",
    "A much longer document. " * 40,
    "short",
]


@pytest.fixture(scope="session")
def documents(tmp_path_factory) -> Path:
    """Two train sources (one with two parts) and one val source of small synthetic documents."""
    root = tmp_path_factory.mktemp("documents")
    write_documents(root, "train", "web", TEXTS * 3)
    write_documents(root, "train", "web", [t[::-1] for t in TEXTS], part=1)
    write_documents(root, "train", "code", ["for i in range(10):\n    print(i)\n"] * 5)
    write_documents(root, "val", "web", TEXTS[:4])
    return root


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory, documents) -> Path:
    out = tmp_path_factory.mktemp("tokenizer")
    train_tokenizer(TokenizerConfig(vocab_size=400, sample_bytes=100_000), documents, out, seed=0)
    return out


def make_stream(tokens_dir: Path, split: str, sources: dict[str, list[np.ndarray]], shard_tokens: int = 1000):
    """Write token shards by hand: each document's tokens (EOS is *not* added here)."""
    tokens_dir.mkdir(parents=True, exist_ok=True)
    meta = {"dtype": "uint16", "vocab_size": 65536, "eos_id": 1, "bos_id": 0, "pad_id": 2}
    (tokens_dir / META_JSON).write_text(json.dumps(meta))
    for source, docs in sources.items():
        writer = ShardWriter(tokens_dir / split / source, np.dtype("<u2"), shard_tokens)
        for doc in docs:
            writer.write_batch(np.asarray(doc, dtype="<u2"), np.array([len(doc)], dtype=np.int64))
        writer.close()


@pytest.fixture
def counting_stream(tmp_path) -> tuple[Path, np.ndarray]:
    """A train split whose stream is 0, 1, 2, ..., 10_000 (as uint16) over two sources and many shards."""
    stream = np.arange(10_001, dtype=np.int64)
    cuts = [0, 37, 500, 1234, 3000, 5000, 5001, 7777, 10_001]
    docs = [stream[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    # sorted source order: "a" comes before "b"
    make_stream(tmp_path / "tokens", "train", {"b": docs[5:], "a": docs[:5]}, shard_tokens=900)
    return tmp_path / "tokens", stream


def random_documents(rng: np.random.Generator, n: int, low: int, high: int) -> list[np.ndarray]:
    """n documents of random lengths in [low, high), tokens 10..999, each ending in EOS (1)."""
    docs = []
    for _ in range(n):
        doc = rng.integers(10, 1000, int(rng.integers(low, high)))
        doc[-1] = 1
        docs.append(doc)
    return docs


@pytest.fixture(scope="session")
def mixed(tmp_path_factory) -> Path:
    """A train split of three sources of different sizes (web ~50k, code ~25k, math ~3k tokens)."""
    rng = np.random.default_rng(7)
    root = tmp_path_factory.mktemp("mixed") / "tokens"
    sources = {
        "web": random_documents(rng, 500, 2, 200),
        "code": random_documents(rng, 100, 20, 480),
        "math": random_documents(rng, 60, 5, 100),
    }
    make_stream(root, "train", sources, shard_tokens=4000)
    return root
