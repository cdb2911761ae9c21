"""smelt's compiled BPE encoder: the GPT-4 or GPT-2 pre-tokenizer as a hand-written scanner plus
byte-level BPE merges, compiled with numba.

It reproduces Hugging Face `tokenizers` token for token for the tokenizers `smelt tokenizer train`
writes (NFC, one regex split with a named pattern, byte-level BPE without dropout or suffixes):

- Character classes (letter, number, whitespace) come from the same regex engine Hugging Face uses
  (Oniguruma, run once over every code point), so both agree on Unicode versions.
- The scanner follows the regex alternation in order, with its backtracking resolved by hand (see
  `piece_gpt4`).
- Merges are applied as Hugging Face applies them: the lowest merge rank first, the leftmost on a tie,
  only for pairs that are a listed merge.
- A special token's text (`<|eos|>` in a document) is encoded as ordinary bytes, as Hugging Face does
  with `encode_special_tokens = True`: special ids come only from the pipeline, never from text.

Regex engines spend most of their time trying alternatives character by character; the scanner decides
each piece from one class lookup per character, which is where the speed comes from.
"""

from __future__ import annotations

import functools
import os
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from smelt.tokenizer.patterns import GPT2_PATTERN, GPT4_PATTERN

OTHER, LETTER, NUMBER, SPACE, NEWLINE = 0, 1, 2, 3, 4
PATTERN_KINDS = {GPT4_PATTERN: 0, GPT2_PATTERN: 1}
_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed 64-bit integer: Fibonacci hashing


@functools.lru_cache(maxsize=1)
def char_classes() -> np.ndarray:
    """The class of every code point (uint8, 0x110000 entries) as Oniguruma sees \\p{L}, \\p{N}, \\s.

    Computing it takes most of a second, which every encoding process would pay, so it is kept in the
    user's cache directory per `tokenizers` version (written atomically, recomputed if unreadable)."""
    import tokenizers

    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "smelt"
    path = cache / f"char_classes-tokenizers-{tokenizers.__version__}.npy"
    try:
        classes = np.load(path)
        if classes.shape == (0x110000,) and classes.dtype == np.uint8:
            return classes
    except (OSError, ValueError):
        pass
    classes = _compute_char_classes()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(partial, "wb") as handle:
            np.save(handle, classes)
        os.replace(partial, path)
    except OSError:  # a read-only home: compute it each time
        pass
    return classes


def _compute_char_classes() -> np.ndarray:
    from tokenizers import Regex, normalizers

    codepoints = np.arange(0x110000, dtype=np.uint32)
    codepoints = codepoints[(codepoints < 0xD800) | (codepoints >= 0xE000)]  # no surrogates in a str
    text = codepoints.astype("<u4").tobytes().decode("utf-32-le")
    mark = 0x10FFFF  # a noncharacter: in none of the classes, so it can stand for a match
    classes = np.zeros(0x110000, dtype=np.uint8)
    for cls, regex in ((LETTER, r"\p{L}"), (NUMBER, r"\p{N}"), (SPACE, r"\s")):
        replaced = normalizers.Replace(Regex(regex), chr(mark)).normalize_str(text)
        marked = np.frombuffer(replaced.encode("utf-32-le"), dtype=np.uint32)
        if len(marked) != len(codepoints):
            raise RuntimeError(f"character classes: {regex} did not map one code point to one")
        classes[codepoints[(marked == mark) & (codepoints != mark)]] = cls
    classes[[0x0A, 0x0D]] = NEWLINE
    return classes


# -- compiled kernels ---------------------------------------------------------------------------------

jit = njit(cache=True, nogil=True)
# Helpers called once per character or piece are inlined into the kernel: a numba call that passes
# arrays counts references to each, which costs more than the helper's own work.
inline = njit(cache=True, nogil=True, inline="always")


@inline
def slot_of(key, shift, mask):
    return ((key * _GOLDEN) >> shift) & mask


def build_table(lefts: np.ndarray, rights: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """The merge table: open addressing on (left id, right id) -> merge rank, probed as `merge_rank`
    probes it. Built in Python: loading one more compiled function would cost each process more time
    than the loop."""
    size = 1 << bits
    shift, mask = 64 - bits, size - 1
    merge_keys = (lefts.astype(np.int64) << 32) | rights.astype(np.int64)
    with np.errstate(over="ignore"):  # the multiplication wraps, as in the compiled slot_of
        slots = ((merge_keys * np.int64(_GOLDEN)) >> shift) & mask
    keys, ranks = [-1] * size, [-1] * size
    for rank, (key, slot) in enumerate(zip(merge_keys.tolist(), slots.tolist(), strict=True)):
        while keys[slot] != -1 and keys[slot] != key:
            slot = (slot + 1) & mask
        if keys[slot] == -1:  # a repeated merge keeps its first (lowest) rank
            keys[slot] = key
            ranks[slot] = rank
    return np.array(keys, dtype=np.int64), np.array(ranks, dtype=np.int32)


@inline
def merge_rank(keys, ranks, shift, left, right):
    key = (np.int64(left) << 32) | np.int64(right)
    mask = len(keys) - 1
    slot = slot_of(key, shift, mask)
    while True:
        found = keys[slot]
        if found == key:
            return np.int64(ranks[slot])
        if found == -1:
            return np.int64(-1)
        slot = (slot + 1) & mask


@inline
def heap_push(heap, size, value):
    i = size
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent] <= value:
            break
        heap[i] = heap[parent]
        i = parent
    heap[i] = value
    return size + 1


