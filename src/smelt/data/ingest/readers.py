"""Readers: one file in, documents with provenance out; unreadable records go to the quarantine.

Every reader increments `ledger.records_in` once per record it sees (a document, one part of a long
text file, or a quarantined record) and sets the file's status in `ledger.files`: "ok" (at least one record with visible text),
"empty" (no record, or only whitespace) or "unreadable" (nothing could be read as a document).
"""

from __future__ import annotations

import codecs
import gzip
import importlib.util
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from smelt.data.ledger import Doc, Ledger, preview
from smelt.data.read_spec import DECLARED_LANG, ReadSpec
from smelt.errors import UserError

BATCH_ROWS = 1024
# Above this share of invalid bytes a record is not UTF-8 with a few bad bytes but another encoding
# (or binary): quarantined as decode_error rather than decoded into a field of replacement characters.
MAX_INVALID_UTF8_SHARE = 0.01


def decode_utf8(data: bytes) -> tuple[str, int]:
    """(text, number of invalid byte sequences replaced by U+FFFD)."""
    try:
        return data.decode("utf-8"), 0
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="replace")
        return text, text.count("\ufffd") - data.count("\ufffd".encode())


def _decoded(
    data: bytes, spec: ReadSpec, id: str, rel: str, line: int | None, ledger: Ledger
) -> tuple[str | None, int]:
    """Decode a record; quarantine it (and return None) when it is mostly not UTF-8."""
    text, bad = decode_utf8(data)
    if bad and bad > MAX_INVALID_UTF8_SHARE * max(1, len(text)):
        ledger.quarantine(
            spec.name, id, rel, line, "decode_error",
            f"not UTF-8: {bad} invalid byte sequences in {len(data)} bytes (another encoding?)",
        )  # fmt: skip
        return None, bad
    if bad:
        ledger.notes[(spec.name, "utf8_replaced_records")] += 1
    return text, bad


def check_readable(spec: ReadSpec, files: list[Path]) -> None:
    """Fail early on inputs this installation cannot read at all."""
    if spec.format in ("html", "warc"):
        from smelt.data.ingest.extract import extractor

        extractor(spec.extractor)  # raises UserError naming the package to install
    if spec.format == "jsonl" and importlib.util.find_spec("zstandard") is None:
        zst = [f for f in files if f.name.endswith(".zst")]
        if zst:
            raise UserError(
                f"source {spec.name!r}: {zst[0]} (and {len(zst) - 1} more) is zstd-compressed, but the "
                f"'zstandard' package is not installed. Run `pip install zstandard`, or decompress the files."
            )


def read_file(
    spec: ReadSpec, path: Path, ledger: Ledger, start: int = 0, end: int | None = None, first_line: int = 1
) -> Iterator[Doc]:
    """Documents of one file, or of the lines of a JSONL file that start in the byte range [start, end)
    (`first_line` is the number of the line at `start`), with the file's status set in the ledger."""
    rel = path.relative_to(spec.root).as_posix()
    state: dict[str, Any] = {"records": 0, "visible": False}
    mark = ledger.n_quarantined
    if start or end is not None:
        if spec.format != "jsonl":
            raise ValueError(f"byte ranges are only supported for jsonl, not {spec.format}")
        records = _read_jsonl(spec, path, rel, ledger, state, start, end, first_line)
    else:
        records = _reader(spec.format)(spec, path, rel, ledger, state)
    for doc in records:
        if not state["visible"] and doc.text.strip():
            state["visible"] = True
        yield doc
    if state["visible"]:
        status = "ok"
    elif state["records"] == 0 or ledger.n_quarantined == mark:
        status = "empty"  # no records, or only whitespace ones
    else:
        status = "unreadable"
    ledger.set_file_status(spec.name, rel, status)


def _reader(fmt: str):
    if fmt in ("html", "warc"):
        from smelt.data.ingest import web

        return web.read_html if fmt == "html" else web.read_warc
    return {"text": _read_text, "jsonl": _read_jsonl, "parquet": _read_parquet}[fmt]


