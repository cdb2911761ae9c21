"""Helpers shared by tests of several stages."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_documents(root: Path, split: str, source: str, texts: list[str], part: int = 0) -> Path:
    """Write one documents part with the curate stage's columns (the documents artifact contract)."""
    directory = root / split / source
    directory.mkdir(parents=True, exist_ok=True)
    n = len(texts)
    table = pa.table(
        {
            "id": [f"{source}:{part}:{i}" for i in range(n)],
            "text": texts,
            "source": [source] * n,
            "url": [""] * n,
            "lang": [""] * n,
            "meta": ["{}"] * n,
        }
    )
    path = directory / f"part-{part:05d}.parquet"
    pq.write_table(table, path)
    return path


def tiny_model_config(**overrides):
    """A 2-layer, d=64 GQA model config for fast model tests; keys override."""
    from smelt.config import ModelConfig

    base = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64)
    base.update(overrides)
    return ModelConfig(**base)


def build_model(cfg, vocab: int = 384, seed: int = 0):
    """A freshly initialized Transformer under a fixed seed (384 = 256 bytes + specials, padded)."""
    import torch

    from smelt.model.transformer import Transformer

    torch.manual_seed(seed)
    return Transformer(cfg, vocab)


VOCAB = 384  # 256 bytes + 128 padding
EOS = 257


def write_split(tokens_dir: Path, split: str, n_docs: int, seed: int, source: str = "synth") -> None:
    """Synthetic documents of counting sequences (learnable), as flat uint16 shards with an .idx."""
    import numpy as np

    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        start, step, length = rng.integers(0, 256), rng.integers(1, 4), rng.integers(20, 120)
        docs.append(np.append((start + step * np.arange(length)) % 256, EOS))
    offsets = np.cumsum([0] + [len(d) for d in docs[:-1]]).astype("<i8")
    out = tokens_dir / split / source
    out.mkdir(parents=True, exist_ok=True)
    np.concatenate(docs).astype("<u2").tofile(out / "00000.bin")
    offsets.tofile(out / "00000.idx")


def write_token_data(root: Path) -> tuple[Path, Path]:
    """A tokens directory (train 400 docs, val 20) and a byte-level tokenizer stub for trainer tests."""
    import json

    tokens = root / "tokens"
    tokens.mkdir()
    (tokens / "meta.json").write_text(
        json.dumps({"dtype": "uint16", "vocab_size": VOCAB, "eos_id": EOS, "bos_id": 256, "pad_id": 258})
    )
    write_split(tokens, "train", 400, seed=0)
    write_split(tokens, "val", 20, seed=1)
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    (tokenizer / "smelt.json").write_text(
        json.dumps({"vocab_size": VOCAB, "bos_id": 256, "eos_id": EOS, "pad_id": 258})
    )
    return tokens, tokenizer