@inline
def heap_pop(heap, size):
    top = heap[0]
    size -= 1
    last = heap[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and heap[child + 1] < heap[child]:
            child += 1
        if heap[child] >= last:
            break
        heap[i] = heap[child]
        i = child
    if size > 0:
        heap[i] = last
    return top, size


@jit
def bpe(data, start, end, byte_ids, keys, ranks, shift, merged, ids, nxt, prv, heap, out, o):
    """Merge the bytes data[start:end] into tokens written at out[o:]; returns the new end of out.
    A heap of (rank, position) pops the lowest rank, leftmost first; popped pairs that a merge has
    since changed are skipped (their rank no longer matches)."""
    m = end - start
    if m == 1:
        out[o] = byte_ids[data[start]]
        return o + 1
    for k in range(m):
        ids[k] = byte_ids[data[start + k]]
        nxt[k] = k + 1
        prv[k] = k - 1
    size = 0
    for k in range(m - 1):
        rank = merge_rank(keys, ranks, shift, ids[k], ids[k + 1])
        if rank >= 0:
            size = heap_push(heap, size, (rank << 32) | k)
    while size > 0:
        top, size = heap_pop(heap, size)
        rank = top >> 32
        p = top & 0xFFFFFFFF
        if ids[p] < 0:
            continue
        r = nxt[p]
        if r >= m or merge_rank(keys, ranks, shift, ids[p], ids[r]) != rank:
            continue
        ids[p] = merged[rank]
        ids[r] = -1
        after = nxt[r]
        nxt[p] = after
        if after < m:
            prv[after] = p
            rank_right = merge_rank(keys, ranks, shift, ids[p], ids[after])
            if rank_right >= 0:
                size = heap_push(heap, size, (rank_right << 32) | p)
        before = prv[p]
        if before >= 0:
            rank_left = merge_rank(keys, ranks, shift, ids[before], ids[p])
            if rank_left >= 0:
                size = heap_push(heap, size, (rank_left << 32) | before)
    k = 0
    while k < m:
        out[o] = ids[k]
        o += 1
        k = nxt[k]
    return o


CACHE_BITS = 18  # 262,144 cached pieces (23 MB): most pieces of natural text and code hit
CACHE_PIECE_BYTES = 16  # pieces up to this long are cached: two 64-bit words hold their bytes exactly


def new_cache() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An empty piece cache: per slot the piece's bytes as two words and its length, then the number of
    ids and the ids. Keys are compared in full, so a hit is always the piece's own encoding."""
    slots = 1 << CACHE_BITS
    keys = np.zeros((slots, 3), dtype=np.int64)
    counts = np.zeros(slots, dtype=np.int32)
    ids = np.zeros((slots, CACHE_PIECE_BYTES), dtype=np.int32)
    return keys, counts, ids


@inline
def piece_key(data, start, m):
    """A piece of at most 16 bytes as two words, and its cache slot."""
    low = np.int64(0)
    high = np.int64(0)
    for k in range(min(m, 8)):
        low |= np.int64(data[start + k]) << (8 * k)
    for k in range(8, m):
        high |= np.int64(data[start + k]) << (8 * (k - 8))
    return slot_of((low * _GOLDEN) ^ (high + m), 64 - CACHE_BITS, (1 << CACHE_BITS) - 1), low, high


@inline
def contraction(cps, i, n, fold):
    """Length of `'s|'t|'re|'ve|'m|'ll|'d` at i (0 if none); `fold` makes it case-insensitive."""
    if cps[i] != 0x27 or i + 1 >= n:
        return 0
    a = cps[i + 1]
    if fold:
        a = a + 32 if 65 <= a <= 90 else (115 if a == 0x17F else a)  # U+017F long s folds to s
    if a == 115 or a == 116 or a == 109 or a == 100:  # s t m d
        return 2
    if i + 2 >= n or not (a == 114 or a == 118 or a == 108):  # r v l
        return 0
    b = cps[i + 2]
    if fold:
        b = b + 32 if 65 <= b <= 90 else b
    if (a == 114 and b == 101) or (a == 118 and b == 101) or (a == 108 and b == 108):
        return 3
    return 0


@inline
def run_end(cls, j, n, a, b):
    while j < n and (cls[j] == a or cls[j] == b):
        j += 1
    return j


@inline
def whitespace_tail(cls, i, n):
    """`\\s+(?!\\S)|\\s+` at a whitespace run: all of it at the end of the text, else all but its last
    character (which then leads the next piece), and a single character as it is."""
    j = run_end(cls, i, n, SPACE, NEWLINE)
    if j < n and j - 1 > i:
        return j - 1
    return j


@inline
def piece_gpt4(cps, cls, i, n):
    """The end of the GPT-4 piece starting at i:
    (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*
    |\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"""
    length = contraction(cps, i, n, True)
    if length:
        return i + length
    c = cls[i]
    if c == LETTER:
        return run_end(cls, i + 1, n, LETTER, LETTER)
    if (c == OTHER or c == SPACE) and i + 1 < n and cls[i + 1] == LETTER:  # noqa: SIM109 (numba)
        return run_end(cls, i + 2, n, LETTER, LETTER)
    if c == NUMBER:
        j = i + 1
        while j < n and j < i + 3 and cls[j] == NUMBER:
            j += 1
        return j
    k = i + 1 if cps[i] == 0x20 else i
    if k < n and cls[k] == OTHER:
        j = run_end(cls, k + 1, n, OTHER, OTHER)
        return run_end(cls, j, n, NEWLINE, NEWLINE)
    # whitespace: up to the run's last newline if it has one (\s*[\r\n]+ backtracks to there)
    j = run_end(cls, i, n, SPACE, NEWLINE)
    last = j - 1
    while last >= i and cls[last] != NEWLINE:
        last -= 1
    if last >= i:
        return last + 1
    return whitespace_tail(cls, i, n)


@inline
def piece_gpt2(cps, cls, i, n):
    """'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"""
    length = contraction(cps, i, n, False)
    if length:
        return i + length
    k = i + 1 if cps[i] == 0x20 and i + 1 < n else i
    c = cls[k]
    if c == LETTER or c == NUMBER or c == OTHER:  # noqa: SIM109 (numba)
        return run_end(cls, k + 1, n, c, c)
    return whitespace_tail(cls, i, n)


@jit
def encode_documents(
    data,
    starts,
    classes,
    kind,
    byte_ids,
    keys,
    ranks,
    shift,
    merged,
    cache_keys,
    cache_counts,
    cache_ids,
    out,
    counts,
):
    """Encode each document data[starts[d]:starts[d + 1]] (valid UTF-8); token ids go to `out`
    back to back, the count per document to `counts`. Returns the number of ids written."""
    longest = 0
    for d in range(len(starts) - 1):
        longest = max(longest, starts[d + 1] - starts[d])
    cps = np.empty(longest + 1, dtype=np.int32)
    cls = np.empty(longest + 1, dtype=np.uint8)
    pos = np.empty(longest + 1, dtype=np.int64)
    ids = np.empty(longest + 1, dtype=np.int32)
    nxt = np.empty(longest + 1, dtype=np.int32)
    prv = np.empty(longest + 1, dtype=np.int32)
    heap = np.empty(3 * longest + 3, dtype=np.int64)
    o = 0
    for d in range(len(starts) - 1):
        first = o
        p, end, n = starts[d], starts[d + 1], 0
        while p < end:  # decode UTF-8 (Python wrote it, so it is valid)
            b = np.int32(data[p])
            pos[n] = p
            if b < 0x80:
                cp, width = b, 1
            elif b < 0xE0:
                cp, width = ((b & 0x1F) << 6) | (data[p + 1] & 0x3F), 2
            elif b < 0xF0:
                cp, width = ((b & 0x0F) << 12) | ((data[p + 1] & 0x3F) << 6) | (data[p + 2] & 0x3F), 3
            else:
                cp = ((b & 0x07) << 18) | ((data[p + 1] & 0x3F) << 12) | ((data[p + 2] & 0x3F) << 6)
                cp |= data[p + 3] & 0x3F
                width = 4
            cps[n] = cp
            cls[n] = classes[cp]
            n += 1
            p += width
        pos[n] = end
        i = 0
        while i < n:
            j = piece_gpt4(cps, cls, i, n) if kind == 0 else piece_gpt2(cps, cls, i, n)
            start, m = pos[i], pos[j] - pos[i]
            if m == 1:
                out[o] = byte_ids[data[start]]
                o += 1
            elif m > CACHE_PIECE_BYTES:
                o = bpe(
                    data, start, start + m, byte_ids, keys, ranks, shift, merged, ids, nxt, prv, heap, out, o
                )
            else:  # most pieces are common words: their encoding is a copy from the cache
                slot, low, high = piece_key(data, start, m)
                if cache_keys[slot, 2] == m and cache_keys[slot, 0] == low and cache_keys[slot, 1] == high:
                    for k in range(cache_counts[slot]):
                        out[o + k] = cache_ids[slot, k]
                    o += cache_counts[slot]
                else:
                    end_o = bpe(
                        data,
                        start,
                        start + m,
                        byte_ids,
                        keys,
                        ranks,
                        shift,
                        merged,
                        ids,
                        nxt,
                        prv,
                        heap,
                        out,
                        o,
                    )
                    cache_keys[slot, 0], cache_keys[slot, 1], cache_keys[slot, 2] = low, high, m
                    cache_counts[slot] = end_o - o
                    for k in range(end_o - o):
                        cache_ids[slot, k] = out[o + k]
                    o = end_o
            i = j
        counts[d] = o - first
    return o


# -- the encoder --------------------------------------------------------------------------------------


class NativeBPE:
    """Encode texts with a tokenizer's merges through the compiled scanner and BPE."""

    def __init__(self, pattern_kind: int, byte_ids: np.ndarray, merges: np.ndarray, specials: dict[str, int]):
        self.kind = pattern_kind
        self.byte_ids = byte_ids
        self.merged = np.ascontiguousarray(merges[:, 2])
        bits = max(4, int(2 * len(merges)).bit_length())
        self.shift = 64 - bits
        self.keys, self.ranks = build_table(merges[:, 0].copy(), merges[:, 1].copy(), bits)
        self.classes = char_classes()
        self._cache = new_cache()
        self._lock = threading.Lock()
        # A special token's text in a document (a web page that mentions `<|eos|>`) is ordinary text:
        # special ids come only from the pipeline (EOS between documents, chat templates, FIM).
        self.specials = specials

    @classmethod
    def from_tokenizer_json(cls, data: dict[str, Any], byte_decoder: dict[str, int]) -> NativeBPE | None:
        """The encoder for a tokenizer.json dict, or None when it is not one this encoder reproduces
        (another normalizer, pre-tokenizer or pattern, or BPE options)."""
        model, pre = data.get("model") or {}, data.get("pre_tokenizer") or {}
        steps = pre.get("pretokenizers", [])
        if not (
            model.get("type") == "BPE"
            and not model.get("dropout")
            and not model.get("continuing_subword_prefix")
            and not model.get("end_of_word_suffix")
            and not model.get("ignore_merges")
            and (data.get("normalizer") or {}).get("type") == "NFC"
            and [step.get("type") for step in steps] == ["Split", "ByteLevel"]
            and steps[0].get("behavior") == "Isolated"
            and not steps[0].get("invert")
            and steps[0].get("pattern", {}).get("Regex") in PATTERN_KINDS
            and not steps[1].get("use_regex")
            and not steps[1].get("add_prefix_space")
        ):
            return None
        vocab: dict[str, int] = model["vocab"]
        byte_to_char = {b: ch for ch, b in byte_decoder.items()}
        if any(byte_to_char[b] not in vocab for b in range(256)):
            return None
        byte_ids = np.array([vocab[byte_to_char[b]] for b in range(256)], dtype=np.int32)
        rows = []
        for merge in model.get("merges", []):
            left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
            if left not in vocab or right not in vocab or left + right not in vocab:
                return None
            rows.append((vocab[left], vocab[right], vocab[left + right]))
        merges = np.array(rows, dtype=np.int32).reshape(-1, 3)
        specials = {added["content"]: int(added["id"]) for added in data.get("added_tokens", [])}
        return cls(PATTERN_KINDS[steps[0]["pattern"]["Regex"]], byte_ids, merges, specials)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """All texts' ids back to back (int32) and the count per text (int64). Never a special id."""
        return self._encode_bytes([_nfc(text).encode("utf-8") for text in texts])

    def _encode_bytes(self, encoded: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        starts = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)), out=starts[1:])
        data = np.frombuffer(b"".join(encoded), dtype=np.uint8)
        out = np.empty(max(1, len(data)), dtype=np.int32)  # at most one token per byte
        counts = np.zeros(len(encoded), dtype=np.int64)
        with self._lock:  # the piece cache is shared state
            written = encode_documents(
                data, starts, self.classes, self.kind, self.byte_ids, self.keys, self.ranks, self.shift,
                self.merged, *self._cache, out, counts,
            )  # fmt: skip
        return out[:written].copy() if written < len(out) // 2 else out[:written], counts


def _nfc(text: str) -> str:
    return text if unicodedata.is_normalized("NFC", text) else unicodedata.normalize("NFC", text)
