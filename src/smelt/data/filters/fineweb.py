"""FineWeb's extra quality rules (Penedo et al. 2024, section 3.3; datatrove's FineWebQualityFilter).

FineWeb found these on top of Gopher and C4 by comparing the documents removed from good and bad
crawl dumps: pages whose lines rarely end in punctuation, that are mostly short lines, that repeat
lines, or that are lists (many lines per word) are navigation, listings and boilerplate.

Differences from datatrove, all stated so that thresholds can be compared:

* lines are the non-blank lines, stripped (datatrove counts blank lines, which are short and never
  end in punctuation; normalized prose keeps one blank line between paragraphs);
* terminal punctuation is . ! ? " ' plus … ” ’ and the CJK 。！？;
* the list ratio counts line breaks between non-blank lines (lines - 1) per whitespace word;
* every `min_*` drops strictly below and every `max_*` strictly above its threshold (datatrove drops
  at equality for the punctuation, short-line and duplicate-character rules), as for every smelt filter.
"""

from __future__ import annotations

from smelt.config import FineWebConfig
from smelt.data.filters.base import Scores, TextFilter, nonblank_lines, split_words
from smelt.data.filters.gopher import duplicates
from smelt.data.filters.languages import SPACED
from smelt.data.ledger import Doc

STOP_CHARS = (".", "!", "?", '"', "'", "…", "”", "’", "。", "！", "？")


class FineWebFilter(TextFilter):
    """Drop pages with few punctuated lines, mostly short lines, repeated lines, or list layout."""

    name = "fineweb"
    filter_name = "fineweb"
    section = "fineweb"
    cfg: FineWebConfig
    language_rules = {"max_newline_word_ratio": SPACED}  # lines per whitespace word

    def measure(self, doc: Doc) -> Scores:
        return fineweb_scores(doc.text, self.cfg.short_line_chars)

    def verdict(self, s: Scores, skip: frozenset[str] = frozenset()) -> str | None:
        c = self.cfg
        if s["line_punct_ratio"] < c.min_line_punct_ratio:
            return "min_line_punct_ratio"
        if s["short_line_ratio"] > c.max_short_line_ratio:
            return "max_short_line_ratio"
        if s["dup_line_char_ratio"] > c.max_dup_line_char_ratio:
            return "max_dup_line_char_ratio"
        if s["newline_word_ratio"] > c.max_newline_word_ratio and "max_newline_word_ratio" not in skip:
            return "max_newline_word_ratio"
        return None


def fineweb_scores(text: str, short_line_chars: int) -> Scores:
    """The FineWeb statistics of one text; a short line has at most `short_line_chars` characters."""
    lines = nonblank_lines(text)
    n = len(lines)
    _, dup_chars = duplicates(lines)
    words = len(split_words(text))
    chars = len(text) - text.count("\n")
    return {
        "line_punct_ratio": sum(1 for line in lines if line.endswith(STOP_CHARS)) / n if n else 0.0,
        "short_line_ratio": sum(1 for line in lines if len(line) <= short_line_chars) / n if n else 0.0,
        "dup_line_char_ratio": dup_chars / chars if chars else 0.0,
        "newline_word_ratio": max(n - 1, 0) / words if words else 0.0,
    }
