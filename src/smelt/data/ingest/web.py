"""Readers for web data: HTML files (`format = "html"`) and WARC archives (`format = "warc"`).

Both follow the reader contract of data/ingest/readers.py: one `Doc` per page with its provenance (file, URL,
and for WARC the byte offset of the record), `ledger.records_in` and `state["records"]` counted once
per record seen, and unreadable input quarantined with a reason while the run goes on. A page whose
main text is empty is still a document (the length filter drops it as `empty`): it was readable, the
extractor found nothing to keep, and that is a figure worth seeing in the stats.

In a WARC file only `response` and `resource` records carrying HTML are records; requests, revisits
(which hold no payload), metadata, warcinfo, non-HTML payloads (images, CSS, scripts) and non-2xx
responses (redirect stubs, error pages) are skipped and tallied per file in `state["skipped"]`.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

from smelt.data.ingest.extract import decode_html, extractor
from smelt.data.ingest.warc import WarcError, WarcRecord, decode_body, is_html, iter_records, parse_http
from smelt.data.ledger import Doc, Ledger
from smelt.data.read_spec import ReadSpec

BINARY_SNIFF = 8192  # a NUL byte in this prefix marks a file as binary, not HTML
URL_SNIFF = 1 << 16
_LINK_TAG = re.compile(r"<(?:link|meta)\b[^>]*>", re.IGNORECASE)
_ATTR = re.compile(r"""([a-z:-]+)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))""", re.IGNORECASE)
_PAYLOAD_TYPES = ("response", "resource")


def read_html(spec: ReadSpec, path: Path, rel: str, ledger: Ledger, state: dict) -> Iterator[Doc]:
    """One document per HTML file (`.html`, `.htm`, or gzip-compressed `.html.gz`). Its id is the
    relative path; its URL is the page's canonical link (or og:url) when it declares one."""
    _count(spec, ledger, state)
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as exc:
            reason = "truncated" if isinstance(exc, EOFError) else "decode_error"
            ledger.quarantine(spec.name, rel, rel, None, reason, f"gzip: {type(exc).__name__}: {exc}")
            return
    if _is_binary(data):
        ledger.quarantine(spec.name, rel, rel, None, "binary", "contains NUL bytes", bytes=len(data))
        return
    if not data.strip():
        yield Doc(spec.name, spec.index, rel, "", rel)
        return
    html, charset = decode_html(data)
    text = _extract(spec, extractor(spec.extractor), html, rel, rel, None, ledger)
    if text is not None:
        yield Doc(spec.name, spec.index, rel, text, rel, None, _declared_url(html), meta={"charset": charset})


def read_warc(spec: ReadSpec, path: Path, rel: str, ledger: Ledger, state: dict) -> Iterator[Doc]:
    """One document per HTML response or resource record of a WARC file (`.warc`, `.warc.gz`). Its id is
    `<file>@<offset>` (`+<n>` when several records share one gzip member) and `line` the offset; the
    WARC-Record-ID and date go to `meta`. A record with broken framing (such as a wrong `Content-Length`)
    is quarantined as `bad_warc` with its offset and reading resumes at the next record header. A file
    that cannot be read to its end (truncated, corrupt gzip data) keeps the records before the failure
    and quarantines the rest as one record, with reason `truncated` or `decode_error` and the offset."""
    extract = extractor(spec.extractor)
    skipped = state.setdefault("skipped", Counter())

    def bad_record(exc: WarcError) -> None:  # one record with broken framing; reading goes on after it
        _count(spec, ledger, state)
        ledger.quarantine(spec.name, f"{rel}@{exc.offset}", rel, exc.offset, exc.reason, exc.detail)

    with open(path, "rb") as handle:
        records = iter_records(
            handle, lambda headers: headers.get("warc-type", "").lower() in _PAYLOAD_TYPES, bad_record
        )
        before = 0  # records read before a failure
        try:
            for record in records:
                if record.type not in _PAYLOAD_TYPES:
                    skipped[record.type or "untyped"] += 1
                    continue
                doc = _warc_doc(spec, rel, record, extract, ledger, state)
                before = state["records"]
                if doc is not None:
                    yield doc
        except WarcError as exc:
            _count(spec, ledger, state)
            ledger.quarantine(
                spec.name,
                f"{rel}@{exc.offset}",
                rel,
                exc.offset,
                exc.reason,
                f"cannot read the file from byte {exc.offset} on: {exc.detail} ({before} records before it kept)",
            )


