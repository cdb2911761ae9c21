"""Bits per byte of any text set (`smelt eval RUN --data PATH`), next to gzip and xz on the same bytes.

A set is a file or a folder of files: `.txt` / `.md` (each file one document), `.jsonl` / `.jsonl.gz`
(one document per line, its `text` field) or `.parquet` (its `text` column). Documents are tokenized
with the run's tokenizer and joined with EOS, one EOS first, as the validation split is; the model
scores the stream in windows of train.seq_len tokens (`heldout.stream_nll`). The compressors are
measured two ways on exactly the scored bytes:

* whole set: gzip -9 and xz -9e over all the bytes at once, so they may copy from anywhere before;
* per window: raw DEFLATE (level 9) and raw LZMA2 (preset 9e) over each window's bytes on its own,
  without container headers: a compressor that, like the model, sees only one context window. The
  LZMA2 dictionary is sized to the window (`window_dict_size`): the same output as preset 9e's 64 MiB
  dictionary, without allocating one per window.

A window's bytes are those of the tokens it predicts (the tokenizer's bytes per token; EOS has none).
"""

from __future__ import annotations

import gzip
import lzma
import math
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from smelt.errors import UserError
from smelt.eval.compress import gzip_bits_per_byte, xz_bits_per_byte
from smelt.jsonl import json_objects

if TYPE_CHECKING:  # reading a set (smelt tokenizer eval --data) imports no torch
    import torch

SUFFIXES = (".txt", ".md", ".jsonl", ".jsonl.gz", ".parquet")


def _kind(path: Path) -> str | None:
    name = path.name.lower()
    return next((s for s in SUFFIXES if name.endswith(s)), None)


def text_files(path: Path) -> list[Path]:
    """The files of a set: the file itself, or every readable file under a folder, in path order."""
    if not path.exists():
        raise UserError(f"--data {path} does not exist (resolved from {Path.cwd()}).")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and _kind(p))
    if not files or any(_kind(f) is None for f in files):
        raise UserError(
            f"--data {path}: no text set to read there. Give a file or folder of {', '.join(SUFFIXES)} files "
            f"(jsonl: a `text` field per line; parquet: a `text` column)."
        )
    return files


def _jsonl_texts(path: Path, field: str) -> list[str]:
    opener = gzip.open if path.name.lower().endswith(".gz") else open
    texts = []
    try:
        with opener(path, "rt", encoding="utf-8") as handle:
            for number, record in json_objects(handle, path, "--data", "Fix or remove that line."):
                if not isinstance(record.get(field), str):
                    keys = sorted(record)
                    raise UserError(
                        f"--data {path} line {number} has no string `{field}` field (its keys: {keys}); "
                        f"name the field with --data-field."
                    )
                texts.append(record[field])
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(f"--data {path} cannot be read ({exc}).") from exc
    return texts


def _parquet_texts(path: Path, field: str) -> list[str]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"--data {path} cannot be read as parquet ({exc}).") from exc
    if field not in table.column_names:
        raise UserError(
            f"--data {path} has no `{field}` column (columns: {', '.join(table.column_names)}); name the "
            f"column with --data-field."
        )
    return [t for t in table.column(field).to_pylist() if t]


def set_name(file: Path) -> str:
    """A file's name without the suffix that makes it part of a set: `de.txt` -> `de`, `web.jsonl.gz` -> `web`."""
    kind = _kind(file)
    return file.name[: -len(kind)] if kind else file.name


def read_text_file(file: Path, field: str = "text") -> list[str]:
    """The documents of one file of a set (empty ones left out); UserError naming the file and the fix."""
    kind = _kind(file)
    if kind in (".txt", ".md"):
        try:
            texts = [file.read_text(encoding="utf-8")]
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"--data {file} cannot be read as UTF-8 text ({exc}).") from exc
    elif kind == ".parquet":
        texts = _parquet_texts(file, field)
    else:
        texts = _jsonl_texts(file, field)
    return [t for t in texts if t]


def read_text_set(path: Path, field: str = "text") -> list[str]:
    """The documents of a set (see the module docstring); UserError naming the file and the fix."""
    texts: list[str] = []
    for file in text_files(path):
        texts += read_text_file(file, field)
    if not texts:
        raise UserError(f"--data {path} holds no text.")
    return texts


