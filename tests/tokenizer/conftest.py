"""Fixtures for tokenizer tests: documents parquet written from synthetic and real text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import write_documents
from smelt.config import TokenizerConfig
from smelt.tokenizer.train import train_tokenizer

SYNTHETIC = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "def add(a, b):\n\treturn a + b  \n\nprint(add(1234567, 89))\n",
    "Numbers: 3.14159, 2718281828, 42 and 1000000.",
    "Grüße aus Köln — café, naïve, façade. Ünïcödé everywhere!",
    "東京は日本の首都です。北京是中国的首都。",
    "مرحبا بالعالم. هذه جملة عربية.",
    "Привет, мир! Это русский текст.",
    "Emoji: 🙂🚀👩‍💻 and flags 🇫🇷🇯🇵.",
]


def real_texts(shared_data: Path) -> dict[str, list[str]]:
    """English prose, Python code and zh/ar/ru sentences from the shared corpus, as documents."""
    corpus = shared_data / "corpus"
    prose = (corpus / "prose" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    prose_docs = [prose[i : i + 3000] for i in range(0, 600_000, 3000)]
    code_docs = []
    with open(corpus / "code" / "cpython_stdlib_lib.jsonl", encoding="utf-8") as handle:
        for line in handle:
            code_docs.append(json.loads(line)["text"])
            if len(code_docs) >= 40:
                break
    multi = []
    for lang in ("zh", "ar", "ru"):
        lines = (
            (corpus / "multilingual" / "lingua-testdata-A" / "sentences" / f"{lang}.txt")
            .read_text(encoding="utf-8")
            .splitlines()
        )
        multi += ["\n".join(lines[i : i + 10]) for i in range(0, 200, 10)]
    return {"prose": prose_docs, "code": code_docs, "multi": multi}


@pytest.fixture(scope="session")
def real_documents(tmp_path_factory, shared_data) -> Path:
    root = tmp_path_factory.mktemp("real_documents")
    for source, docs in real_texts(shared_data).items():
        held = max(2, len(docs) // 10)
        write_documents(root, "train", source, docs[:-held])
        write_documents(root, "val", source, docs[-held:])
    return root


@pytest.fixture(scope="session")
def real_tokenizer(tmp_path_factory, real_documents) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("real_tokenizer")
    cfg = TokenizerConfig(vocab_size=1000, sample_bytes=800_000)
    stats = train_tokenizer(cfg, real_documents, out, seed=7)
    return out, stats


@pytest.fixture(scope="session")
def synthetic_documents(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthetic_documents")
    write_documents(root, "train", "mixed", SYNTHETIC * 4)
    write_documents(root, "train", "other", [t.upper() for t in SYNTHETIC])
    write_documents(root, "val", "mixed", SYNTHETIC[:3])
    return root
