"""Text normalization: NFC, newlines, control characters, blank-line runs. Never lowercases."""

from __future__ import annotations

import re
import unicodedata

from smelt.data.document import Doc, Ledger
from smelt.data.steps import DocStep

# C0 and C1 control characters except \t and \n (\r is turned into \n before this runs).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_BLANK_RUN = re.compile("\n{3,}")


def normalize_text(text: str, code: bool = False) -> str:
    """NFC; CRLF and lone CR to LF; drop control characters but \\n and \\t; for prose (code=False)
    collapse 3+ newlines to 2. Code keeps its whitespace otherwise."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text)
    text = _CONTROL.sub("", text)
    if not code:
        text = _BLANK_RUN.sub("\n\n", text)
    return text


class Normalize(DocStep):
    name = "normalize"

    def __init__(self, code_sources: frozenset[str] = frozenset()):
        self.code_sources = frozenset(code_sources)

    def apply(self, doc: Doc, ledger: Ledger) -> Doc | None:
        doc.text = normalize_text(doc.text, code=doc.source in self.code_sources)
        return doc