def text_set_groups(
    paths: list[str], field: str = "text", max_bytes_per_group: int = 0
) -> dict[str, list[str]]:
    """The documents of several sets grouped by file (`smelt tokenizer eval --data`): a file given as
    the set is the group named after it (`held.jsonl` -> `held`), each file under a folder the group
    `<folder>/<path inside it>` (`sentences/de`). With `max_bytes_per_group`, each group keeps its
    documents in order while they fit in that many UTF-8 bytes (at least its first)."""
    groups: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for item in paths:
        root = Path(item)
        for file in text_files(root):
            inside = [] if file == root else [root.name, *file.relative_to(root).parent.parts]
            name = "/".join([*inside, set_name(file)])
            texts = groups.setdefault(name, [])
            for text in read_text_file(file, field):
                n = len(text.encode("utf-8"))
                if max_bytes_per_group and texts and sizes[name] + n > max_bytes_per_group:
                    continue
                texts.append(text)
                sizes[name] = sizes.get(name, 0) + n
    empty = [name for name, texts in groups.items() if not texts]
    for name in empty:
        del groups[name]
    if not groups:
        raise UserError(f"--data {', '.join(paths)}: no text in these sets.")
    return groups


def _raw_deflate_bits(data: bytes) -> int:
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    return 8 * len(packer.compress(data) + packer.flush())


# The smallest dictionary a window's LZMA2 gets (64 KiB): preset 9e's own, 64 MiB, would be allocated
# and cleared for every window of a few hundred bytes (147 ms each; 1.7 ms with this one).
WINDOW_DICT_MIN = 1 << 16


def window_dict_size(n_bytes: int) -> int:
    """An LZMA2 dictionary that holds all of `n_bytes`: the next power of two, at least 64 KiB. A match
    can reach no further back than the window's start, so any dictionary at least that long compresses
    the window to the same bytes as preset 9e's 64 MiB one."""
    return max(WINDOW_DICT_MIN, 1 << max(n_bytes - 1, 0).bit_length())


def _raw_lzma_bits(data: bytes) -> int:
    filters = [
        {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME, "dict_size": window_dict_size(len(data))}
    ]
    return 8 * len(lzma.compress(data, format=lzma.FORMAT_RAW, filters=filters))


def window_byte_ends(targets_bytes: np.ndarray, n_windows: int, seq_len: int, total: int) -> list[int]:
    """Byte offset where each window's predicted text ends, from the byte length of each target
    token. When the tokenizer's bytes do not add up to the text's (a normalizer changed it), the
    offsets are scaled to the text's length."""
    ends = np.cumsum(targets_bytes)
    marks = [int(ends[min((w + 1) * seq_len, len(ends)) - 1]) for w in range(n_windows)]
    counted = int(ends[-1]) if len(ends) else 0
    if counted and counted != total:
        marks = [round(m * total / counted) for m in marks]
    return marks


def score_text_set(
    model: torch.nn.Module,
    tokenizer: Any,
    texts: list[str],
    seq_len: int,
    batch_size: int,
    device: torch.device,
    doc_masking: bool = False,
) -> dict[str, Any]:
    """The model's loss and bits per byte on `texts`, with gzip and xz whole-set and per window."""
    from smelt.eval.heldout import stream_nll

    eos = tokenizer.eos_id
    pieces: list[int] = [eos]
    for ids in tokenizer.encode_batch(texts):
        pieces += ids
        pieces.append(eos)
    stream = np.asarray(pieces[:-1], dtype=np.int64)  # no EOS after the last document: nothing follows
    nll, count = stream_nll(model, stream, seq_len, batch_size, device, eos if doc_masking else None)
    data = b"".join(t.encode("utf-8") for t in texts)
    n_windows = len(range(0, max(len(stream) - 1, 0), seq_len))
    ends = window_byte_ends(tokenizer.token_byte_lengths()[stream[1:]], n_windows, seq_len, len(data))
    deflate = lzma_bits = 0
    start = 0
    for end in ends:
        chunk = data[start:end]
        if chunk:
            deflate += _raw_deflate_bits(chunk)
            lzma_bits += _raw_lzma_bits(chunk)
        start = end
    n_bytes = max(len(data), 1)
    return {
        "documents": len(texts),
        "tokens": count,
        "bytes": len(data),
        "seq_len": seq_len,
        "windows": n_windows,
        "loss": nll / max(count, 1),
        "bits_per_byte": nll / math.log(2) / n_bytes,
        "bytes_per_token": len(data) / max(count, 1),
        "gzip_bits_per_byte": gzip_bits_per_byte(data),
        "xz_bits_per_byte": xz_bits_per_byte(data),
        "gzip_window_bits_per_byte": deflate / n_bytes,
        "xz_window_bits_per_byte": lzma_bits / n_bytes,
    }
