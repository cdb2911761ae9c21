"""Gopher quality and repetition filters (Rae et al. 2021, "Scaling Language Models", appendix A1.1).

Both work on whitespace-separated words (language-agnostic and fast; Gopher's paper does not fix a
tokenizer). Quality thresholds are design section 5's; repetition thresholds are the paper's table A1.

Definitions, where the paper leaves room:

* A *word* is a whitespace token that is not made of punctuation and symbols only ("-", "--", "_");
  the mean word length is taken over those words (attached punctuation counts, as in "end.").
* Symbol ratios are `#` per word and ellipses ("..." or "…") per word, each against
  `max_symbol_word_ratio`.
* Bullet lines start with a bullet glyph (• ● ◦ ▪ ‣ …) or with "-", "*" or "+" followed by a space;
  line ratios are over non-blank lines.
* A word "contains a letter" when it has a word character that is not a digit or "_".
* Stop words are tokens equal to the, be, to, of, and, that, have, with — Gopher's English list —
  ignoring case and surrounding punctuation ("The", "(of", "and,"); every occurrence counts. The rule
  runs only on documents whose language has a stop-word list (`languages.STOP_WORDS`: English), and
  the word-count, mean-word-length and top n-gram rules only on languages written with spaces between
  words; for other languages they are skipped and the skip recorded (see `languages.py`).
* Duplicate lines / paragraphs count the repeats after the first occurrence (paragraphs are separated
  by blank lines; blank lines are not lines), and their character fractions are over the whole text.
* n-gram character fractions are over the characters of all words (spaces left out). Top n-gram
  (n = 2, 3, 4): count of the most frequent n-gram times its characters (the longest one on a tie).
  Duplicate n-grams (n = 5..10): characters of the words covered by any occurrence of an n-gram that
  occurs more than once, each word counted once however many duplicated n-grams overlap it — the
  paper's "taking care not to count characters that occur in overlapping n-grams more than once".
  (datatrove counts only the repeats, not the first occurrence, so it drops less at equal thresholds.)
"""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from smelt.config import GopherQualityConfig, GopherRepetitionConfig
from smelt.data.filters.base import Scores, TextFilter, nonblank_lines, split_words
from smelt.data.filters.languages import SPACED, STOP_WORD_LIST
from smelt.data.filters.languages import STOP_WORDS as STOP_WORDS_BY_LANGUAGE
from smelt.data.ledger import Doc
from smelt.errors import ConfigError

STOP_WORDS = STOP_WORDS_BY_LANGUAGE["en"]

_LETTER = re.compile(r"[^\W\d_]")  # a word character that is not a digit or "_"
_ALNUM = re.compile(r"[^\W_]")
_STOP_SET = frozenset(STOP_WORDS)
_STOP_MAX = max(map(len, STOP_WORDS))
# Punctuation stripped from a token before it is compared with the stop words ("The", "(of", "and,").
_EDGE_PUNCT = "\"'.,;:!?()[]{}<>«»“”‘’„*_-—–/"
BULLETS = ("•", "●", "○", "◦", "▪", "▫", "■", "□", "‣", "⁃", "∙", "➢", "➤", "►", "▶", "✓", "✔")
BULLETS += tuple(b + sep for b in "-*+" for sep in " \t")
ELLIPSES = ("...", "…")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")


class GopherQuality(TextFilter):
    """Drop documents that are too short or long, made of odd words, symbols, bullets or trailing
    ellipses, or lacking stop words (in the languages that have a list: English) — the signature of
    menus, tables, spam and boilerplate."""

    name = "gopher_quality"
    filter_name = "gopher_quality"
    section = "gopher_quality"
    cfg: GopherQualityConfig
    language_rules = {
        **dict.fromkeys(("min_words", "max_words", "min_mean_word_length", "max_mean_word_length"), SPACED),
        "min_stop_words": STOP_WORD_LIST,
    }

    def measure(self, doc: Doc) -> Scores:
        return gopher_quality_scores(doc.text)

    def verdict(self, s: Scores, skip: frozenset[str] = frozenset()) -> str | None:
        c = self.cfg
        checks = (
            ("min_words", s["words"] < c.min_words),
            ("max_words", s["words"] > c.max_words),
            ("min_mean_word_length", s["mean_word_length"] < c.min_mean_word_length),
            ("max_mean_word_length", s["mean_word_length"] > c.max_mean_word_length),
            (
                "max_symbol_word_ratio",
                s["hash_word_ratio"] > c.max_symbol_word_ratio
                or s["ellipsis_word_ratio"] > c.max_symbol_word_ratio,
            ),
            ("max_bullet_lines_ratio", s["bullet_lines_ratio"] > c.max_bullet_lines_ratio),
            ("max_ellipsis_lines_ratio", s["ellipsis_lines_ratio"] > c.max_ellipsis_lines_ratio),
            ("min_alpha_words_ratio", s["alpha_words_ratio"] < c.min_alpha_words_ratio),
            ("min_stop_words", s["stop_words"] < c.min_stop_words),
        )
        return next((rule for rule, failed in checks if failed and rule not in skip), None)


