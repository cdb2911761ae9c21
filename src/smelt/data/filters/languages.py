"""Which filter rules hold for which language.

Some heuristic rules are only meaningful in some languages:

* a stop-word rule needs a stop-word list for the document's language. Gopher's list (the, be, to,
  of, and, that, have, with) is English; counted on German or Italian text it finds next to nothing
  and drops good pages;
* a rule over whitespace-separated words (word counts, mean word length, word n-grams, lines per
  word) needs a language written with spaces between its words. In Japanese, Chinese or Thai a
  whitespace "word" is a phrase or a whole sentence.

A filter names its rules of either kind in `TextFilter.language_rules`. For a document whose `lang`
(from the language_id step) the rule does not hold for, the rule is skipped: it neither keeps nor
drops, the document's meta lists it under `<step>.skipped`, and the source's stats count it in
`notes` (`<step>.<rule>.skipped` and `<step>.<rule>.skipped.<lang>`). A document without a `lang`
(language id turned off) runs every rule, as configured.

To give another language a stop-word rule, add its list to `STOP_WORDS` under the code the
language-id backend answers.
"""

from __future__ import annotations

# A rule that needs a stop-word list for the document's language.
STOP_WORD_LIST = "stop_words"
# A rule that needs words separated by whitespace.
SPACED = "spaced"

STOP_WORDS: dict[str, tuple[str, ...]] = {
    "en": ("the", "be", "to", "of", "and", "that", "have", "with"),  # Gopher (Rae et al. 2021), A1.1
}

# Languages written without spaces between words (the codes py3langid and lingua answer): Japanese,
# Chinese (and Cantonese, Wu), Thai, Lao, Khmer, Burmese, Tibetan, Dzongkha.
UNSPACED = frozenset({"ja", "zh", "yue", "wuu", "th", "lo", "km", "my", "bo", "dz"})


def rule_holds(requirement: str, lang: str | None) -> bool:
    """Whether a rule with this requirement holds for a document in `lang` (None or "": unknown, so
    the rule runs)."""
    if not lang:
        return True
    if requirement == STOP_WORD_LIST:
        return lang in STOP_WORDS
    if requirement == SPACED:
        return lang not in UNSPACED
    raise ValueError(f"unknown language requirement {requirement!r}")