def _read_text(spec: ReadSpec, path: Path, rel: str, ledger: Ledger, state: dict) -> Iterator[Doc]:
    data = path.read_bytes()
    state["records"] = 1
    ledger.records_in[spec.name] += 1
    if b"\x00" in data:
        ledger.quarantine(spec.name, rel, rel, None, "binary", "contains NUL bytes", bytes=len(data))
        return
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    text, bad = _decoded(data, spec, rel, rel, None, ledger)
    if text is None:
        return
    cuts = cut_points(text, spec.part_chars)
    if not cuts:
        doc = Doc(spec.name, spec.index, rel, text, rel)
        if bad:
            doc.meta["invalid_utf8"] = bad
        yield doc
        return
    state["records"] += len(cuts)  # every part is a record of its own in the accounting
    ledger.records_in[spec.name] += len(cuts)
    line = 1
    for number, (start, end) in enumerate(zip([0, *cuts], [*cuts, len(text)], strict=True)):
        piece = text[start:end]
        doc = Doc(spec.name, spec.index, f"{rel}{PART_MARK}{number:04d}", piece, rel, line)
        if bad and "\ufffd" in piece:
            doc.meta["invalid_utf8"] = piece.count("\ufffd")
        line += piece.count("\n")
        yield doc


# A paragraph break: a line end followed by one or more blank (or whitespace-only) lines.
_PARAGRAPH_BREAK = re.compile(r"\n(?:[ \t\r\f\v]*\n)+")
_LINE_BREAK = re.compile(r"\n")
_SPACE = re.compile(r"\s+")
PART_MARK = "#part"  # ids of the parts of a long text file: <file>#part0000, #part0001, ...


def cut_points(text: str, part_chars: int) -> list[int]:
    """Where to cut a text longer than `part_chars` characters into ceil(len / part_chars) parts of
    about equal size: at each ideal cut, the nearest paragraph break within a quarter of a part, else
    the nearest line break, else the nearest whitespace, else the ideal offset itself. The cut goes
    after the break, so the parts joined are the text. Empty when the text is not longer than that."""
    n = len(text)
    if part_chars <= 0 or n <= part_chars:
        return []
    parts = -(-n // part_chars)
    size = n / parts
    cuts: list[int] = []
    for k in range(1, parts):
        ideal = round(k * size)
        lo = max(cuts[-1] if cuts else 0, ideal - int(size / 4)) + 1
        hi = min(n - 1, ideal + int(size / 4))
        cuts.append(_nearest_break(text, ideal, lo, hi))
    return cuts


def _nearest_break(text: str, ideal: int, lo: int, hi: int) -> int:
    """The end of the break nearest `ideal` with its end in [lo, hi], trying the kinds in order."""
    for pattern in (_PARAGRAPH_BREAK, _LINE_BREAK, _SPACE):
        ends = [m.end() for m in pattern.finditer(text, max(0, lo - 1), hi) if lo <= m.end() <= hi]
        if ends:
            return min(ends, key=lambda end: (abs(end - ideal), end))
    return min(max(ideal, lo), hi)


class _ZstdLines:
    """Lines of a zstd file (one or more frames). zstandard's stream reader ends a truncated stream
    silently; this raises EOFError instead, after the lines that were complete."""

    CHUNK = 1 << 20

    def __init__(self, path: Path):
        self.handle = open(path, "rb")  # noqa: SIM115 - closed by __exit__

    def __enter__(self) -> _ZstdLines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def __iter__(self) -> Iterator[bytes]:
        import zstandard

        decompressor = zstandard.ZstdDecompressor().decompressobj()
        pending = b""
        finished = True
        while chunk := self.handle.read(self.CHUNK):
            while chunk:
                pending += decompressor.decompress(chunk)
                finished = decompressor.eof
                chunk = decompressor.unused_data if finished else b""
                if finished and chunk:  # another frame follows
                    decompressor = zstandard.ZstdDecompressor().decompressobj()
            *lines, pending = pending.split(b"\n")
            yield from (line + b"\n" for line in lines)
        if not finished:
            raise EOFError("the zstd stream ends inside a frame (truncated file)")
        if pending:
            yield pending


def _open_jsonl(path: Path) -> io.BufferedIOBase | _ZstdLines:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        return _ZstdLines(path)
    return open(path, "rb")


def _read_jsonl(
    spec: ReadSpec,
    path: Path,
    rel: str,
    ledger: Ledger,
    state: dict,
    start: int = 0,
    end: int | None = None,
    first_line: int = 1,
) -> Iterator[Doc]:
    number = first_line - 1
    try:
        with _open_jsonl(path) as handle:
            if start:
                handle.seek(start)
            position = start
            for number, raw in enumerate(handle, start=first_line):
                if end is not None:
                    if position >= end:
                        break
                    position += len(raw)
                if not raw.strip():
                    continue
                state["records"] += 1
                ledger.records_in[spec.name] += 1
                doc = _jsonl_record(spec, rel, number, raw, ledger)
                if doc is not None:
                    yield doc
    except (OSError, EOFError, ValueError) as exc:  # truncated or corrupt compressed stream
        state["records"] += 1
        ledger.records_in[spec.name] += 1
        ledger.quarantine(
            spec.name,
            f"{rel}:{number + 1}",
            rel,
            number + 1,
            "decode_error",
            f"cannot read past line {number}: {type(exc).__name__}: {exc}",
        )


def _jsonl_record(spec: ReadSpec, rel: str, number: int, raw: bytes, ledger: Ledger) -> Doc | None:
    default_id = f"{rel}:{number}"
    if number == 1 and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8) :]
    line, bad = _decoded(raw, spec, default_id, rel, number, ledger)
    if line is None:
        return None
    try:  # not smelt.jsonl: a bad line is quarantined in the ledger with its reason, and reading goes on
        record = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as exc:
        ledger.quarantine(spec.name, default_id, rel, number, "bad_json", str(exc), preview=preview(line))
        return None
    if not isinstance(record, dict):
        ledger.quarantine(
            spec.name,
            default_id,
            rel,
            number,
            "bad_json",
            f"a JSON {type(record).__name__}, not an object",
            preview=preview(line),
        )
        return None
    doc = _make_doc(spec, rel, number, default_id, record, ledger)
    if doc is not None and bad:
        doc.meta["invalid_utf8"] = bad
    return doc


