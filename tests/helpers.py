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
