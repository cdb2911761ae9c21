"""WARC framing and HTTP payloads: records out of a WARC file, with exact offsets and exact failures.

We parse the framing ourselves (a version line, headers, `Content-Length` bytes of block) on top of
`zlib`, instead of using fastwarc or warcio, because curation needs to know *where* and *why* a file
stops being readable: on a truncated `.warc.gz` both libraries end the iteration silently (the last
record cut short, or missing), and fastwarc aborts the whole file when a response says
`Transfer-Encoding: chunked` over a body that was stored de-chunked (pywb's iana.org sample does).
Here a truncated gzip member or a corrupt deflate stream raises `WarcError` with a reason and the
offset of the record it hit, after every earlier record was yielded. A record whose framing is wrong (no
version line, a broken header, a `Content-Length` that does not end at the next record) is reported
with its offset and reading resynchronises at the next `WARC/1.x` version line, so one bad length
costs one record, not the rest of the file.

Offsets are what a reader needs to seek back to a record: the byte offset of the record's gzip
member in a compressed file (per-record gzip, the layout of every common crawler), or of its version
line in an uncompressed file. `WarcRecord.inner` is the position inside the member's decompressed
data, 0 except for files that pack several records into one gzip member.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

CHUNK = 1 << 16
MAX_LINE = 1 << 16  # a WARC or HTTP header line longer than this is not a header
MAX_BLOCK = 1 << 25  # record blocks above 32 MiB are skipped unread (no web page is that large)
HTML_TYPES = ("text/html", "application/xhtml+xml")


class WarcError(Exception):
    """The record at `offset` cannot be read: reason `truncated`, `bad_warc` or `decode_error`.
    `framing` marks a record-level error (reading can resume at the next record header), as opposed to
    damaged compressed data, past which nothing can be read."""

    def __init__(self, reason: str, offset: int, detail: str, framing: bool = False) -> None:
        super().__init__(f"{reason} at byte {offset}: {detail}")
        self.reason = reason
        self.offset = offset
        self.detail = detail
        self.framing = framing


class _BlockPastEnd(WarcError):
    """The file ends inside a record's block: truncated, unless a later record header shows the
    record's Content-Length is wrong."""

    def __init__(self, offset: int, length: int) -> None:
        super().__init__("truncated", offset, f"the file ends inside this record's {length}-byte block", True)
        self.length = length


@dataclass(slots=True)
class WarcRecord:
    """One record. `headers` has lower-cased names; `block` is None when the record was skipped unread
    (not wanted by the caller, or larger than MAX_BLOCK)."""

    offset: int
    inner: int
    headers: dict[str, str]
    block: bytes | None

    @property
    def type(self) -> str:
        return self.headers.get("warc-type", "").lower()

    @property
    def url(self) -> str | None:
        # WARC/1.0 examples wrap the URI in <>, and some writers (wget) copied that
        return self.headers.get("warc-target-uri", "").strip().strip("<>") or None

    @property
    def record_id(self) -> str:
        return self.headers.get("warc-record-id", "").strip().strip("<>")


