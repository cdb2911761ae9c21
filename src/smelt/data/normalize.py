"""Text normalization: optional mojibake repair, NFC, newlines, control characters, blank-line runs.

Never lowercases: case carries meaning (names, acronyms, code identifiers) that a language model must
learn. Code sources keep their whitespace (indentation, blank lines, form feeds, trailing spaces)
exactly; only line endings become LF, as for every source, so that a file checked out on Windows and
the same file checked out on Linux become the same document.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from smelt.config import DataConfig
from smelt.data.ledger import Doc, Ledger
from smelt.data.steps import DocStep

# C0 and C1 control characters except \t and \n (\r is turned into \n before this runs).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# For code, form feed (\x0c) is whitespace with a meaning (a page break in C and Python sources).
_CONTROL_CODE = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
# Two or more blank lines in a row (a blank line may hold spaces or tabs) become one empty line.
_BLANK_RUN = re.compile(r"\n(?:[ \t]*\n){2,}")


def normalize_text(text: str, code: bool = False, mojibake: bool = False) -> str:
    """NFC; CRLF and lone CR to LF; drop control characters but \\n and \\t (and, for code, \\f); for
    prose (code=False) collapse runs of blank lines to one empty line. Code keeps its whitespace
    otherwise. `mojibake=True` first repairs text that was decoded with the wrong codec (ftfy), before
    anything else, because C1 control characters are part of the mojibake that ftfy recognizes."""
    if mojibake:
        text = repair_mojibake(text)
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    text = (_CONTROL_CODE if code else _CONTROL).sub("", text)
    if not code:
        text = _BLANK_RUN.sub("\n\n", text)
    return text


@cache
def _ftfy_config():  # -> ftfy.TextFixerConfig; imported lazily so that sources without mojibake skip ftfy
    import ftfy

    # Only the encoding repairs: no HTML unescaping, quote uncurling, width folding, ligature
    # expansion or control-character removal; those change correct text, and normalize_text does
    # its own NFC and control-character handling afterwards.
    return ftfy.TextFixerConfig(
        unescape_html=False,
        remove_terminal_escapes=False,
        fix_latin_ligatures=False,
        fix_character_width=False,
        uncurl_quotes=False,
        fix_line_breaks=False,
        remove_control_chars=False,
        normalization=None,
        explain=False,
    )


def repair_mojibake(text: str) -> str:
    """Undo mojibake such as 'CafÃ©' -> 'Café' or 'itâ€™s' -> 'it’s' with ftfy's encoding fixes only.
    Pure-ASCII text cannot hold mojibake and skips ftfy (most of a web crawl, and ftfy runs at
    about 2-3 MB/s)."""
    if text.isascii():
        return text
    import ftfy

    return ftfy.fix_text(text, _ftfy_config())


class Normalize(DocStep):
    """The normalization step; `code_sources` keep their whitespace, `mojibake_sources` get ftfy."""

    name = "normalize"

    def __init__(
        self, code_sources: frozenset[str] = frozenset(), mojibake_sources: frozenset[str] = frozenset()
    ):
        self.code_sources = frozenset(code_sources)
        self.mojibake_sources = frozenset(mojibake_sources)

    @classmethod
    def from_config(cls, cfg: DataConfig) -> Normalize:
        """Always on (normalized text is what dedup and every filter compare)."""
        return cls(
            frozenset(s.name for s in cfg.sources if s.code),
            frozenset(s.name for s in cfg.sources if s.mojibake),
        )

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        doc.text = normalize_text(
            doc.text, code=doc.source in self.code_sources, mojibake=doc.source in self.mojibake_sources
        )
        return doc
