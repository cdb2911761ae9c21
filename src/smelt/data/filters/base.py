"""What every heuristic filter shares: which sources use it, and how a verdict becomes meta or a drop.

A source picks its filters by name in `data.sources[i].filters`; `auto` means the code rules for a
code source and Gopher quality + repetition for everything else, because prose rules (stop words,
terminal punctuation, line lengths) would throw away most code.

A filter measures a document (`measure` -> named scores), then checks the scores against its
thresholds in config order (`verdict` -> the first failing rule, or None). A kept document gets the
scores in `doc.meta[<step name>]`; a dropped one goes to the ledger with reason
`<step name>.<rule>` (the rule is the config key to tune, e.g. `gopher_quality.min_words`) and the
scores as extra fields. Scores are rounded to 4 digits for the record; decisions use exact values.
Rules that hold only in some languages (stop words, whitespace words) are skipped for documents in
other languages, and the skip is recorded (see `languages.py`).
"""

from __future__ import annotations

import difflib
import re
from typing import Any, ClassVar

from smelt.config import DataConfig, SourceConfig
from smelt.data.filters.languages import rule_holds
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep
from smelt.errors import ConfigError

AUTO = "auto"
# Every filter a source may name, in the order the steps run (see FILTER_STEPS in __init__).
FILTER_NAMES: tuple[str, ...] = (
    "url_blocklist",
    "gopher_quality",
    "gopher_repetition",
    "c4",
    "fineweb",
    "code",
)
AUTO_CODE: tuple[str, ...] = ("code",)
AUTO_PROSE: tuple[str, ...] = ("gopher_quality", "gopher_repetition")

Scores = dict[str, Any]


def filter_names(source: SourceConfig, index: int | None = None) -> list[str]:
    """The filters `source` runs, with `auto` expanded in place and repeats removed (first wins).

    Raises ConfigError naming `data.sources[index].filters`, the unknown name and the valid names."""
    out: list[str] = []
    for name in source.filters:
        expanded = (AUTO_CODE if source.code else AUTO_PROSE) if name == AUTO else (name,)
        for item in expanded:
            if item not in FILTER_NAMES:
                where = f"data.sources[{index}].filters" if index is not None else "data.sources[].filters"
                close = difflib.get_close_matches(item, (*FILTER_NAMES, AUTO), n=1, cutoff=0.5)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(
                    f"{where} (source {source.name!r}): unknown filter {item!r}{hint}. "
                    f"Valid filters: {AUTO}, {', '.join(FILTER_NAMES)}."
                )
            if item not in out:
                out.append(item)
    return out


def sources_using(cfg: DataConfig, filter_name: str) -> frozenset[str]:
    """Names of the sources whose (resolved) filter list contains `filter_name`; validates them all."""
    return frozenset(s.name for i, s in enumerate(cfg.sources) if filter_name in filter_names(s, index=i))


def rounded(scores: Scores) -> Scores:
    """Floats to 4 digits (meta and ledger entries are for people and plots, not for exact replay)."""
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in scores.items()}


_NONBLANK = re.compile(r"\S")


def nonblank_lines(text: str) -> list[str]:
    """Lines with their surrounding whitespace stripped, blank ones left out. Line-based rules count
    non-blank lines only: normalized prose keeps one empty line between paragraphs, and counting those
    would turn every paragraph break into a 'short' or 'duplicate' line."""
    return [s for s in map(str.strip, text.split("\n")) if s]


_last_split: tuple[str, list[str]] = ("", [])


def split_words(text: str) -> list[str]:
    """`text.split()`, remembered for the last text object (compared by identity, and kept alive by
    the cache, so a new string can never be mistaken for it). Consecutive filters on the same
    document — Gopher quality, then repetition, then FineWeb — split it once instead of three times;
    splitting is about a fifth of their cost. Callers must not modify the returned list."""
    global _last_split
    if _last_split[0] is text:
        return _last_split[1]
    words = text.split()
    _last_split = (text, words)
    return words


class TextFilter(DocStep):
    """A filter that measures a document and keeps or drops it whole; subclasses set `name`,
    `filter_name`, `section` (the DataConfig attribute with its thresholds) and implement `measure`
    and `verdict`."""

    name: ClassVar[str] = "text_filter"
    filter_name: ClassVar[str] = ""
    section: ClassVar[str] = ""
    # rule -> what it needs of the document's language (languages.STOP_WORD_LIST or languages.SPACED)
    language_rules: ClassVar[dict[str, str]] = {}

    def __init__(self, cfg: Any, sources: frozenset[str] | None = None):
        self.cfg = cfg
        self.sources = None if sources is None else frozenset(sources)

    @classmethod
    def from_config(cls, cfg: DataConfig) -> TextFilter | None:
        """The step for the sources that list this filter (after `auto`), or None when none does."""
        sources = sources_using(cfg, cls.filter_name)
        if not sources:
            return None
        return cls(getattr(cfg, cls.section), sources)

    def measure(self, doc: Doc) -> Scores:
        raise NotImplementedError

    def verdict(self, scores: Scores, skip: frozenset[str] = frozenset()) -> str | None:
        """The first failing rule (a config key) not in `skip`, or None to keep."""
        raise NotImplementedError

    def skipped_rules(self, doc: Doc) -> frozenset[str]:
        """The rules of `language_rules` that do not hold for the document's language (the declared one
        where the source declares it, else the language id label)."""
        lang = doc.meta.get("declared_lang") or doc.meta.get("lang")
        return frozenset(rule for rule, need in self.language_rules.items() if not rule_holds(need, lang))

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        scores = self.measure(doc)
        skip = self.skipped_rules(doc)
        rule = self.verdict(scores, skip)
        record = rounded(scores)
        if skip:
            record["skipped"] = sorted(skip)
            lang = doc.meta.get("declared_lang") or doc.meta.get("lang")
            for name in skip:
                ledger.notes[(doc.source, f"{self.name}.{name}.skipped")] += 1
                ledger.notes[(doc.source, f"{self.name}.{name}.skipped.{lang}")] += 1
        if rule is not None:
            ledger.drop(doc, f"{self.name}.{rule}", **record)
            return None
        doc.meta[self.name] = record
        return doc
