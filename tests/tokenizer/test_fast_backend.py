"""The tiktoken backend encodes exactly as Hugging Face does, token for token, on real text."""

import json

import pytest

from smelt.tokenizer.load import BACKEND_ENV, PROBES, Tokenizer, tiktoken_encoding

from .conftest import SYNTHETIC, real_texts

pytest.importorskip("tiktoken")


def _texts(shared_data):
    corpus = shared_data / "corpus"
    texts = [t for docs in real_texts(shared_data).values() for t in docs]
    udhr = sorted((corpus / "multilingual" / "nltk_udhr2").glob("*.txt"))
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in udhr[::4]]
    with open(corpus / "code" / "rustpython_stdlib_crate_rs.jsonl", encoding="utf-8") as handle:
        texts += [json.loads(line)["text"] for line in handle][:20]
    return texts + SYNTHETIC + list(PROBES)


def test_tiktoken_matches_hf_token_for_token(real_tokenizer, shared_data, monkeypatch):
    directory, _ = real_tokenizer
    fast = Tokenizer.load(directory)
    assert fast.backend == "tiktoken"
    monkeypatch.setenv(BACKEND_ENV, "hf")
    slow = Tokenizer.load(directory)
    assert slow.backend == "hf"
    texts = _texts(shared_data)
    assert len(texts) > 300
    assert fast.encode_batch(texts) == slow.encode_batch(texts)
    assert [fast.encode(t) for t in texts[:50]] == [slow.encode(t) for t in texts[:50]]
    assert fast.encode("a <|eos|> b") == slow.encode("a <|eos|> b") and fast.eos_id in fast.encode("<|eos|>")
    assert fast.decode(fast.encode(texts[0])) == texts[0]


def test_backend_falls_back_when_the_pipeline_is_not_plain_bpe(real_tokenizer):
    directory, _ = real_tokenizer
    tokenizer = Tokenizer.load(directory)
    from tokenizers import normalizers

    tokenizer.inner.normalizer = normalizers.Lowercase()
    assert tiktoken_encoding(tokenizer.inner) is None
    assert tokenizer.backend == "hf" and tokenizer.encode("ABC") == tokenizer.inner.encode("abc").ids
