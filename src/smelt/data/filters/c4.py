"""C4's line rules (Raffel et al. 2020, section 2.2), as the TFDS code that built C4 applies them.

Opt-in per source (`filters = [..., "c4"]`): the rules delete code, forum posts, poetry and lists,
which is the point for web crawl and a loss anywhere else.

Each line (stripped) is kept only if: no word is longer than `max_word_length`; after removing
Wikipedia-style citation marks ([1], [edit], [citation needed]) it ends in terminal punctuation
(. ! ? " and the closing quotes ” ’ ') but not in an ellipsis; it has at least `min_words_per_line`
words; it does not mention "javascript"; and it has none of the cookie / terms-of-use / privacy-policy
phrases. A kept line containing "lorem ipsum" or "{" drops the whole document (as in TFDS, these two
are looked for in lines that pass the line rules, so a curly brace in a deleted line does not count).
A document left with fewer than `min_sentences` sentences is dropped. The kept lines, joined by
newlines, become the document's text.

Not implemented: the "bad words" list (it needs a word list per language; use a URL blocklist or a
classifier). Sentences are counted with a punctuation rule (a run of . ! ? followed by closing quotes
or brackets and then whitespace or the end), not NLTK's punkt, so "Dr. Smith" counts as two.
"""

from __future__ import annotations

import re

from smelt.config import C4Config
from smelt.data.filters.base import TextFilter, rounded
from smelt.data.ledger import Doc, Ledger

_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
_END_MARKS = (".", "!", "?", '"', "”", "’", "'")
_ELLIPSIS = ("...", "…")
_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)")

LINE_REASONS = ("long_word", "no_terminal_punct", "few_words", "javascript", "policy")


class C4Filter(TextFilter):
    """C4's line-level cleaning and its page-level drops; changes the text of documents it keeps."""

    name = "c4"
    filter_name = "c4"
    section = "c4"
    cfg: C4Config

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        kept, scores, rule = c4_clean(doc.text, self.cfg)
        if rule is not None:
            ledger.drop(doc, f"{self.name}.{rule}", **rounded(scores))
            return None
        doc.text = kept
        doc.meta[self.name] = rounded(scores)
        return doc


def c4_clean(text: str, cfg: C4Config) -> tuple[str, dict, str | None]:
    """(cleaned text, scores, the failing rule or None). Scores: lines in, lines kept, sentences,
    and per rule the number of lines it removed (`removed_<reason>`)."""
    removed = dict.fromkeys(LINE_REASONS, 0)
    kept: list[str] = []
    sentences = 0
    lines_in = 0
    rule = None
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        lines_in += 1
        words = line.split()
        if any(len(w) > cfg.max_word_length for w in words):
            removed["long_word"] += 1
            continue
        if cfg.remove_citations:
            line = _CITATION.sub("", line)
        if cfg.require_terminal_punctuation and (not line.endswith(_END_MARKS) or line.endswith(_ELLIPSIS)):
            removed["no_terminal_punct"] += 1
            continue
        if len(words) < cfg.min_words_per_line:
            removed["few_words"] += 1
            continue
        lower = line.lower()
        if cfg.drop_lorem_ipsum and "lorem ipsum" in lower:
            rule = "drop_lorem_ipsum"
            break
        if cfg.remove_javascript_lines and "javascript" in lower:
            removed["javascript"] += 1
            continue
        if cfg.drop_curly_brace and "{" in line:
            rule = "drop_curly_brace"
            break
        if cfg.remove_policy_lines and any(p in lower for p in _POLICY):
            removed["policy"] += 1
            continue
        sentences += max(1, len(_SENTENCE_END.findall(line)))
        kept.append(line)
    scores = {
        "lines": lines_in,
        "lines_kept": len(kept),
        "sentences": sentences,
        **{f"removed_{k}": v for k, v in removed.items()},
    }
    if rule is None and sentences < cfg.min_sentences:
        rule = "min_sentences"
    return "\n".join(kept), scores, rule
