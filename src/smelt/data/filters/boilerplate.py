"""Publishers' wrappers: the header and footer a publisher puts around every text it distributes.

A Project Gutenberg e-text carries a header (title, release date, encoding and, in the oldest texts,
the whole licence as "small print") up to a `*** START OF ...` line, often a "Produced by" credit
after it, and an `*** END OF ...` line followed by the full licence (about 18,700 characters). That is
4-5% of a typical book, identical across thousands of books: text a model would learn by heart.

A wrapper is data (`Wrapper`): line patterns that end the header (the line and everything before it
go; a pattern may span a marker wrapped over a few lines), line patterns that begin the footer (the
line and everything after it go), and credit patterns for the paragraphs right after the header (the
producer's credit, "E-text prepared by ...", the note that an HTML version exists, one after another).
Markers are looked for only within `window` characters of
the start and of the end of the text, so a phrase quoted inside a book cannot cut it in half. To
handle another publisher, add an entry to `WRAPPERS` and name it in `data.boilerplate.publishers`.

A text file may reach this step as several documents (a long book split into parts by the reader):
consecutive documents of one text file are treated as one text, so a header or footer that fills whole
parts is removed with them (those parts are dropped as `boilerplate.<wrapper>`). Only parts of one
file are looked at together; every other document is judged alone, as for any per-document step.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from smelt.config import DataConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep
from smelt.errors import ConfigError


@dataclass(frozen=True)
class Wrapper:
    """One publisher's wrapper. Patterns are regular expressions matched at the start of a line,
    case-insensitively. `window`: markers count only within this many characters of either end.
    `hints`: plain strings of which a wrapped text holds at least one (a fast test before the
    patterns run; without hints the patterns always run)."""

    name: str
    start: tuple[str, ...]
    end: tuple[str, ...]
    credits: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()
    window: int = 60_000
    max_credits: int = 4  # credit and note paragraphs removed after the header, at most
    _start: re.Pattern = field(init=False, repr=False, compare=False)
    _end: re.Pattern = field(init=False, repr=False, compare=False)
    _credit: re.Pattern | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        flags = re.IGNORECASE | re.MULTILINE
        object.__setattr__(self, "_start", re.compile("|".join(f"^(?:{p})" for p in self.start), flags))
        object.__setattr__(self, "_end", re.compile("|".join(f"^(?:{p})" for p in self.end), flags))
        credit = (
            re.compile("|".join(f"(?:{p})" for p in self.credits), re.IGNORECASE) if self.credits else None
        )
        object.__setattr__(self, "_credit", credit)


_PG = r"project\s+gutenberg"
# The rest of a START line: up to its closing `***` on the same line, or, when the title is wrapped,
# on one of the next two non-blank lines (`***START OF THE PROJECT GUTENBERG EBOOK THE HISTORY OF THE`
# then `DECLINE AND FALL***`), else the line alone.
_START_REST = r"(?:[^\n]*\*{3}[^\n]*|[^\n*]*(?:\n[ \t]*[^\s*][^\n*]*){1,2}?\*{3}[^\n]*|.*)"
WRAPPERS: dict[str, Wrapper] = {
    "gutenberg": Wrapper(
        "gutenberg",
        start=(
            rf"[ \t]*\*{{3}}\s*start\s+of\s+(?:this|the)\s+{_PG}\b{_START_REST}",  # *** START OF THE/THIS PG
            r"[ \t]*\*\s*end\s*\*?\s*the\s+small\s+print\b.*",  # *END*THE SMALL PRINT! (1990s texts)
        ),
        end=(
            rf"[ \t]*\*{{3}}\s*end\s+of\s+(?:this|the)\s+{_PG}\b",  # *** END OF THE/THIS PROJECT ...
            # End of the Project Gutenberg EBook of ..., End of Project Gutenberg's <title>
            rf"[ \t]*end\s+of\s+(?:the\s+|this\s+)?{_PG}(?:(?:'s|\u2019s)\s|\s+e-?(?:book|text)\b)",
        ),
        credits=(
            r"produced\s+by\b",
            r"(?:this\s+)?e-?(?:text|book)\s+(?:was\s+)?prepared\s+by\b",
            r"transcribed\s+from\s+the\b.*\bby\b",
            # the notes that sit beside the credit: an HTML version (with its two URLs), page images
            rf"(?:\[?\s*)?(?:note:\s*)?{_PG}\s+also\s+has\s+an?\s+html\s+version\b",
            r"(?:\[?\s*)?(?:note:\s*)?images\s+of\s+the\s+original\s+pages\s+are\s+available\b",
            r"this\s+(?:e-?text|e-?book|file)\s+was\s+produced\s+from\b",
        ),
        hints=("Gutenberg", "GUTENBERG", "gutenberg", "SMALL PRINT", "Small Print"),
    ),
}


@dataclass
class Cut:
    """What to keep of one part: characters [head, tail), or nothing when head == tail; the bytes
    removed before and after what is kept."""

    head: int
    tail: int
    head_bytes: int = 0
    tail_bytes: int = 0

    @property
    def removed(self) -> int:
        return self.head_bytes + self.tail_bytes


def find_cuts(texts: list[str], wrapper: Wrapper) -> list[Cut] | None:
    """Where `wrapper` ends and begins in a text given as consecutive parts (one part for a whole
    document): one Cut per part, or None when no marker is found. The text left is stripped of the
    whitespace at its new edges."""
    if wrapper.hints and not any(hint in text for text in texts for hint in wrapper.hints):
        return None
    starts = [0]
    for text in texts[:-1]:
        starts.append(starts[-1] + len(text))
    total = starts[-1] + len(texts[-1])
    head = _find_head(texts, starts, wrapper)
    tail = _find_tail(texts, starts, total, wrapper, after=head or (0, 0))
    if head is None and tail is None:
        return None
    head_part, head_at = head or (0, 0)
    tail_part, tail_at = tail or (len(texts) - 1, len(texts[-1]))
    cuts = []
    for i, text in enumerate(texts):
        lo = 0 if i > head_part else head_at if i == head_part else len(text)
        hi = len(text) if i < tail_part else tail_at if i == tail_part else 0
        if i == head_part and lo:
            lo = len(text) - len(text[lo:].lstrip())
        if i == tail_part and hi < len(text):
            hi = len(text[:hi].rstrip())
        if hi <= lo:  # all wrapper
            cuts.append(
                Cut(0, 0, _nbytes(text) if i <= head_part else 0, 0 if i <= head_part else _nbytes(text))
            )
        else:
            cuts.append(Cut(lo, hi, _nbytes(text[:lo]), _nbytes(text[hi:])))
    return cuts


def _find_head(texts: list[str], starts: list[int], wrapper: Wrapper) -> tuple[int, int] | None:
    """(part, offset just past the header and its credit paragraph), or None."""
    for i, text in enumerate(texts):
        if starts[i] >= wrapper.window:
            return None
        match = wrapper._start.search(text, 0, max(0, wrapper.window - starts[i]))
        if match is None:
            continue
        return i, _skip_credits(text, match.end(), wrapper)
    return None


_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def _skip_credits(text: str, end: int, wrapper: Wrapper) -> int:
    """`end` moved past the credit and note paragraphs that follow it, one after another."""
    if wrapper._credit is None:
        return end
    for _ in range(wrapper.max_credits):
        body = len(text) - len(text[end:].lstrip())
        if body >= len(text) or not wrapper._credit.match(text, body):
            break
        paragraph = _PARAGRAPH_BREAK.search(text, body)
        end = len(text) if paragraph is None else paragraph.start()
    return end


def _find_tail(
    texts: list[str], starts: list[int], total: int, wrapper: Wrapper, after: tuple[int, int]
) -> tuple[int, int] | None:
    """(part, offset of the footer's first line): the earliest end marker within `window` characters of
    the end and after the header, or None."""
    limit = total - wrapper.window
    for i, text in enumerate(texts):
        if starts[i] + len(text) <= limit or i < after[0]:
            continue
        lo = max(limit - starts[i], 0, after[1] if i == after[0] else 0)
        match = wrapper._end.search(text, lo)
        if match is not None:
            return i, match.start()
    return None


def _nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


def resolve_wrappers(names: list[str]) -> list[Wrapper]:
    """The wrappers named in `data.boilerplate.publishers`; ConfigError naming the key for an unknown one."""
    out = []
    for name in names:
        wrapper = WRAPPERS.get(name.strip().lower())
        if wrapper is None:
            close = difflib.get_close_matches(name.lower(), WRAPPERS, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"data.boilerplate.publishers: unknown publisher {name!r}{hint}. Known publishers: "
                f"{', '.join(sorted(WRAPPERS))}; to strip another publisher's wrapper, add its markers to "
                f"WRAPPERS in smelt/data/filters/boilerplate.py."
            )
        out.append(wrapper)
    return out


class Boilerplate(DocStep):
    """Strip publishers' wrappers from the documents of non-code sources. A stripped document gets
    `meta["boilerplate"] = {wrapper: {"head_bytes", "tail_bytes"}}`; a document (or part of a split
    file) that is wrapper only is dropped as `boilerplate.<wrapper>`. Per source, the stats' `notes`
    count `boilerplate_<wrapper>_docs` (documents touched) and `boilerplate_<wrapper>_bytes`."""

    name = "boilerplate"

    def __init__(
        self,
        wrappers: list[Wrapper],
        sources: frozenset[str] | None = None,
        text_sources: frozenset[str] = frozenset(),
    ):
        self.wrappers = list(wrappers)
        self.sources = None if sources is None else frozenset(sources)
        self.text_sources = frozenset(text_sources)  # format "text": consecutive parts of a file go together

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Boilerplate | None:
        """The step for every non-code source, or None when disabled, no publisher is named or every
        source is code."""
        section = cfg.boilerplate
        wrappers = resolve_wrappers(section.publishers)
        sources = frozenset(s.name for s in cfg.sources if not s.code)
        if not section.enabled or not wrappers or not sources:
            return None
        return cls(wrappers, sources, frozenset(s.name for s in cfg.sources if s.format == "text"))

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        return next(self._strip([doc], ledger), None)

    def run(self, docs: Iterable[Doc], ledger: Ledger) -> Iterator[Doc]:
        """Like DocStep.run, except that consecutive documents of one file of a `text` source (the
        parts of a split file) are stripped together."""
        parts: list[Doc] = []
        for doc in docs:
            if parts and (doc.source, doc.file) != (parts[0].source, parts[0].file):
                yield from self._strip(parts, ledger)
                parts = []
            if self.sources is not None and doc.source not in self.sources:
                yield doc
            elif doc.source in self.text_sources:
                parts.append(doc)
            else:
                yield from self._strip([doc], ledger)
        if parts:
            yield from self._strip(parts, ledger)

    def _strip(self, docs: list[Doc], ledger: Ledger) -> Iterator[Doc]:
        """The parts of one text, each stripped of every wrapper found; parts left empty are dropped."""
        ledger.step = self.name
        removed: dict[int, str] = {}
        for wrapper in self.wrappers:
            cuts = find_cuts([d.text for d in docs], wrapper)
            if cuts is None:
                continue
            for i, (doc, cut) in enumerate(zip(docs, cuts, strict=True)):
                if i in removed or not cut.removed:
                    continue
                ledger.notes[(doc.source, f"boilerplate_{wrapper.name}_docs")] += 1
                ledger.notes[(doc.source, f"boilerplate_{wrapper.name}_bytes")] += cut.removed
                if cut.head == cut.tail:
                    removed[i] = wrapper.name
                    continue
                doc.text = doc.text[cut.head : cut.tail]
                doc.meta.setdefault("boilerplate", {})[wrapper.name] = {
                    "head_bytes": cut.head_bytes,
                    "tail_bytes": cut.tail_bytes,
                }
        for i, doc in enumerate(docs):
            if i in removed:
                ledger.drop(doc, f"boilerplate.{removed[i]}", bytes=_nbytes(doc.text))
            else:
                yield doc