def gopher_quality_scores(text: str) -> Scores:
    """The Gopher quality statistics of one text (see the module docstring for the definitions).

    Tokens are classified once per distinct token (a Counter), not once per occurrence: natural
    text repeats its words, so this does a fraction of the Python-level work."""
    tokens = split_words(text)
    punct = punct_chars = alpha = stop = 0
    for token, n in Counter(tokens).items():
        if token.isalpha():
            alpha += n
            if len(token) <= _STOP_MAX and token.lower() in _STOP_SET:
                stop += n
        elif _LETTER.search(token):
            alpha += n
            if token.strip(_EDGE_PUNCT).lower() in _STOP_SET:
                stop += n
        elif not _ALNUM.search(token):
            punct += n
            punct_chars += n * len(token)
    words = len(tokens) - punct
    per_word = words or 1  # ratios of an empty text are 0 (and min_words drops it)
    lines = nonblank_lines(text)
    per_line = len(lines) or 1
    ellipses = text.count("...") + text.count("…")
    return {
        "words": words,
        "mean_word_length": (len("".join(tokens)) - punct_chars) / per_word,
        "hash_word_ratio": text.count("#") / per_word,
        "ellipsis_word_ratio": ellipses / per_word,
        "bullet_lines_ratio": sum(1 for line in lines if line.startswith(BULLETS)) / per_line,
        "ellipsis_lines_ratio": (sum(1 for line in lines if line.endswith(ELLIPSES)) if ellipses else 0)
        / per_line,
        "alpha_words_ratio": alpha / per_word,
        "stop_words": stop,
    }


TOP_NS = (2, 3, 4)
DUP_NS = (5, 6, 7, 8, 9, 10)


class GopherRepetition(TextFilter):
    """Drop documents that repeat themselves: duplicate lines or paragraphs, one n-gram dominating,
    or much of the text inside repeated n-grams — generated pages, link farms, degenerate loops."""

    name = "gopher_repetition"
    filter_name = "gopher_repetition"
    section = "gopher_repetition"
    cfg: GopherRepetitionConfig
    # the top n-gram rules count whitespace words; a repeated 5- to 10-gram is repetition in any script
    language_rules = {f"max_top_{n}gram_char_ratio": SPACED for n in TOP_NS}

    def __init__(self, cfg: GopherRepetitionConfig, sources: frozenset[str] | None = None):
        for key, ns in (("max_top_ngram_char_ratio", TOP_NS), ("max_dup_ngram_char_ratio", DUP_NS)):
            values = getattr(cfg, key)
            if len(values) != len(ns) or not all(0.0 <= v <= 1.0 for v in values):
                raise ConfigError(
                    f"data.gopher_repetition.{key} = {values!r} must list {len(ns)} fractions in [0, 1], "
                    f"one for each n in {', '.join(map(str, ns))}."
                )
        super().__init__(cfg, sources)

    def measure(self, doc: Doc) -> Scores:
        return gopher_repetition_scores(doc.text)

    def verdict(self, s: Scores, skip: frozenset[str] = frozenset()) -> str | None:
        c = self.cfg
        for key in ("dup_line_ratio", "dup_para_ratio", "dup_line_char_ratio", "dup_para_char_ratio"):
            if s[key] > getattr(c, "max_" + key):
                return "max_" + key
        for n, limit in zip(TOP_NS, c.max_top_ngram_char_ratio, strict=True):
            if s[f"top_{n}gram_char_ratio"] > limit and f"max_top_{n}gram_char_ratio" not in skip:
                return f"max_top_{n}gram_char_ratio"
        for n, limit in zip(DUP_NS, c.max_dup_ngram_char_ratio, strict=True):
            if s[f"dup_{n}gram_char_ratio"] > limit:
                return f"max_dup_{n}gram_char_ratio"
        return None


def duplicates(items: list[str]) -> tuple[int, int]:
    """(how many items repeat an earlier one, their characters)."""
    counts = Counter(items)
    return len(items) - len(counts), sum(len(k) * (n - 1) for k, n in counts.items() if n > 1)


