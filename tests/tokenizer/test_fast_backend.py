"""The fast backends (smelt's compiled encoder and tiktoken) encode exactly as Hugging Face does, token
for token, on real text and on the corners of the pre-tokenization regexes."""

import json

import numpy as np
import pytest

from smelt.config import TokenizerConfig
from smelt.errors import UserError
from smelt.tokenizer.load import BACKEND_ENV, PROBES, Tokenizer, native_encoder, tiktoken_encoding
from smelt.tokenizer.native import CACHE_PIECE_BYTES, LETTER, NEWLINE, NUMBER, OTHER, SPACE, char_classes
from smelt.tokenizer.train import train_tokenizer

from .conftest import SYNTHETIC, real_texts

pytest.importorskip("tiktoken")
pytest.importorskip("numba")

# Each string exercises one branch of the GPT-4 / GPT-2 scanners or the encoder around them.
EDGE_CASES = [
    "'s 'S 'ſ 'ſt 'RE 're 'Ve 'LL 'lL 'd 'D 'x ' s' '",  # contractions: case folding, U+017F long s
    "it's we'RE they'Ll I'M don't o'clock",
    "a\u0085b\u2028c\u00a0d\u3000e\u1680f\u200bg\ufeffh",  # Unicode whitespace and look-alikes
    "x  \r\n  \n y\r\r\n\t\n z \n",  # whitespace runs around newlines: \s*[\r\n]+ backtracking
    "   \n",
    "\n\n\n",
    " ",
    "",
    "\t",
    "  x",
    "x  ",
    "x \t y",
    "12345678 1,234 ½ ① Ⅻ ٣٤٥ 𝟙𝟚𝟛𝟜",  # digit groups of three, other numbers
    "!!! ?\n\n.\r\n;; ...\r\n\r\n",  # punctuation runs taking trailing newlines
    " (a) [b] {c} -x --y",
    "\u1c89\u1c8a \ua7cb\ua7cc x\U000105c0y",  # letters newer than Python's own Unicode tables
    "\U0001f600\U0001f600abc 👩\u200d👩\u200d👧 🇫🇷",
    "e\u0301 cafe\u0301 A\u030a \u212b Å",  # NFC: combining marks, the angstrom sign
    "日本語のテキスト、中文。한국어 텍스트 ภาษาไทย",
    "<|eos|><|bos|>x <|pad|>\ne\u0301<|eos|>",  # added tokens in the raw text
    "\x00\x01\x7f control \x1b[0m",
    "a" * 300 + " " + "ab" * 200 + " " + "한" * 50,  # pieces far longer than the cache holds
    " " * 40 + "x" + "\n" * 30,
    "x" * CACHE_PIECE_BYTES + " " + "y" * (CACHE_PIECE_BYTES + 1) + " " + "z" * (CACHE_PIECE_BYTES - 1),
]


def _texts(shared_data):
    corpus = shared_data / "corpus"
    texts = [t for docs in real_texts(shared_data).values() for t in docs]
    udhr = sorted((corpus / "multilingual" / "nltk_udhr2").glob("*.txt"))
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in udhr[::4]]
    with open(corpus / "code" / "rustpython_stdlib_crate_rs.jsonl", encoding="utf-8") as handle:
        texts += [json.loads(line)["text"] for line in handle][:20]
    return texts + SYNTHETIC + list(PROBES) + EDGE_CASES


def _load(directory, monkeypatch, backend: str) -> Tokenizer:
    monkeypatch.setenv(BACKEND_ENV, backend)
    tokenizer = Tokenizer.load(directory)
    assert tokenizer.backend == backend
    return tokenizer


@pytest.mark.parametrize("backend", ["native", "tiktoken"])
@pytest.mark.slow
def test_fast_backend_matches_hf_token_for_token(backend, real_tokenizer, shared_data, monkeypatch):
    directory, _ = real_tokenizer
    fast = _load(directory, monkeypatch, backend)
    slow = _load(directory, monkeypatch, "hf")
    texts = _texts(shared_data)
    assert len(texts) > 300
    expected = slow.encode_batch(texts)
    assert fast.encode_batch(texts) == expected
    assert fast.encode_batch(texts) == expected  # again, now largely from the piece cache
    assert [fast.encode(t) for t in texts[:50]] == [slow.encode(t) for t in texts[:50]]
    ids, counts = fast.encode_flat(texts)
    assert ids.dtype == np.int32 and counts.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]
    assert fast.encode("a <|eos|> b") == slow.encode("a <|eos|> b")
    assert fast.eos_id not in fast.encode("<|eos|>")  # a special token's text is ordinary text
    assert fast.decode(fast.encode(texts[0])) == texts[0]