def _make_doc(
    spec: ReadSpec, rel: str, number: int, default_id: str, record: dict[str, Any], ledger: Ledger
) -> Doc | None:
    text = record.get(spec.text_field)
    if not isinstance(text, str):
        detail = (
            f"no field {spec.text_field!r}"
            if text is None
            else f"field {spec.text_field!r} is a {type(text).__name__}, not a string"
        )
        ledger.quarantine(
            spec.name, default_id, rel, number, "missing_text_field", detail, fields=sorted(record)[:20]
        )
        return None
    doc_id = default_id
    if spec.id_field:
        value = record.get(spec.id_field)
        if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
            ledger.quarantine(
                spec.name,
                default_id,
                rel,
                number,
                "missing_id",
                f"field {spec.id_field!r} is missing, empty or not a string/integer",
                fields=sorted(record)[:20],
            )
            return None
        doc_id = str(value)
    url = record.get(spec.url_field) if spec.url_field else None
    url = None if url is None or url == "" else str(url)
    doc = Doc(spec.name, spec.index, doc_id, text, rel, number, url)
    if spec.unit_field and record.get(spec.unit_field) not in (None, ""):
        doc.meta[spec.unit_field] = str(record[spec.unit_field])
    if spec.lang_field and record.get(spec.lang_field) not in (None, ""):
        doc.meta[DECLARED_LANG] = str(record[spec.lang_field]).strip().lower()
    return doc


def _read_parquet(spec: ReadSpec, path: Path, rel: str, ledger: Ledger, state: dict) -> Iterator[Doc]:
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        state["records"] = 1
        ledger.records_in[spec.name] += 1
        ledger.quarantine(spec.name, rel, rel, None, "decode_error", f"not a parquet file: {exc}")
        return
    names = parquet.schema_arrow.names
    fields = {
        "text_field": spec.text_field,
        "id_field": spec.id_field,
        "url_field": spec.url_field,
        "split_unit": spec.unit_field,
        "declared_language": spec.lang_field,
    }
    wanted = [f for f in fields.values() if f]
    for key, column in fields.items():
        if column and column not in names:
            raise UserError(
                f"source {spec.name!r}: {path} has no column {column!r} (its columns: "
                f"{', '.join(names[:30])}). Set {key} of the source to one of these columns."
            )
    row = 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=sorted(set(wanted))):
        columns = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        for i in range(batch.num_rows):
            state["records"] += 1
            ledger.records_in[spec.name] += 1
            record = {name: values[i] for name, values in columns.items()}
            doc = _make_doc(spec, rel, row, f"{rel}:{row}", record, ledger)
            row += 1
            if doc is not None:
                yield doc