class _Stream:
    """The bytes of a plain or gzip WARC file, with the file offset of the gzip member holding each byte.

    The decompressed data lives in `_buf[_pos:]`; `_base` is the stream position of `_buf[0]`. In a gzip
    file `_members` lists (stream position where a member starts, its file offset)."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self._in = raw.read(CHUNK)  # raw bytes not yet consumed (gzip: not yet fed to the decompressor)
        self._in_offset = 0  # file offset of self._in[0]
        self.gzip = self._in[:2] == b"\x1f\x8b"
        self._dec: zlib._Decompress | None = None
        self._members: list[tuple[int, int]] = []
        self._buf = bytearray()
        self._pos = 0
        self._base = 0
        self._error: WarcError | None = None  # raised again by every later _fill

    @property
    def position(self) -> int:
        return self._base + self._pos

    def locate(self, position: int) -> tuple[int, int]:
        """(file offset, position inside the decompressed member) of the byte at stream `position`;
        for a plain file (position, 0). Only the current record's member is looked up, so older
        members are forgotten here."""
        if not self.gzip:
            return position, 0
        starts = [start for start, _ in self._members]
        i = max(bisect.bisect_right(starts, position) - 1, 0)
        del self._members[:i]
        start, offset = self._members[0]
        return offset, position - start

    def seek(self, position: int) -> None:
        """Go back to stream `position` at or after the current record's start: within the buffer when
        it still holds it, else by seeking the file (from the start of the gzip member holding it)."""
        if position >= self._base:
            self._pos = position - self._base
            return
        if not self.gzip:
            start, offset = position, position
        else:
            i = max(bisect.bisect_right([m[0] for m in self._members], position) - 1, 0)
            start, offset = self._members[i]
            del self._members[i:]  # re-entered as the decompressor passes them again
        self._raw.seek(offset)
        self._in, self._in_offset, self._dec, self._error = b"", offset, None, None
        self._buf, self._base, self._pos = bytearray(), start, 0
        self.read(position - start, keep=False)

    def at_record_boundary(self) -> bool:
        """Whether a block just read ends where a record ends: at its CRLF CRLF trailer, at line ends and
        a `WARC/` version line, or at the end of the file. A damaged gzip member ahead also answers
        True: that failure belongs to the next record."""
        try:
            while len(self._buf) - self._pos < 9 and self._fill():
                pass
        except WarcError:
            return True
        ahead = bytes(self._buf[self._pos : self._pos + 9])
        rest = ahead.lstrip(b"\r\n")
        return ahead.startswith((b"\r\n\r\n", b"\n\n")) or rest.startswith(b"WARC/") or not rest

    def peek(self, n: int) -> bytes:
        """Up to n bytes at the current position, for messages."""
        return bytes(self._buf[self._pos : self._pos + n])

    def _fill(self) -> bool:
        """Append decompressed bytes to the buffer; False at the end of the file."""
        if self._error is not None:
            raise self._error
        try:
            return self._fill_once()
        except WarcError as exc:
            self._error = exc
            raise

    def _fill_once(self) -> bool:
        if self._pos > CHUNK * 16:
            del self._buf[: self._pos]
            self._base += self._pos
            self._pos = 0
        if not self.gzip:
            chunk = self._in or self._raw.read(CHUNK)
            self._in = b""
            self._buf += chunk
            return bool(chunk)
        while True:
            if self._dec is None:  # between members
                self._in = self._in or self._raw.read(CHUNK)
                if not self._in:
                    return False
                self._dec = zlib.decompressobj(31)
                self._members.append((self._base + len(self._buf), self._in_offset))
            if not self._in:
                self._in = self._raw.read(CHUNK)
                if not self._in:
                    member = self._members[-1][1]
                    raise WarcError(
                        "truncated", member, f"the file ends inside the gzip member at byte {member}"
                    )
            try:
                out = self._dec.decompress(self._in, CHUNK * 4)
            except zlib.error as exc:
                member = self._members[-1][1]
                detail = f"corrupt gzip data in the member at byte {member}: {exc}"
                raise WarcError("decode_error", member, detail) from exc
            rest = self._dec.unused_data if self._dec.eof else self._dec.unconsumed_tail
            self._in_offset += len(self._in) - len(rest)
            self._in = rest
            if self._dec.eof:
                self._dec = None
            if out:
                self._buf += out
                return True

    def readline(self) -> bytes:
        """The next line with its newline; b"" at the end of the file; at most MAX_LINE bytes."""
        while True:
            end = self._buf.find(b"\n", self._pos, self._pos + MAX_LINE)
            if end >= 0 or len(self._buf) - self._pos >= MAX_LINE:
                end = end + 1 if end >= 0 else self._pos + MAX_LINE
                line = bytes(self._buf[self._pos : end])
                self._pos = end
                return line
            if not self._fill():
                line = bytes(self._buf[self._pos :])
                self._pos = len(self._buf)
                return line

    def read(self, n: int, keep: bool = True) -> bytes | None:
        """Exactly n bytes (None if `keep` is false: read and dropped); EOFError if the file ends first."""
        parts = []
        while n > 0:
            if self._pos == len(self._buf) and not self._fill():
                raise EOFError
            take = min(n, len(self._buf) - self._pos)
            if keep:
                parts.append(bytes(self._buf[self._pos : self._pos + take]))
            self._pos += take
            n -= take
        return b"".join(parts) if keep else None


def iter_records(
    raw: BinaryIO,
    keep: Callable[[dict[str, str]], bool],
    on_bad_record: Callable[[WarcError], None] | None = None,
) -> Iterator[WarcRecord]:
    """Every record of a WARC file in order; `keep(headers)` says whose block to read into memory.

    A record with broken framing (not a version line, a malformed header, a `Content-Length` that is
    missing or does not end where the next record begins) goes to `on_bad_record` and reading resumes at
    the next `WARC/` version line; without `on_bad_record` it raises. Raises WarcError (after yielding
    every complete record before it) when the file is truncated or its compressed data is corrupt."""
    stream = _Stream(raw)
    while True:
        start = stream.position
        line = stream.readline()
        if not line:
            return
        if not line.strip():  # the CRLF CRLF after a block, or padding between records
            continue
        offset, inner = stream.locate(start)
        try:
            record = _read_record(stream, line, offset, inner, keep)
        except WarcError as exc:
            error = WarcError(exc.reason, offset, exc.detail, exc.framing)  # the record, not the member
            if not exc.framing or on_bad_record is None:
                raise error from None
            stream.seek(start + len(line))
            resume = _next_version_line(stream)
            if resume is None and exc.reason == "truncated":
                raise error from None  # no later record: the file is cut inside this one
            if resume is None:
                error.detail += "; no record header follows, the rest of the file is skipped"
            else:
                if isinstance(exc, _BlockPastEnd):  # a later record exists, so the length was wrong
                    error.detail = f"Content-Length {exc.length} reaches past the end of the file"
                error.reason = "bad_warc"
                at, inside = stream.locate(resume)
                error.detail += f"; reading resumes at the record at byte {at}" + (
                    f"+{inside}" if inside else ""
                )
            on_bad_record(error)
            if resume is None:
                return
            stream.seek(resume)
            continue
        yield record


def _next_version_line(stream: _Stream) -> int | None:
    """The stream position of the next line starting with `WARC/1.`, or None at the end of the file.
    A damaged gzip member on the way raises its WarcError."""
    line_start = True
    while True:
        position = stream.position
        line = stream.readline()
        if not line:
            return None
        if line_start and line.startswith(b"WARC/1."):
            return position
        line_start = line.endswith(b"\n")


def _read_record(
    stream: _Stream, line: bytes, offset: int, inner: int, keep: Callable[[dict[str, str]], bool]
) -> WarcRecord:
    if not line.startswith(b"WARC/"):
        raise WarcError(
            "bad_warc", offset, f"expected a WARC/1.x version line, found {line[:60]!r}", framing=True
        )
    headers = _read_headers(stream, offset)
    try:
        length = int(headers.get("content-length", ""))
    except ValueError:
        detail = f"the record has no valid Content-Length ({headers.get('content-length')!r})"
        raise WarcError("bad_warc", offset, detail, framing=True) from None
    if length < 0:
        raise WarcError("bad_warc", offset, f"negative Content-Length {length}", framing=True)
    wanted = length <= MAX_BLOCK and keep(headers)
    try:
        block = stream.read(length, keep=wanted)
    except EOFError:
        raise _BlockPastEnd(offset, length) from None
    if not stream.at_record_boundary():
        detail = f"Content-Length {length} does not end at the next record (the block is followed by {stream.peek(20)!r})"
        raise WarcError("bad_warc", offset, detail, framing=True)
    return WarcRecord(offset, inner, headers, block)


def _read_headers(stream: _Stream, offset: int) -> dict[str, str]:
    headers: dict[str, str] = {}
    name = ""
    while True:
        line = stream.readline()
        if not line:
            raise WarcError("truncated", offset, "the file ends inside this record's headers", framing=True)
        if line in (b"\r\n", b"\n"):
            return headers
        if line[:1] in (b" ", b"\t") and name:  # folded continuation of the previous header
            headers[name] += " " + line.strip().decode("utf-8", "replace")
            continue
        key, sep, value = line.partition(b":")
        if not sep:
            raise WarcError("bad_warc", offset, f"not a header line: {line[:60]!r}", framing=True)
        name = key.strip().decode("latin-1").lower()
        headers[name] = value.strip().decode("utf-8", "replace")


@dataclass(slots=True)
class HttpResponse:
    status: int | None
    headers: dict[str, str]  # lower-cased names; repeated headers joined with ", "
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    @property
    def charset(self) -> str | None:
        for param in self.headers.get("content-type", "").split(";")[1:]:
            key, _, value = param.partition("=")
            if key.strip().lower() == "charset":
                return value.strip().strip("\"'") or None
        return None


def parse_http(block: bytes) -> HttpResponse:
    """Status, headers and raw body of an HTTP response block; ValueError if it is not one."""
    ends = [(i, len(sep)) for sep in (b"\r\n\r\n", b"\n\n") if (i := block.find(sep)) >= 0]
    if not block.startswith(b"HTTP/") or not ends:
        raise ValueError(f"not an HTTP response: {block[:40]!r}")
    end, size = min(ends)
    lines = block[:end].decode("latin-1").splitlines()
    parts = lines[0].split()
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        key, sep, value = line.partition(":")
        if sep:
            key = key.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
    return HttpResponse(status, headers, block[end + size :])


def decode_body(response: HttpResponse) -> bytes:
    """The body with transfer and content encodings undone. A body labelled chunked that does not parse
    as chunks is taken as already de-chunked (crawlers often store it so and keep the header). A
    compressed body cut short (crawlers truncate large payloads) yields what it holds. ValueError for
    an encoding we cannot undo."""
    body = response.body
    if "chunked" in response.headers.get("transfer-encoding", "").lower():
        body = _dechunk(body)
    codings = [c.strip().lower() for c in response.headers.get("content-encoding", "").split(",")]
    for coding in reversed([c for c in codings if c and c != "identity"]):
        body = _decompress(body, coding)
    return body


def _dechunk(body: bytes) -> bytes:
    out = []
    pos = 0
    while pos < len(body):
        end = body.find(b"\n", pos)
        if end < 0:
            break
        size_field = body[pos:end].split(b";")[0].strip()
        try:
            size = int(size_field, 16)
        except ValueError:
            if pos == 0:
                return body  # not chunked after all
            break
        if size == 0:
            break
        out.append(body[end + 1 : end + 1 + size])
        pos = end + 1 + size
        pos += 2 if body[pos : pos + 2] == b"\r\n" else 1 if body[pos : pos + 1] == b"\n" else 0
    return b"".join(out)


def _decompress(body: bytes, coding: str) -> bytes:
    if coding in ("gzip", "x-gzip", "deflate"):
        if coding != "deflate" and body[:2] != b"\x1f\x8b":
            return body  # stored decoded, header kept
        for wbits in (47, -15) if coding == "deflate" else (31,):  # zlib/gzip auto-detect, then raw deflate
            try:
                return zlib.decompressobj(wbits).decompress(body)
            except zlib.error as exc:
                error = exc
        if body.lstrip()[:1] == b"<":
            return body  # markup: stored decoded, header kept
        raise ValueError(f"corrupt {coding} body: {error}")
    if coding == "br":
        try:
            import brotli
        except ImportError:
            raise ValueError("brotli-compressed body, and the 'brotli' package is not installed") from None
        try:
            return brotli.decompress(body)
        except brotli.error as exc:
            raise ValueError(f"corrupt br body: {exc}") from exc
    raise ValueError(f"unsupported Content-Encoding {coding!r}")


def is_html(content_type: str, body: bytes) -> bool:
    """HTML by its declared type; with no declared type, by its first bytes."""
    if content_type:
        return content_type in HTML_TYPES
    head = body[:256].lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    return head.startswith((b"<!doctype html", b"<html"))
