"""Load the tokenizer artifact: `tokenizer.json` (Hugging Face format) + `smelt.json` (ids, padded size)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tokenizers

from smelt.errors import UserError
from smelt.layout import TOKENIZER_INFO, TOKENIZER_JSON

SMELT_JSON = TOKENIZER_INFO
# `auto`: encode with smelt's compiled encoder (about 15x Hugging Face on one core), else tiktoken's BPE
# core (about 6x), whichever can run the tokenizer and agrees with Hugging Face on the probes below;
# `native`/`tiktoken` stop at that one, `hf` always encodes with Hugging Face.
BACKEND_ENV = "SMELT_TOKENIZER_BACKEND"
PROBES = (
    "Hello world! It's 2024: 1234567 items, don't STOP'LL.",
    "def f(x):\n\tif x:  \n\t\treturn  x\r\n\n\n    pass   ",
    "日本語のテキストと中文，한국어 텍스트.",
    "שלום עולם مرحبا بالعالم",
    "e\u0301 cafe\u0301 Å ﬁ 🙂👩‍👩‍👧 ✓",
    "text <|eos|> more <|bos|>\u00a0\u2003 spaces\t\t",
    "   leading and trailing   \n\n",
)


def _byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-unicode map that byte-level BPE vocabularies are spelled in."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def tiktoken_encoding(inner: tokenizers.Tokenizer) -> Any | None:
    """A tiktoken Encoding with the same vocabulary, merges (as ranks: ids follow merge order in a
    trained byte-level BPE) and pre-tokenization regex, or None when tiktoken is missing or the
    tokenizer is not a plain NFC + regex split + byte-level BPE."""
    try:
        import tiktoken
    except ImportError:
        return None
    data = json.loads(inner.to_str())
    model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [])
    normalizer = (data.get("normalizer") or {}).get("type")
    plain = (
        model.get("type") == "BPE"
        and not model.get("dropout")
        and not model.get("continuing_subword_prefix")
        and not model.get("end_of_word_suffix")
        and normalizer in (None, "NFC")
        and [step.get("type") for step in steps] == ["Split", "ByteLevel"]
        and steps[0].get("behavior") == "Isolated"
        and not steps[0].get("invert")
        and "Regex" in steps[0].get("pattern", {})
        and not steps[1].get("use_regex")
        and not steps[1].get("add_prefix_space")
    )
    if not plain:
        return None
    decoder = _byte_decoder()
    try:
        ranks = {bytes(decoder[ch] for ch in token): index for token, index in model["vocab"].items()}
        specials = {added["content"]: added["id"] for added in data.get("added_tokens", [])}
        return tiktoken.Encoding(
            "smelt", pat_str=steps[0]["pattern"]["Regex"], mergeable_ranks=ranks, special_tokens=specials
        )
    except (KeyError, ValueError):  # a character outside the byte alphabet, or a regex tiktoken rejects
        return None


def native_encoder(inner: tokenizers.Tokenizer) -> Any | None:
    """smelt's compiled encoder for this tokenizer, or None when numba is missing or the tokenizer is not
    one it reproduces."""
    try:
        from smelt.tokenizer.native import NativeBPE
    except ImportError:
        return None
    return NativeBPE.from_tokenizer_json(json.loads(inner.to_str()), _byte_decoder())


def _split(ids: np.ndarray, counts: np.ndarray) -> list[list[int]]:
    flat, out, start = ids.tolist(), [], 0
    for count in counts.tolist():
        out.append(flat[start : start + count])
        start += count
    return out


def tokenizer_hash(directory: str | Path) -> str:
    """sha256 of `tokenizer.json` and `smelt.json`: what token shards record to catch a changed tokenizer."""
    digest = hashlib.sha256()
    for name in (TOKENIZER_JSON, SMELT_JSON):
        data = (Path(directory) / name).read_bytes()
        digest.update(name.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


class Tokenizer:
    """A trained smelt tokenizer; `vocab_size` is the padded size.

    Encoding never gives a special id: a special token's text in the input (`<|eos|>` in a web page,
    `<|user|>` in a Python file) is encoded as ordinary bytes, on every backend. Special ids come only from
    the pipeline: EOS between documents (`smelt tokenize`), the chat template (`chat_template.ChatFormat`
    takes the role ids from `token_to_id`), FIM (the loader). `special_text_counts` counts such strings.
    """

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
        self.threads = 1  # tiktoken batch threads; the encoding pools provide the parallelism
        self._fast: Any = None
        self._native: Any = None
        self._backend = ""
        # Hugging Face matches added tokens in the raw text unless told not to; this is what the other
        # backends are checked against on the probes.
        inner.encode_special_tokens = True
        specials = [added.content for added in inner.get_added_tokens_decoder().values() if added.special]
        # every special token's text, longest first (so `<|eos|>` is not read inside a longer one)
        self.special_texts: tuple[str, ...] = tuple(sorted(specials, key=lambda t: (-len(t), t)))
        self.special_text_regex = "|".join(map(re.escape, self.special_texts))
        self._special_re = re.compile(self.special_text_regex) if specials else None
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

    @property
    def backend(self) -> str:
        """`native` (smelt's compiled encoder), `tiktoken` or `hf`: the fastest one allowed by
        $SMELT_TOKENIZER_BACKEND (`auto`, `native`, `tiktoken`, `hf`) that can run this tokenizer and
        agrees with Hugging Face token for token on the probes."""
        self._choose_backend()
        return self._backend

    def _choose_backend(self) -> None:
        if self._backend:
            return
        wanted = os.environ.get(BACKEND_ENV, "auto")
        if wanted not in ("auto", "native", "tiktoken", "hf"):
            raise UserError(f"{BACKEND_ENV}={wanted!r} is not a backend; use auto, native, tiktoken or hf.")
        self._backend = "hf"
        if wanted == "hf":
            return
        expected = [self._hf_ids(p) for p in PROBES]
        if wanted in ("auto", "native"):
            try:
                native = native_encoder(self.inner)
                agrees = native is not None and _split(*native.encode_flat(PROBES)) == expected
            except Exception as exc:  # numba installed but unable to compile here: the others still work
                print(f"smelt: warning: the native tokenizer encoder cannot run ({type(exc).__name__}: {exc}); "
                      f"encoding with tiktoken or Hugging Face instead", file=sys.stderr)  # fmt: skip
                agrees = False
            if agrees:
                self._native, self._backend = native, "native"
                return
        fast = tiktoken_encoding(self.inner)
        if fast is not None and [self._fast_ids(fast, p) for p in PROBES] == expected:
            self._fast, self._backend = fast, "tiktoken"

    def fast_encoder(self) -> Any | None:
        """The tiktoken encoding when it is the chosen backend, else None."""
        self._choose_backend()
        return self._fast

    def _hf_ids(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    @staticmethod
    def _fast_ids(fast: Any, text: str) -> list[int]:
        # A special token's text is ordinary text (encode_ordinary), as for the other backends.
        return fast.encode_ordinary(unicodedata.normalize("NFC", text))

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many texts at once; no special id is added, nor read from the text."""
        self._choose_backend()
        if self._native is not None:
            return _split(*self._native.encode_flat(texts))
        if self._fast is not None:
            normalized = [unicodedata.normalize("NFC", t) for t in texts]
            return self._fast.encode_ordinary_batch(normalized, num_threads=self.threads)
        batch = getattr(self.inner, "encode_batch_fast", None) or self.inner.encode_batch
        return [enc.ids for enc in batch(list(texts), add_special_tokens=False)]

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids back to back (int32) and the number per text (int64): what token shards
        are made of, without a Python list per text on the native backend."""
        self._choose_backend()
        if self._native is not None:
            return self._native.encode_flat(texts)
        encoded = self.encode_batch(texts)
        counts = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ids = np.fromiter((i for ids in encoded for i in ids), dtype=np.int32, count=int(counts.sum()))
        return ids, counts

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        return self.inner.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.inner.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def special_text_counts(self, texts: Iterable[str]) -> Counter[str]:
        """How often each special token's text occurs in the texts (encoded as ordinary text)."""
        counts: Counter[str] = Counter()
        if self._special_re is not None:
            for text in texts:
                counts.update(self._special_re.findall(text))
        return counts

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


def read_info(tokenizer_dir: str | Path, required: bool = True) -> dict[str, Any]:
    """A trained tokenizer's smelt.json (vocab size, special ids, hash); {} when it is missing or broken
    and not `required`, else a UserError naming the file and the fix."""
    path = Path(tokenizer_dir) / SMELT_JSON
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        if not required:
            return {}
        raise UserError(
            f"cannot read {path} ({exc}). Train the tokenizer first (`smelt tokenizer train CONFIG`) or "
            f"point at its directory."
        ) from exc
    return info if isinstance(info, dict) else {}
