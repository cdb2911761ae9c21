"""Tokenizer training and loading: round trips, special ids, padding, digits, determinism, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unicodedata

import numpy as np
import pyarrow.parquet as pq
import pytest

from smelt.config import TokenizerConfig
from smelt.errors import UserError
from smelt.tokenizer.load import Tokenizer
from smelt.tokenizer.sample import Sample, sample_texts
from smelt.tokenizer.train import train_tokenizer

from .conftest import write_documents

ROUND_TRIP = [
    "Hello, world! The quick brown fox.",
    "def f(x):\n\tif x:  \n\t\treturn x   \n\n\n    pass\t \n",
    "emoji 🙂🚀 family 👩‍👩‍👧 flag 🇯🇵 skin 👍🏽",
    "中文文本和日本語のテキスト，한국어 텍스트。",
    "العربية من اليمين إلى اليسار، مع أرقام ١٢٣ و 456.",
    "Combining marks that NFC keeps: q\u0307 x\u0323\u0301 ñ Z\u0335\u0321 हिन्दी",
    "control-ish: \r\n tabs\t\t and \u00a0 nbsp, zero-width \u200b joiner",
    "   leading and trailing spaces   ",
    "",
]


def test_round_trip_real(real_tokenizer):
    directory, _ = real_tokenizer
    tok = Tokenizer.load(directory)
    for text in ROUND_TRIP:
        assert unicodedata.is_normalized("NFC", text)
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode_batch(ROUND_TRIP) == [tok.encode(t) for t in ROUND_TRIP]


def test_nfc_is_applied(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    assert tok.decode(tok.encode("cafe\u0301")) == "caf\u00e9"


def test_no_unknown_tokens_and_every_byte_covered(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    rare = "".join(chr(c) for c in (0x1, 0x7F, 0x10FFFF, 0xE000, 0x1D11E, 0x2603))
    ids = tok.encode(rare)
    assert tok.decode(ids) == rare
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.inner.get_vocab().keys() >= {"Ā", "ÿ", "a"}  # byte-level alphabet is complete
    assert tok.inner.model.unk_token is None


def test_special_ids_and_padding(real_tokenizer):
    directory, stats = real_tokenizer
    tok = Tokenizer.load(directory)
    info = json.loads((directory / "smelt.json").read_text())
    assert (tok.bos_id, tok.eos_id, tok.pad_id) == (0, 1, 2)
    named = ["<|bos|>", "<|eos|>", "<|pad|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
    named += ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end_of_turn|>"]
    assert info["special_tokens"] == {t: i for i, t in enumerate(named)}
    # vocab_size 1000 minus 64 spares is trained; padding to 1024 leaves 88 >= 64 reserved tokens
    assert info["trained_vocab_size"] == 936 == stats["trained_vocab_size"]
    assert info["vocab_size"] == info["padded_vocab_size"] == tok.vocab_size == 1024
    assert info["reserved_tokens"] == 88 >= 64
    assert tok.vocab_size % 128 == 0
    assert tok.inner.get_vocab_size(with_added_tokens=True) == 1024
    # every padded row is a real token that decodes as a special one
    assert tok.id_to_token(936) == "<|reserved_0|>"
    assert tok.id_to_token(1023) == "<|reserved_87|>"
    assert tok.decode([1023, 1]) == "<|reserved_87|><|eos|>"
    assert tok.decode([20, 1023], skip_special_tokens=True) == tok.decode([20])
    # a special token's text in raw input is ordinary text: it never becomes the special id
    for text in ("<|eos|>", "<|fim_middle|>x<|user|>", "<|user|>"):
        assert not set(tok.encode(text)) & tok.special_ids() and tok.decode(tok.encode(text)) == text
    assert len(tok.special_ids()) == 11 + 88
    assert info["sample_documents"] > 0 and 0 < info["sample_bytes_used"] <= 800_000


def test_specials_can_be_turned_off(tmp_path, synthetic_documents):
    cfg = TokenizerConfig(
        vocab_size=300,
        pad_to_multiple=64,
        sample_bytes=10_000,
        fim_tokens=False,
        chat_tokens=False,
        spare_tokens=0,
    )
    train_tokenizer(cfg, synthetic_documents, tmp_path / "tok", seed=0)
    tok = Tokenizer.load(tmp_path / "tok")
    assert list(tok.special_tokens) == ["<|bos|>", "<|eos|>", "<|pad|>"]
    assert tok.vocab_size == 320


def test_token_byte_lengths(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    lengths = tok.token_byte_lengths()
    assert lengths.dtype == np.int64 and lengths.shape == (tok.vocab_size,)
    assert (lengths[:11] == 0).all() and (lengths[936:] == 0).all()
    assert (lengths[11:936] >= 1).all()
    text = "Thou art more lovely and more temperate: 你好 🙂"
    ids = tok.encode(text)
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_digits_split_in_groups_of_three(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    for text in ("1234567", "in 2024 we paid 123456789012 dollars", "٠١٢٣٤٥٦٧"):
        pieces = [tok.decode([i]) for i in tok.encode(text)]
        assert all(sum(ch.isdigit() for ch in piece) <= 3 for piece in pieces), pieces
    assert tok.decode(tok.encode("1234567")) == "1234567"


def test_real_bytes_per_token(real_tokenizer, real_documents):
    directory, stats = real_tokenizer
    tok = Tokenizer.load(directory)
    prose = pq.read_table(real_documents / "val" / "prose" / "part-00000.parquet").column("text").to_pylist()
    english = "".join(prose)
    assert len(english.encode()) / len(tok.encode(english)) > 2.0
    assert stats["val_bytes_per_token"] > 2.0
    assert stats["val_documents"] > 0 and stats["sample_documents"] > 0


@pytest.mark.slow
def test_deterministic(tmp_path, synthetic_documents):
    cfg = TokenizerConfig(vocab_size=400, pad_to_multiple=64, sample_bytes=10_000, min_frequency=1)
    train_tokenizer(cfg, synthetic_documents, tmp_path / "a", seed=3)
    train_tokenizer(cfg, synthetic_documents, tmp_path / "b", seed=3)
    a = (tmp_path / "a" / "tokenizer.json").read_bytes()
    assert a == (tmp_path / "b" / "tokenizer.json").read_bytes()
    assert (tmp_path / "a" / "smelt.json").read_bytes() == (tmp_path / "b" / "smelt.json").read_bytes()
    # and in a fresh process (hash seeds and thread pools differ)
    code = (
        "import sys; from pathlib import Path; from smelt.config import TokenizerConfig; "
        "from smelt.tokenizer.train import train_tokenizer; "
        "train_tokenizer(TokenizerConfig(vocab_size=400, pad_to_multiple=64, sample_bytes=10_000, "
        "min_frequency=1), Path(sys.argv[1]), Path(sys.argv[2]), seed=3)"
    )
    env = {**os.environ, "SMELT_QUIET": "1"}
    subprocess.run(
        [sys.executable, "-c", code, str(synthetic_documents), str(tmp_path / "c")], check=True, env=env
    )
    assert a == (tmp_path / "c" / "tokenizer.json").read_bytes()


def test_synthetic_vocab_and_pattern_choices(tmp_path, synthetic_documents):
    for pattern in ("gpt2", r"\p{L}+|\p{N}|[^\p{L}\p{N}]+"):
        cfg = TokenizerConfig(vocab_size=400, pad_to_multiple=128, sample_bytes=10_000, pattern=pattern)
        out = tmp_path / pattern.replace("\\", "").replace("|", "")[:8]
        stats = train_tokenizer(cfg, synthetic_documents, out, seed=0)
        tok = Tokenizer.load(out)
        assert tok.vocab_size == 512 == stats["padded_vocab_size"]
        for text in ROUND_TRIP:
            assert tok.decode(tok.encode(text)) == text


def test_small_data_trains_fewer_tokens_and_still_pads(tmp_path):
    docs = tmp_path / "docs"
    write_documents(docs, "train", "tiny", ["abc abc abd"])
    cfg = TokenizerConfig(vocab_size=5000, pad_to_multiple=128, sample_bytes=1000)
    stats = train_tokenizer(cfg, docs, tmp_path / "tok", seed=0)
    assert stats["trained_vocab_size"] < 5000 and "note" in stats
    assert stats["padded_vocab_size"] % 128 == 0
    assert "val_bytes_per_token" not in stats  # no val split


def test_sample_respects_budget_and_seed(tmp_path):
    docs = tmp_path / "docs"
    texts = [f"document number {i} " + "x" * (i % 50) for i in range(2000)]
    write_documents(docs, "train", "a", texts[:1000])
    write_documents(docs, "train", "b", texts[1000:])

    def draw(seed, budget):
        sample = Sample()
        got = [t for batch in sample_texts(docs, "train", budget, seed, sample) for t in batch]
        assert sample.bytes == sum(len(t.encode()) for t in got) <= budget
        return got

    a, b, c = draw(1, 8_000), draw(1, 8_000), draw(2, 8_000)
    assert a == b and a != c
    assert any(t in texts[:1000] for t in a) and any(t in texts[1000:] for t in a)
    assert draw(0, 10**9) == texts  # the whole split when it fits


def test_too_small_vocab_is_a_user_error(tmp_path, synthetic_documents):
    cfg = TokenizerConfig(vocab_size=258)  # bypasses config validation: 256 bytes + 11 specials + 64 spares
    with pytest.raises(
        UserError, match=r"tokenizer.vocab_size = 258 is too small.*spare_tokens = 64.*>= 331"
    ):
        train_tokenizer(cfg, synthetic_documents, tmp_path / "tok", seed=0)


def test_invalid_pattern_is_a_user_error(tmp_path, synthetic_documents):
    cfg = TokenizerConfig(vocab_size=400, pattern="(unclosed")
    with pytest.raises(UserError, match=r"tokenizer.pattern = '\(unclosed' is not a valid regex"):
        train_tokenizer(cfg, synthetic_documents, tmp_path / "tok", seed=0)


def test_missing_or_empty_train_split(tmp_path):
    cfg = TokenizerConfig(vocab_size=400)
    with pytest.raises(UserError, match="Run `smelt curate CONFIG` first"):
        train_tokenizer(cfg, tmp_path / "nothing", tmp_path / "tok", seed=0)
    docs = tmp_path / "docs"
    write_documents(docs, "train", "empty", ["", ""])
    with pytest.raises(UserError, match="holds no non-empty documents"):
        train_tokenizer(cfg, docs, tmp_path / "tok", seed=0)


def test_load_errors(tmp_path, real_tokenizer):
    with pytest.raises(UserError, match="tokenizer.json is missing.*smelt tokenizer train"):
        Tokenizer.load(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "smelt.json").write_text("{}")
    with pytest.raises(UserError, match="cannot be read"):
        Tokenizer.load(broken)
    describe = Tokenizer.load(real_tokenizer[0]).describe()
    assert describe["vocab_size"] == 1024 and describe["pattern"] == "gpt4"


def test_tokenizer_json_is_standard_hf_format(real_tokenizer):
    data = json.loads((real_tokenizer[0] / "tokenizer.json").read_text())
    assert data["model"]["type"] == "BPE"
    assert data["normalizer"]["type"] == "NFC"
    assert [p["type"] for p in data["pre_tokenizer"]["pretokenizers"]] == ["Split", "ByteLevel"]
    assert data["decoder"]["type"] == "ByteLevel"
    assert len(data["added_tokens"]) == 11 + 88 and all(t["special"] for t in data["added_tokens"])


def test_round_trip_every_document_of_a_shared_corpus_sample(real_tokenizer, shared_data):
    tok = Tokenizer.load(real_tokenizer[0])
    corpus = shared_data / "corpus"
    docs = []
    with open(corpus / "code" / "rustpython_stdlib_crate_rs.jsonl", encoding="utf-8") as handle:
        docs += [json.loads(line)["text"] for _, line in zip(range(30), handle, strict=False)]
    udhr = sorted((corpus / "multilingual" / "nltk_udhr2").glob("*.txt"))
    docs += [p.read_text(encoding="utf-8", errors="replace") for p in udhr[::8]]
    docs += [(corpus / "prose" / "gutenberg" / "11-0.txt").read_text(encoding="utf-8")[:200_000]]
    docs = [unicodedata.normalize("NFC", d) for d in docs]
    assert len(docs) > 70
    for doc, ids in zip(docs, tok.encode_batch(docs), strict=True):
        assert tok.decode(ids) == doc


def test_loads_in_transformers_and_encodes_identically(real_tokenizer):
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.load(real_tokenizer[0])
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(real_tokenizer[0] / "tokenizer.json"))
    assert len(hf) == tok.vocab_size
    for text in ROUND_TRIP:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text)
        assert hf.decode(tok.encode(text)) == tok.decode(tok.encode(text))
    # A special token's text: smelt encodes it as ordinary text, as transformers does with
    # split_special_tokens=True; by default transformers matches it (what a rendered chat template needs).
    for text in ("<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|user|>hi<|end_of_turn|>"):
        ids = tok.encode(text)
        assert hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"] == ids
        assert not set(ids) & tok.special_ids() and hf.decode(ids) == text
    assert hf("<|user|>hi<|end_of_turn|>", add_special_tokens=False)["input_ids"] == [
        7,
        *tok.encode("hi"),
        10,
    ]