def test_auto_picks_the_native_encoder(real_tokenizer, monkeypatch):
    directory, _ = real_tokenizer
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert Tokenizer.load(directory).backend == "native"


def test_native_gpt2_pattern_matches_hf(real_documents, tmp_path, monkeypatch):
    cfg = TokenizerConfig(vocab_size=600, sample_bytes=300_000, pattern="gpt2")
    train_tokenizer(cfg, real_documents, tmp_path, seed=3)
    native = _load(tmp_path, monkeypatch, "native")
    slow = _load(tmp_path, monkeypatch, "hf")
    texts = EDGE_CASES + SYNTHETIC + list(PROBES)
    assert native.encode_batch(texts) == slow.encode_batch(texts)


@pytest.mark.slow
def test_character_classes_follow_the_regex_engine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    char_classes.cache_clear()
    classes = char_classes()
    assert len(list((tmp_path / "smelt").glob("char_classes-*.npy"))) == 1
    char_classes.cache_clear()
    assert np.array_equal(char_classes(), classes)  # read back from the cache directory
    (next((tmp_path / "smelt").glob("char_classes-*.npy"))).write_bytes(b"torn")
    char_classes.cache_clear()
    assert np.array_equal(char_classes(), classes)  # an unreadable cache file is recomputed
    assert classes[ord("a")] == LETTER and classes[ord("ß")] == LETTER and classes[ord("中")] == LETTER
    assert classes[ord("7")] == NUMBER and classes[ord("½")] == NUMBER and classes[ord("Ⅻ")] == NUMBER
    assert classes[ord(" ")] == SPACE and classes[0x3000] == SPACE and classes[0x85] == SPACE
    assert classes[ord("\n")] == NEWLINE and classes[ord("\r")] == NEWLINE
    assert classes[ord("!")] == OTHER and classes[0x200B] == OTHER and classes[0x1F600] == OTHER
    assert classes[0x1C89] == LETTER  # assigned in Unicode 16; Hugging Face's engine knows it


def test_backends_fall_back_for_a_custom_pattern(real_documents, tmp_path, monkeypatch):
    cfg = TokenizerConfig(vocab_size=400, sample_bytes=200_000, pattern=r"\p{L}+|\p{N}|[^\p{L}\p{N}]+")
    train_tokenizer(cfg, real_documents, tmp_path, seed=3)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    tokenizer = Tokenizer.load(tmp_path)
    assert native_encoder(tokenizer.inner) is None
    assert tokenizer.backend == "tiktoken"
    assert tokenizer.encode_batch(EDGE_CASES) == _load(tmp_path, monkeypatch, "hf").encode_batch(EDGE_CASES)


def test_backend_falls_back_when_the_pipeline_is_not_plain_bpe(real_tokenizer):
    directory, _ = real_tokenizer
    tokenizer = Tokenizer.load(directory)
    from tokenizers import normalizers

    tokenizer.inner.normalizer = normalizers.Lowercase()
    assert native_encoder(tokenizer.inner) is None
    assert tiktoken_encoding(tokenizer.inner) is None
    assert tokenizer.backend == "hf" and tokenizer.encode("ABC") == tokenizer.inner.encode("abc").ids


def test_unknown_backend_is_a_user_error(real_tokenizer, monkeypatch):
    directory, _ = real_tokenizer
    monkeypatch.setenv(BACKEND_ENV, "fastest")
    with pytest.raises(UserError, match=BACKEND_ENV):
        Tokenizer.load(directory).encode("x")


def test_a_native_encoder_that_cannot_run_falls_back_with_a_warning(real_tokenizer, monkeypatch, capsys):
    import smelt.tokenizer.native as native

    def broken(*args, **kwargs):
        raise RuntimeError("no LLVM target for this CPU")

    monkeypatch.setattr(native, "encode_documents", broken)
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    directory, _ = real_tokenizer
    tokenizer = Tokenizer.load(directory)
    assert tokenizer.backend == "tiktoken"
    assert "native tokenizer encoder cannot run" in capsys.readouterr().err
    assert tokenizer.encode("Hello world") == _load(directory, monkeypatch, "hf").encode("Hello world")
