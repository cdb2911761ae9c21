"""`smelt inspect shards`: a decoded window with document boundaries, and token frequencies."""

from __future__ import annotations

import pytest

from smelt.config import TokensConfig
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer
from smelt.tokens.decoded import describe_window, token_frequencies
from smelt.tokens.shards import ShardSet
from smelt.tokens.tokenize import tokenize

from .conftest import TEXTS


def test_describe_window_marks_documents(tmp_path, documents, tokenizer_dir):
    out = tmp_path / "tokens"
    tokenize(TokensConfig(), documents, tokenizer_dir, out)
    shards = ShardSet(out, "val", "web")
    starts = shards.document_starts()
    # from the middle of document 0 to the middle of document 2
    text = describe_window(out, "val", "web", 0, int(starts[0]) + 3, int(starts[2]) + 2, tokenizer_dir)
    assert "documents 0..2" in text
    assert "(document 0 began at offset 0)" in text
    assert (
        f"document 1 (shard offset {starts[1]})" in text and f"document 2 (shard offset {starts[2]})" in text
    )
    assert TEXTS[1] + "<|eos|>" in text  # a whole document is decoded as it was written
    assert "window: " in text and "shard 00000: " in text and "<|eos|>" in text.split("window: ")[1]
    with pytest.raises(UserError, match="no shard 00007 for val/web"):
        describe_window(out, "val", "web", 7, 0, 10, tokenizer_dir)
    with pytest.raises(UserError, match="outside shard 00000"):
        describe_window(out, "val", "web", 0, 10**6, 10, tokenizer_dir)


def test_token_frequencies(tokenizer_dir):
    tok = Tokenizer.load(tokenizer_dir)
    ids = tok.encode("aaa aaa aaa b") + [tok.eos_id]
    import numpy as np

    freq = token_frequencies(np.asarray(ids, dtype=np.uint16), tok, top=3)
    assert freq["tokens"] == len(ids) and freq["special_share"] == pytest.approx(1 / len(ids), abs=1e-4)
    assert freq["top"][0]["count"] >= 3 and freq["distinct"] == len(set(ids))


def test_describe_batch_decodes_the_step(tmp_path, documents, tokenizer_dir):
    from smelt.config import config_from_dict
    from smelt.tokens.decoded import describe_batch
    from smelt.tokens.loader import TokenLoader

    out = tmp_path / "tokens"
    tokenize(TokensConfig(), documents, tokenizer_dir, out)
    cfg = config_from_dict(
        {
            "model": {"max_seq_len": 32},
            "train": {"seq_len": 32, "micro_batch": 2, "batch_tokens": 128, "tokens": 1280},
            "tokens": {
                "allow_repeat": True,
                "stages": [
                    {"name": "broad", "fraction": 0.5},
                    {"name": "code-only", "fraction": 0.5, "mixture": {"code": 1}},
                ],
            },
        }
    )
    text = describe_batch(cfg, 7, rows=2, tokens_dir=out, tokenizer_dir=tokenizer_dir)
    assert text.startswith(
        "step 7 of 10: stage 'code-only' (2 of 2, steps 6-10); global batch 4 sequences x 32"
    )
    assert "sources: code 4" in text and "row 1: code sequence" in text and "row 2" not in text
    batch = TokenLoader.from_config(cfg, out, tokenizer_dir).global_batch(7)
    tok = Tokenizer.load(tokenizer_dir)
    assert tok.decode(batch.inputs[0, : int((batch.doc_ids[0] == batch.doc_ids[0, 0]).sum())]) in text
    everything = describe_batch(cfg, 2, rows=0, tokens_dir=out, tokenizer_dir=tokenizer_dir)
    assert everything.count("──────── row") == 4 and "document boundary (position" in everything
    with pytest.raises(UserError, match=r"--step 11 is outside this run's steps 1..10"):
        describe_batch(cfg, 11, tokens_dir=out, tokenizer_dir=tokenizer_dir)
