"""Load the tokenizer artifact: `tokenizer.json` (Hugging Face format) + `smelt.json` (ids, padded size)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from smelt.errors import UserError

TOKENIZER_JSON = "tokenizer.json"
SMELT_JSON = "smelt.json"


def tokenizer_hash(directory: str | Path) -> str:
    """sha256 of `tokenizer.json` and `smelt.json`: what token shards record to catch a changed tokenizer."""
    digest = hashlib.sha256()
    for name in (TOKENIZER_JSON, SMELT_JSON):
        data = (Path(directory) / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


class Tokenizer:
    """A trained smelt tokenizer. `encode` never adds special tokens; `vocab_size` is the padded size."""

    def __init__(self, inner: tokenizers.Tokenizer, info: dict[str, Any], directory: Path | None = None):
        self.inner = inner
        self.info = info
        self.directory = directory
        self.bos_id: int = int(info["bos_id"])
        self.eos_id: int = int(info["eos_id"])
        self.pad_id: int = int(info["pad_id"])
        self.vocab_size: int = int(info["vocab_size"])
        self.special_tokens: dict[str, int] = dict(info.get("special_tokens", {}))
        self.hash: str = str(info.get("hash", ""))
        if inner.get_vocab_size(with_added_tokens=True) != self.vocab_size:
            raise UserError(
                f"tokenizer in {directory}: tokenizer.json has {inner.get_vocab_size(with_added_tokens=True)} "
                f"tokens but smelt.json says vocab_size = {self.vocab_size}. Re-run `smelt tokenizer train "
                f"CONFIG --force`."
            )

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        directory = Path(directory)
        tok_path, info_path = directory / TOKENIZER_JSON, directory / SMELT_JSON
        for path in (tok_path, info_path):
            if not path.is_file():
                raise UserError(
                    f"no tokenizer at {directory}: {path.name} is missing. Run `smelt tokenizer train CONFIG` "
                    f"first."
                )
        try:
            inner = tokenizers.Tokenizer.from_file(str(tok_path))
            info = json.loads(info_path.read_text(encoding="utf-8"))
        except Exception as exc:
            raise UserError(
                f"tokenizer at {directory} cannot be read ({exc}). Re-run `smelt tokenizer train CONFIG --force`."
            ) from exc
        info = {**info, "hash": tokenizer_hash(directory)}
        return cls(inner, info, directory)

    # -- encoding ---------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once (multi-threaded in Rust); no special tokens are added."""
        fast = getattr(self.inner, "encode_batch_fast", None) or self.inner.encode_batch
        return [enc.ids for enc in fast(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.inner.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    # -- introspection ----------------------------------------------------------------------------

    def special_ids(self) -> set[int]:
        """Ids of every added special token: the configured ones and the reserved padding tokens."""
        return {int(i) for i, added in self.inner.get_added_tokens_decoder().items() if added.special}

    def token_byte_lengths(self) -> np.ndarray:
        """UTF-8 byte length of every id's text (int64, length vocab_size); 0 for special and reserved ids.

        Byte-level BPE spells every byte as one character of its alphabet, so a regular token's length
        in bytes is its length in characters. Used to turn per-token losses into bits per byte.
        """
        lengths = np.zeros(self.vocab_size, dtype=np.int64)
        specials = self.special_ids()
        for token, index in self.inner.get_vocab(with_added_tokens=False).items():
            if index not in specials:
                lengths[index] = len(token)
        return lengths

    def describe(self) -> dict[str, Any]:
        """A short summary for tables and `smelt inspect`."""
        return {
            "vocab_size": self.vocab_size,
            "trained_vocab_size": self.info.get("trained_vocab_size"),
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "special_tokens": self.special_tokens,
            "pattern": self.info.get("pattern"),
            "sample_bytes_used": self.info.get("sample_bytes_used"),
            "sample_documents": self.info.get("sample_documents"),
        }

    stats = describe

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, directory={str(self.directory)!r})"
