"""A document that mentions `<|eos|>` (or any special token's text) gets no special id in its shard:
EOS comes only between documents, and the tokenize stats count the text it holds."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq

from smelt.config import TokensConfig
from smelt.tokenizer.load import Tokenizer
from smelt.tokens.tokenize import tokenize

from .conftest import TEXTS, write_documents

MENTIONS = [
    "The model stops at <|eos|> and a chat turn opens with <|user|>.",
    'if token == "<|eos|>":\n    break  # <|fim_prefix|> too\n',
    "plain text",
    "<|eos|><|eos|><|reserved_0|>",
]


def _documents(root):
    write_documents(root, "train", "web", TEXTS + MENTIONS)
    write_documents(root, "train", "web", MENTIONS[:2], part=1)
    write_documents(root, "val", "web", MENTIONS[2:])
    return root


def test_special_token_text_stays_text_in_the_shards(tmp_path, tokenizer_dir):
    documents = _documents(tmp_path / "documents")
    out = tmp_path / "tokens"
    stats = tokenize(TokensConfig(shard_tokens=100_000, batch_docs=3), documents, tokenizer_dir, out)
    tok = Tokenizer.load(tokenizer_dir)
    specials = tok.special_ids()
    for split in ("train", "val"):
        texts = []
        for part in sorted((documents / split / "web").glob("part-*.parquet")):
            texts += pq.read_table(part).column("text").to_pylist()
        data = np.fromfile(out / split / "web" / "00000.bin", dtype="<u2")
        offsets = np.fromfile(out / split / "web" / "00000.idx", dtype="<i8").tolist() + [len(data)]
        for text, start, end in zip(texts, offsets[:-1], offsets[1:], strict=True):
            doc = data[start:end].tolist()
            assert doc[-1] == tok.eos_id and not set(doc[:-1]) & specials  # EOS only at the end
            assert tok.decode(doc[:-1]) == text
    train = stats["splits"]["train"]["sources"]["web"]
    assert train["special_text"] == {"<|eos|>": 6, "<|fim_prefix|>": 2, "<|user|>": 2, "<|reserved_0|>": 1}
    assert train["special_text_documents"] == 5
    val = stats["splits"]["val"]["sources"]["web"]
    assert val["special_text"] == {"<|eos|>": 2, "<|reserved_0|>": 1} and val["special_text_documents"] == 1
    on_disk = json.loads((out / "stats.json").read_text())
    assert on_disk["special_text"] == {"<|eos|>": 8, "<|fim_prefix|>": 2, "<|user|>": 2, "<|reserved_0|>": 2}


def test_special_text_counts_survive_a_resume(tmp_path, tokenizer_dir):
    documents = _documents(tmp_path / "documents")
    cfg = TokensConfig(shard_tokens=64, batch_docs=2)
    first = tokenize(cfg, documents, tokenizer_dir, tmp_path / "tokens")
    again = tokenize(cfg, documents, tokenizer_dir, tmp_path / "tokens")
    assert again["resumed_shards"] > 0
    assert again["special_text"] == first["special_text"] and first["special_text"]["<|eos|>"] == 8
    assert again["splits"] == first["splits"]
