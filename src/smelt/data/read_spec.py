"""What a worker process needs to read one source's files: the reader's half of a source config,
small and picklable. Shared by readers.py and web.py (HTML and WARC), which it imports neither of."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smelt.config import SourceConfig

DECLARED_LANG = "declared_lang"  # the meta key of a document's declared language


@dataclass(frozen=True)
class ReadSpec:
    """What a worker process needs to read one source's files (small and picklable)."""

    name: str
    index: int
    format: str
    root: str
    text_field: str = "text"
    id_field: str = ""
    url_field: str = ""
    extractor: str = "trafilatura"
    split_unit: str = "id"  # see data/split.py; "field:<name>" keeps that record field in meta
    part_chars: int = 0  # text files longer than this become several documents (0: one per file)
    declared_language: str = ""  # see data/langid.py: a code, file, dir or field:<name>

    @property
    def unit_field(self) -> str:
        return self.split_unit.removeprefix("field:") if self.split_unit.startswith("field:") else ""

    @property
    def lang_field(self) -> str:
        """The record field that declares each document's language, or ""."""
        declared = self.declared_language
        return declared.removeprefix("field:") if declared.startswith("field:") else ""

    def declared_for(self, file: str) -> str | None:
        """The declared language of a document of `file` (relative to root) when it comes from the
        source (a code) or the path (`file`: the name before its first dot, `dir`: the top directory);
        None for none, and for `field:<name>`, which the reader takes from the record."""
        declared = self.declared_language
        if not declared or declared.startswith("field:"):
            return None
        if declared == "file":
            return file.rsplit("/", 1)[-1].split(".", 1)[0].lower() or None
        if declared == "dir":
            head, sep, _ = file.partition("/")
            return head.lower() if sep else None
        return declared.lower()

    @classmethod
    def of(cls, source: SourceConfig, index: int, root: Path) -> ReadSpec:
        # A code file stays whole: it is its own unit, and the code filter bounds its size.
        part_chars = source.part_chars if source.format == "text" and not source.code else 0
        # A text file's id is its path, so `id` and `file` are the same unit until a file is cut into
        # parts; then `file` keeps the parts of one book in one split (`document` splits them).
        split_unit = "file" if part_chars and source.split_unit == "id" else source.split_unit
        return cls(
            source.name,
            index,
            source.format,
            str(root),
            source.text_field,
            source.id_field,
            source.url_field,
            source.extractor,
            split_unit,
            part_chars,
            source.declared_language.strip(),
        )