def gopher_repetition_scores(text: str) -> Scores:
    """The Gopher repetition statistics of one text (see the module docstring for the definitions)."""
    chars = len(text) or 1
    lines = nonblank_lines(text)
    paragraphs = [p for p in map(str.strip, _PARAGRAPH_BREAK.split(text)) if p]
    dup_lines, dup_line_chars = duplicates(lines)
    dup_paras, dup_para_chars = duplicates(paragraphs)
    scores: Scores = {
        "dup_line_ratio": dup_lines / len(lines) if lines else 0.0,
        "dup_para_ratio": dup_paras / len(paragraphs) if paragraphs else 0.0,
        "dup_line_char_ratio": dup_line_chars / chars,
        "dup_para_char_ratio": dup_para_chars / chars,
    }
    top, dup = ngram_char_ratios(split_words(text), TOP_NS, DUP_NS)
    scores.update({f"top_{n}gram_char_ratio": r for n, r in zip(TOP_NS, top, strict=True)})
    scores.update({f"dup_{n}gram_char_ratio": r for n, r in zip(DUP_NS, dup, strict=True)})
    return scores


_ROLL = np.uint64(0x100000001B3)  # odd multiplier of the rolling n-gram hash (FNV-1a 64-bit prime)


def occurrences(keys: np.ndarray) -> np.ndarray:
    """For each key, how many times it occurs in `keys` (one sort; about twice as fast as
    np.unique(return_inverse, return_counts) on the short arrays of web documents)."""
    order = np.argsort(keys)
    ordered = keys[order]
    boundary = np.empty(ordered.size + 1, dtype=bool)
    boundary[0] = boundary[-1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=boundary[1:-1])
    runs = np.diff(np.flatnonzero(boundary))
    out = np.empty(ordered.size, dtype=np.int64)
    out[order] = np.repeat(runs, runs)
    return out


def ngram_char_ratios(
    words: list[str], top_ns: tuple[int, ...], dup_ns: tuple[int, ...]
) -> tuple[list[float], list[float]]:
    """(top n-gram character fraction for each n in top_ns, duplicate n-gram character fraction for
    each n in dup_ns), over the characters of `words`.

    Vectorized: every word becomes Python's 64-bit string hash, n-gram hashes roll up from (n-1)-gram
    hashes (h_n[i] = h_{n-1}[i] * P + h_1[i+n-1] mod 2^64) and numpy counts them, so no n-gram
    string is ever built. Only n = 2 is counted over every position: an n-gram can occur twice only
    where its leading (n-1)-gram does, so larger n count only those candidate positions, which
    shrink fast in ordinary text. Hash randomization changes the hashes, not the counts (a collision
    is ~ W^2 / 2^64 likely)."""
    n_words = len(words)
    top = [0.0] * len(top_ns)
    dup = [0.0] * len(dup_ns)
    if n_words == 0:
        return top, dup
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=n_words)
    cum = np.zeros(n_words + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    total = int(cum[-1]) or 1
    unigram = np.fromiter(map(hash, words), dtype=np.int64, count=n_words).view(np.uint64)
    rolled = unigram
    candidates = None  # positions whose (n-1)-gram occurs more than once; None: every position
    for n in range(2, max((*top_ns, *dup_ns)) + 1):
        m = n_words - n + 1
        if m <= 0:
            break
        if candidates is not None and candidates.size == 0:
            # nothing repeats any more: every longer n-gram occurs once, and the "most frequent" one
            # is the longest in characters
            for k in top_ns:
                if n <= k <= n_words:
                    top[top_ns.index(k)] = min(1.0, int((cum[k:] - cum[:-k]).max()) / total)
            break
        rolled = rolled[:-1] * _ROLL + unigram[n - 1 :]
        positions = None if candidates is None else candidates[candidates < m]
        keys = rolled if positions is None else rolled[positions]
        per_key = occurrences(keys)
        repeated = per_key > 1
        candidates = np.flatnonzero(repeated) if positions is None else positions[repeated]
        if n in top_ns:
            gram_chars = cum[n : n + m] - cum[:m]
            best = int(per_key.max()) if per_key.size else 1
            if best > 1:
                at_best = per_key == best
                longest = int(
                    gram_chars[np.flatnonzero(at_best) if positions is None else positions[at_best]].max()
                )
            else:  # every n-gram occurs once: the most frequent ones are all of them
                longest = int(gram_chars.max())
            top[top_ns.index(n)] = min(1.0, best * longest / total)
        if n in dup_ns and candidates.size:
            edges = np.zeros(n_words + 1, dtype=np.int32)
            edges[candidates] += 1
            edges[candidates + n] -= 1
            covered = np.cumsum(edges[:n_words]) > 0
            dup[dup_ns.index(n)] = int(lengths[covered].sum()) / total
    return top, dup
