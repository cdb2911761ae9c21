"""A special token's text in a document (`<|eos|>` in a web page, `<|user|>` in a Python file) is
ordinary text on every backend: special ids come only from the pipeline (EOS between documents, the
chat template, FIM)."""

from __future__ import annotations

import pytest

from smelt.chat_template import END_OF_TURN, ChatFormat, role_token
from smelt.tokenizer.load import BACKEND_ENV, Tokenizer

MENTIONS = [
    "A web page about tokenizers: the model stops at <|eos|> and starts at <|bos|>.",
    'if token == "<|eos|>":\n    break\nprompt = "<|user|>hi<|end_of_turn|><|assistant|>"\n',
    "FIM: <|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>x",
    "<|eos|><|eos|><|pad|><|reserved_3|><|system|><|tool|>",
    "no special text here",
]


def _backends() -> list[str]:
    backends = ["hf"]
    for module, name in (("tiktoken", "tiktoken"), ("numba", "native")):
        try:
            __import__(module)
            backends.append(name)
        except ImportError:
            pass
    return backends


@pytest.mark.parametrize("backend", _backends())
def test_special_token_text_never_gives_a_special_id(backend, real_tokenizer, monkeypatch):
    directory, _ = real_tokenizer
    monkeypatch.setenv(BACKEND_ENV, backend)
    tok = Tokenizer.load(directory)
    assert tok.backend == backend
    specials = tok.special_ids()
    assert {
        tok.eos_id,
        tok.bos_id,
        tok.token_to_id("<|user|>"),
        tok.token_to_id("<|fim_prefix|>"),
    } <= specials
    for ids, text in zip(tok.encode_batch(MENTIONS), MENTIONS, strict=True):
        assert not set(ids) & specials, (backend, text)
        assert tok.decode(ids) == text
    flat, counts = tok.encode_flat(MENTIONS)
    assert not set(flat.tolist()) & specials and int(counts.sum()) == len(flat)
    assert tok.encode(MENTIONS[0]) == tok.encode_batch(MENTIONS)[0]


def test_backends_agree_on_special_token_text(real_tokenizer, monkeypatch):
    directory, _ = real_tokenizer
    encoded = {}
    for backend in _backends():
        monkeypatch.setenv(BACKEND_ENV, backend)
        encoded[backend] = Tokenizer.load(directory).encode_batch(MENTIONS)
    assert all(ids == encoded["hf"] for ids in encoded.values())


def test_special_text_counts(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    counts = tok.special_text_counts(MENTIONS)
    once = ["<|bos|>", "<|pad|>", "<|user|>", "<|assistant|>", "<|system|>", "<|tool|>", "<|end_of_turn|>"]
    once += ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|reserved_3|>"]
    assert counts == {"<|eos|>": 4, **dict.fromkeys(once, 1)}
    assert "<|reserved_3|>" in tok.special_texts and "<|eos|>" in tok.special_texts


def test_chat_template_takes_role_ids_from_the_template_not_the_text(real_tokenizer):
    tok = Tokenizer.load(real_tokenizer[0])
    chat = ChatFormat(tok)
    messages = [
        {"role": "user", "content": "What does <|assistant|> mean?<|end_of_turn|><|user|>"},
        {"role": "assistant", "content": "A role token: <|eos|> ends a document."},
    ]
    encoded = chat.encode(messages)
    user, assistant = chat.role_ids[role_token("user")], chat.role_ids[role_token("assistant")]
    end = chat.role_ids[END_OF_TURN]
    # one role id per message and one end of turn per message, where the template puts them
    assert encoded.ids.count(user) == 1 and encoded.ids.count(assistant) == 1 and encoded.ids.count(end) == 2
    assert encoded.ids.count(tok.eos_id) == 1 and encoded.ids[0] == tok.eos_id
    assert encoded.ids[1] == user and encoded.ids[encoded.ids.index(end) + 1] == assistant
    assert tok.decode(encoded.ids[2 : encoded.ids.index(end)]) == messages[0]["content"]
    assert chat.reply_ids("<|end_of_turn|>").count(end) == 1
