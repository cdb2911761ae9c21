"""What a worker process needs to read one source's files: the reader's half of a source config,
small and picklable. Shared by readers.py and web.py (HTML and WARC), which it imports neither of."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from smelt.config import SourceConfig


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

    @property
    def unit_field(self) -> str:
        return self.split_unit.removeprefix("field:") if self.split_unit.startswith("field:") else ""

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
        )
