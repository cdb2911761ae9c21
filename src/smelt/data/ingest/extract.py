"""HTML bytes -> main text: charset decoding, then a maintained boilerplate-removing extractor.

Two extractors are supported (`data.sources[i].extractor`); `python bench/extraction.py` measures both
on the shared benchmark pages (word 4-gram F1 against reference article bodies, and trafilatura's own
must-contain / must-not-contain snippets):
* trafilatura (the default): the better main text on both sets (F1 0.96 vs 0.93), run with `fast=True`,
  which skips its fallback extractors at no measured loss in quality and 1.3x the speed;
* resiliparse: about 10x faster, keeps more boilerplate; for when extraction time dominates.
Both get the same decoded text, so their outputs differ only by the extraction itself.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import Callable

from smelt.errors import UserError

EXTRACTORS = ("trafilatura", "resiliparse")
DETECT_BYTES = 1 << 16  # the detector looks at this much of an undeclared, non-UTF-8 page
META_BYTES = 4096  # the HTML spec prescans 1024 bytes for <meta charset>; some pages put it later

_BOMS = ((codecs.BOM_UTF8, "utf-8"), (codecs.BOM_UTF16_LE, "utf-16-le"), (codecs.BOM_UTF16_BE, "utf-16-be"))
_META_CHARSET = re.compile(rb"<meta[^>]{0,300}?charset\s*=\s*[\"']?\s*([a-z0-9_:.+-]{1,40})", re.IGNORECASE)
# WHATWG encoding standard: labels browsers decode with a superset codec
_SUPERSETS = {
    "ascii": "cp1252",
    "iso8859-1": "cp1252",
    "iso8859-9": "cp1254",
    "tis-620": "cp874",
    "iso8859-11": "cp874",
    "gb2312": "gb18030",
    "gbk": "gb18030",
    "euc_kr": "cp949",
    "shift_jis": "cp932",
    "utf-16": "utf-8",  # a <meta> or header saying UTF-16 over bytes that parsed as ASCII markup
    "utf-16-le": "utf-8",
    "utf-16-be": "utf-8",
}


def decode_html(data: bytes, declared: str | None = None) -> tuple[str, str]:
    """(text, codec used) for an HTML page's bytes; `declared` is the HTTP header's charset, if any.

    Order: a byte-order mark; valid UTF-8; the HTTP charset; the <meta> charset; charset-normalizer's
    guess; else UTF-8 with replacement characters. Valid UTF-8 goes before the declarations because a
    page mislabelled ISO-8859-1 by its server is common and non-ASCII text that happens to be valid
    UTF-8 is not; a page in a legacy codec fails the UTF-8 check at its first non-ASCII byte."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return data[len(bom) :].decode(codec, errors="replace"), codec
    candidates = ["utf-8", declared, _meta_charset(data)]
    for label in candidates:
        codec = _codec(label)
        if codec is not None:
            try:
                return data.decode(codec), codec
            except UnicodeDecodeError:
                continue
    codec = _detect(data)
    if codec is not None:
        return data.decode(codec, errors="replace"), codec
    return data.decode("utf-8", errors="replace"), "utf-8"


def _meta_charset(data: bytes) -> str | None:
    match = _META_CHARSET.search(data, 0, META_BYTES)
    return match.group(1).decode("ascii") if match else None


def _codec(label: str | None) -> str | None:
    """Python's codec for a charset label, mapped as browsers map it; None for unknown labels."""
    if not label:
        return None
    try:
        name = codecs.lookup(label.strip().lower()).name
    except LookupError:
        return None
    return _SUPERSETS.get(name, name)


def _detect(data: bytes) -> str | None:
    from charset_normalizer import from_bytes

    best = from_bytes(data[:DETECT_BYTES]).best()
    return None if best is None else _codec(best.encoding)


def extractor(name: str) -> Callable[[str], str]:
    """The main-text function of extractor `name`: HTML text in, plain text out ("" for a page without
    main text). UserError naming the package to install when it is missing."""
    if name not in EXTRACTORS:
        raise UserError(f"unknown extractor {name!r}; data.sources[].extractor must be one of {EXTRACTORS}")
    try:
        if name == "trafilatura":
            import trafilatura

            return _trafilatura(trafilatura.extract)
        from resiliparse.extract.html2text import extract_plain_text

        return _resiliparse(extract_plain_text)
    except ImportError as exc:
        extra = " lxml_html_clean" if name == "trafilatura" and "lxml" in str(exc) else ""
        raise UserError(
            f"the {name!r} HTML extractor cannot be imported ({type(exc).__name__}: {exc}). Install it with "
            f"`pip install {name}{extra}`, or set the source's `extractor` to the other one of {EXTRACTORS}."
        ) from exc


def _trafilatura(extract: Callable[..., str | None]) -> Callable[[str], str]:
    def run(html: str) -> str:
        return extract(html, fast=True, include_comments=False) or ""

    return run


def _resiliparse(extract_plain_text: Callable[..., str]) -> Callable[[str], str]:
    def run(html: str) -> str:
        # no image alt texts, comment sections or author/date lines: not prose, and measured better
        return extract_plain_text(html, main_content=True, alt_texts=False, comments=False, post_meta=False)

    return run