def _warc_doc(
    spec: ReadSpec,
    rel: str,
    record: WarcRecord,
    extract: Callable[[str], str],
    ledger: Ledger,
    state: dict,
) -> Doc | None:
    """The document of one payload record; None when it is skipped (not a page) or quarantined."""
    skipped = state["skipped"]
    if record.block is None:
        skipped["oversize"] += 1
        return None
    response = None
    if record.type == "resource" or not record.block.startswith(b"HTTP/"):
        content_type, body = _mime(record.headers.get("content-type", "")), record.block
    else:
        try:
            response = parse_http(record.block)
        except ValueError:
            skipped["not_http"] += 1
            return None
        if response.status is not None and not 200 <= response.status < 300:
            skipped[f"status_{response.status // 100}xx"] += 1
            return None
        content_type, body = response.content_type, response.body
    if not is_html(content_type, body):
        skipped["not_html"] += 1
        return None
    doc_id = f"{rel}@{record.offset}" + (f"+{record.inner}" if record.inner else "")
    url = record.url
    _count(spec, ledger, state)
    if response is not None:
        try:
            body = decode_body(response)
        except ValueError as exc:
            ledger.quarantine(spec.name, doc_id, rel, record.offset, "decode_error", str(exc), url=url)
            return None
    if _is_binary(body):
        ledger.quarantine(
            spec.name, doc_id, rel, record.offset, "binary", "HTML payload with NUL bytes", url=url
        )
        return None
    meta = {
        "offset": record.offset,
        "warc_record_id": record.record_id,
        "warc_date": record.headers.get("warc-date"),
    }
    charset = response.charset if response is not None else None
    html, meta["charset"] = decode_html(body, charset) if body.strip() else ("", None)
    text = _extract(spec, extract, html, doc_id, rel, record.offset, ledger) if html else ""
    if text is None:
        return None
    return Doc(spec.name, spec.index, doc_id, text, rel, record.offset, url, meta=meta)


def _extract(
    spec: ReadSpec,
    extract: Callable[[str], str],
    html: str,
    doc_id: str,
    rel: str,
    line: int | None,
    ledger: Ledger,
) -> str | None:
    """The extractor's text, or None (quarantined as `extract_error`) if it raised: extractors parse
    arbitrary markup, and one pathological page must not end the run."""
    try:
        return extract(html)
    except Exception as exc:  # noqa: BLE001 - any failure inside a third-party parser is per-page
        ledger.quarantine(spec.name, doc_id, rel, line, "extract_error", f"{type(exc).__name__}: {exc}"[:500])
        return None


def _count(spec: ReadSpec, ledger: Ledger, state: dict) -> None:
    state["records"] += 1
    ledger.records_in[spec.name] += 1


def _is_binary(data: bytes) -> bool:
    head = data[:BINARY_SNIFF]
    return b"\x00" in head and not head.startswith((b"\xff\xfe", b"\xfe\xff"))


def _mime(content_type: str) -> str:
    return content_type.split(";")[0].strip().lower()


def _declared_url(html: str) -> str | None:
    """The page's own absolute URL: <link rel="canonical" href>, else <meta property="og:url" content>."""
    found: dict[str, str] = {}
    for tag in _LINK_TAG.findall(html, 0, URL_SNIFF):
        attrs = {m[0].lower(): m[1] or m[2] or m[3] for m in _ATTR.findall(tag)}
        if attrs.get("rel", "").lower() == "canonical" and "href" in attrs:
            found.setdefault("canonical", attrs["href"])
        elif attrs.get("property", "").lower() == "og:url" and "content" in attrs:
            found.setdefault("og", attrs["content"])
    for url in (found.get("canonical"), found.get("og")):
        if url and url.startswith(("http://", "https://")):
            return url.strip()
    return None
