"""HTML and WARC readers: real WARC files and web pages from the shared data, and synthetic edge cases."""

import gzip
import json
import sys
import zlib

import pyarrow.parquet as pq
import pytest

from smelt.data.curate import curate
from smelt.data.ingest import readers
from smelt.data.ingest.extract import decode_html, extractor
from smelt.data.ingest.readers import ReadSpec
from smelt.data.ingest.warc import decode_body, iter_records, parse_http
from smelt.data.ingest.web import read_html, read_warc
from smelt.data.ledger import Ledger
from smelt.errors import UserError

PARAGRAPHS = [
    "Caf\u00e9 cr\u00e8me and cr\u00eapes: the morning market opens before the sun rises over the old town square.",
    "Farmers bring cheese, bread and apples from the valley, and the stalls stay open until noon every day.",
    "Visitors who come early find the best produce, and the baker sells out of croissants by nine o'clock.",
    "In winter the market moves indoors, into the hall that was built in 1892 for the grain exchange.",
]
PAGE = (
    "<html><head>{meta}<title>Market</title></head><body><nav><a href='/'>Home</a> | <a href='/x'>About</a></nav>"
    "<article><h1>The market</h1>{body}</article><footer>Copyright 2024 Example Town</footer></body></html>"
)


def page(meta: str = "") -> str:
    return PAGE.format(meta=meta, body="".join(f"<p>{p}</p>" for p in PARAGRAPHS))


def run(reader, root, rel, extractor_name="trafilatura", fmt="warc"):
    spec = ReadSpec("web", 0, fmt, str(root), extractor=extractor_name)
    ledger, state = Ledger(), {"records": 0}
    docs = list(reader(spec, root / rel, rel, ledger, state))
    return docs, ledger, state


def http_block(body: bytes, status: str = "200 OK", **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{k.replace('_', '-')}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def warc_record(
    kind: str, url: str, block: bytes, content_type: str = "application/http; msgtype=response"
) -> bytes:
    head = [
        "WARC/1.0",
        f"WARC-Type: {kind}",
        f"WARC-Target-URI: {url}",
        f"WARC-Record-ID: <urn:uuid:{zlib.crc32(url.encode() + kind.encode()):08x}>",
        "WARC-Date: 2024-01-01T00:00:00Z",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(block)}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def chunked(data: bytes, size: int = 100) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size]) for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


# --- shared WARC files ----------------------------------------------------------------------------

SHARED_WARCS = {
    # file: (HTML documents, skipped records by kind)
    "dolma_sample-0000.warc.gz": (22, {"request": 22, "not_html": 2, "warcinfo": 1, "metadata": 1}),
    "dolma_sample-0001.warc.gz": (15, {"request": 15, "not_html": 2, "warcinfo": 1, "metadata": 1}),
    "pywb_iana.warc.gz": (
        16,
        {"request": 171, "revisit": 123, "not_html": 28, "status_3xx": 4, "warcinfo": 1},
    ),
    "warcio_example.warc.gz": (1, {"warcinfo": 2, "request": 2, "revisit": 1}),
    "warcio_example-iana.org-chunked.warc": (1, {"warcinfo": 1, "request": 1}),
}


@pytest.mark.parametrize("name", sorted(SHARED_WARCS))
def test_shared_warc_files_html_records_urls_and_offsets(shared_data, name):
    root = shared_data / "corpus" / "warc"
    docs, ledger, state = run(read_warc, root, name, "resiliparse")
    n_docs, skipped = SHARED_WARCS[name]
    assert len(docs) == state["records"] == ledger.records_in["web"] == n_docs
    assert dict(state["skipped"]) == skipped
    assert not ledger.entries
    assert all(d.url and d.url.startswith(("http://", "https://")) for d in docs)
    assert all(d.id == f"{name}@{d.line}" and d.meta["offset"] == d.line for d in docs)
    assert [d.line for d in docs] == sorted({d.line for d in docs})
    assert sum(bool(d.text.strip()) for d in docs) == n_docs
    # every offset is where that record starts: its gzip member (or its version line) names the URL
    data = (root / name).read_bytes()
    for doc in docs:
        if name.endswith(".gz"):
            record = zlib.decompressobj(31).decompress(data[doc.line :])
        else:
            record = data[doc.line : doc.line + 4096]
        assert record.startswith(b"WARC/1.")
        assert doc.url.encode() in record.split(b"\r\n\r\n")[0]


def test_chunked_response_is_dechunked(shared_data):
    path = shared_data / "corpus" / "warc" / "warcio_example-iana.org-chunked.warc"
    with open(path, "rb") as handle:
        (record,) = [r for r in iter_records(handle, lambda h: True) if r.type == "response"]
    response = parse_http(record.block)
    assert response.headers["transfer-encoding"] == "chunked" and response.body.startswith(b"001c37\r\n")
    body = decode_body(response)
    assert len(body) == 0x1C37 and body.startswith(b"<!doctype html>") and body.rstrip().endswith(b"</html>")
    (doc,) = run(read_warc, path.parent, path.name)[0]
    assert doc.url == "http://www.iana.org/" and "Root Zone" in doc.text and "001c37" not in doc.text


def test_pywb_body_labelled_chunked_but_stored_dechunked_is_read(shared_data):
    docs = run(read_warc, shared_data / "corpus" / "warc", "pywb_iana.warc.gz", "resiliparse")[0]
    home = next(d for d in docs if d.url == "http://www.iana.org/")
    assert "Internet Assigned Numbers Authority" in home.text


def test_truncated_warc_gz_keeps_earlier_records(shared_data, tmp_path):
    data = (shared_data / "corpus" / "warc" / "dolma_sample-0000.warc.gz").read_bytes()
    (tmp_path / "cut.warc.gz").write_bytes(data[:50_000])
    docs, ledger, state = run(read_warc, tmp_path, "cut.warc.gz", "resiliparse")
    assert [d.line for d in docs] == [865, 15904, 24881, 30509, 34307, 39047]
    (entry,) = ledger.entries
    assert (entry["reason"], entry["line"], entry["id"]) == ("truncated", 44678, "cut.warc.gz@44678")
    assert "6 records before it kept" in entry["detail"]
    assert state["records"] == ledger.records_in["web"] == 7


def test_corrupt_gzip_member_is_a_decode_error(shared_data, tmp_path):
    data = bytearray((shared_data / "corpus" / "warc" / "dolma_sample-0000.warc.gz").read_bytes())
    data[20_000:20_010] = bytes(10)
    (tmp_path / "bad.warc.gz").write_bytes(bytes(data))
    docs, ledger, _ = run(read_warc, tmp_path, "bad.warc.gz", "resiliparse")
    assert [d.line for d in docs] == [865]
    assert [(e["reason"], e["line"]) for e in ledger.entries] == [("decode_error", 15904)]


def test_uncompressed_and_single_member_gzip_warc(shared_data, tmp_path):
    whole = gzip.decompress((shared_data / "corpus" / "warc" / "warcio_example.warc.gz").read_bytes())
    (tmp_path / "plain.warc").write_bytes(whole)
    (tmp_path / "one.warc.gz").write_bytes(gzip.compress(whole))
    (plain,) = run(read_warc, tmp_path, "plain.warc", "resiliparse")[0]
    (packed,) = run(read_warc, tmp_path, "one.warc.gz", "resiliparse")[0]
    assert whole[plain.line :].startswith(b"WARC/1.0") and plain.line > 0
    assert packed.line == 0 and packed.id == f"one.warc.gz@0+{plain.line}"
    assert packed.text == plain.text and packed.url == plain.url == "http://example.com/"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"hello, not a WARC file\n" * 5, "bad_warc"),
        (bytes(range(256)) * 4, "bad_warc"),
        (b"\x1f\x8b\x08", "truncated"),
    ],
)
def test_junk_warc_is_quarantined(tmp_path, content, reason):
    (tmp_path / "junk.warc").write_bytes(content)
    docs, ledger, state = run(read_warc, tmp_path, "junk.warc")
    assert docs == [] and state["records"] == 1
    assert [(e["reason"], e["line"]) for e in ledger.entries] == [(reason, 0)]


def test_empty_files(tmp_path):
    (tmp_path / "empty.warc.gz").write_bytes(b"")
    (tmp_path / "empty.html").write_bytes(b"")
    docs, ledger, state = run(read_warc, tmp_path, "empty.warc.gz")
    assert (docs, ledger.entries, state["records"]) == ([], [], 0)
    docs, ledger, state = run(read_html, tmp_path, "empty.html", fmt="html")
    assert [(d.id, d.text) for d in docs] == [("empty.html", "")] and not ledger.entries


# --- synthetic WARC: encodings, skipped records, quarantine ------------------------------------------


def test_synthetic_warc_encodings_and_skips(tmp_path):
    latin = page().encode("latin-1")  # declared only in the HTTP header
    records = [
        warc_record("warcinfo", "", b"software: test\r\n", "application/warc-fields"),
        warc_record(
            "request", "http://a.test/", b"GET / HTTP/1.1\r\n\r\n", "application/http; msgtype=request"
        ),
        warc_record(
            "response",
            "http://a.test/",
            http_block(
                chunked(gzip.compress(latin)),
                Content_Type="text/html; charset=ISO-8859-1",
                Content_Encoding="gzip",
                Transfer_Encoding="chunked",
            ),
        ),
        warc_record(
            "response",
            "http://a.test/deflate",
            http_block(zlib.compress(page().encode()), Content_Type="text/html", Content_Encoding="deflate"),
        ),
        warc_record(
            "response",
            "http://a.test/missing",
            http_block(b"<html>gone</html>", "404 Not Found", Content_Type="text/html"),
        ),
        warc_record(
            "response", "http://a.test/logo.png", http_block(b"\x89PNG\r\n\x1a\n", Content_Type="image/png")
        ),
        warc_record("revisit", "http://a.test/", http_block(b""), "application/http; msgtype=response"),
        warc_record(
            "response",
            "http://a.test/z",
            http_block(b"xyz", Content_Type="text/html", Content_Encoding="compress"),
        ),
        warc_record(
            "response",
            "http://a.test/blank",
            http_block(b"<html><body></body></html>", Content_Type="text/html"),
        ),
    ]
    members = [gzip.compress(r) for r in records]
    offsets = [sum(len(m) for m in members[:i]) for i in range(len(members))]
    (tmp_path / "s.warc.gz").write_bytes(b"".join(members))
    docs, ledger, state = run(read_warc, tmp_path, "s.warc.gz")
    assert [d.url for d in docs] == ["http://a.test/", "http://a.test/deflate", "http://a.test/blank"]
    assert [d.line for d in docs] == [offsets[2], offsets[3], offsets[8]]
    assert "Caf\u00e9 cr\u00e8me and cr\u00eapes" in docs[0].text and docs[0].meta["charset"] == "cp1252"
    assert "grain exchange" in docs[1].text and "Copyright 2024" not in docs[1].text
    assert docs[2].text == ""  # readable, no main text: a document the length filter will drop
    assert docs[0].meta["warc_record_id"].startswith("urn:uuid:") and docs[0].meta["warc_date"]
    assert dict(state["skipped"]) == {
        "warcinfo": 1,
        "request": 1,
        "status_4xx": 1,
        "not_html": 1,
        "revisit": 1,
    }
    (entry,) = ledger.entries
    assert entry["reason"] == "decode_error" and "compress" in entry["detail"]
    assert (entry["url"], entry["line"], entry["id"]) == (
        "http://a.test/z",
        offsets[7],
        f"s.warc.gz@{offsets[7]}",
    )
    assert state["records"] == ledger.records_in["web"] == 4


# --- HTML files ------------------------------------------------------------------------------------


def test_latin1_html_with_meta_charset(tmp_path):
    (tmp_path / "p.html").write_bytes(page('<meta charset="iso-8859-1">').encode("latin-1"))
    for name in ("trafilatura", "resiliparse"):
        (doc,) = run(read_html, tmp_path, "p.html", name, fmt="html")[0]
        assert "Caf\u00e9 cr\u00e8me and cr\u00eapes" in doc.text and "grain exchange" in doc.text
        assert doc.meta["charset"] == "cp1252" and doc.line is None and doc.url is None


def test_decode_html_order():
    text = "na\u00efve caf\u00e9"
    assert decode_html(text.encode("utf-8"), "iso-8859-1") == (text, "utf-8")  # valid UTF-8 beats the header
    assert decode_html(text.encode("cp1252"), "windows-1252")[0] == text
    russian = '<meta charset="koi8-r">\u043c\u0438\u0440'
    assert decode_html(russian.encode("koi8-r")) == (russian, "koi8-r")
    assert decode_html(b"\xef\xbb\xbf<p>x</p>") == ("<p>x</p>", "utf-8")


def test_binary_and_broken_gzip_html_are_quarantined(tmp_path):
    (tmp_path / "img.html").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    (tmp_path / "cut.html.gz").write_bytes(gzip.compress(page().encode())[:60])
    assert [e["reason"] for e in run(read_html, tmp_path, "img.html", fmt="html")[1].entries] == ["binary"]
    assert [e["reason"] for e in run(read_html, tmp_path, "cut.html.gz", fmt="html")[1].entries] == [
        "truncated"
    ]


EVAL_PAGES = ["boingboing.net.millenials.html", "next2games.de.anno.html", "columbus-entdeckt.de.trolls.html"]


@pytest.mark.parametrize("name", ["trafilatura", "resiliparse"])
def test_shared_pages_keep_main_text_and_drop_boilerplate(shared_data, name):
    root = shared_data / "corpus" / "web" / "trafilatura-eval"
    items = {v["file"]: v for v in json.loads((root / "evaldata.json").read_text(encoding="utf-8")).values()}
    for file in EVAL_PAGES:
        (doc,) = run(read_html, root / "html", file, name, fmt="html")[0]
        assert all(snippet in doc.text for snippet in items[file]["with"]), file
        assert not any(snippet in doc.text for snippet in items[file]["without"]), file


def test_scrapinghub_html_gz_page(shared_data):
    root = shared_data / "corpus" / "web" / "article-extraction-benchmark"
    gold = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    key = "05844573ca7e1fba714d715bb11ca08c26e25328999c74a1cb3bc8a0e4399f0f"
    (doc,) = run(read_html, root, f"html/{key}.html.gz", fmt="html")[0]
    assert doc.id == f"html/{key}.html.gz" and doc.url == gold[key]["url"]
    words, got = set(gold[key]["articleBody"].split()), set(doc.text.split())
    assert len(words & got) / len(words) > 0.95 and len(words & got) / len(got) > 0.9


def test_missing_extractor_package_names_the_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "trafilatura", None)
    monkeypatch.setitem(sys.modules, "resiliparse.extract.html2text", None)
    for name in ("trafilatura", "resiliparse"):
        with pytest.raises(UserError, match=f"pip install {name}"):
            extractor(name)
    (tmp_path / "p.html").write_text(page())
    with pytest.raises(UserError, match="pip install trafilatura"):
        run(read_html, tmp_path, "p.html", fmt="html")


# --- through the dispatcher and the curate stage ----------------------------------------------------


def test_read_file_dispatches_html_and_warc(shared_data, tmp_path):
    (tmp_path / "p.htm").write_text(page('<link rel="canonical" href="https://example.org/market">'))
    (doc,) = readers.read_file(ReadSpec("h", 0, "html", str(tmp_path)), tmp_path / "p.htm", Ledger())
    assert doc.url == "https://example.org/market" and "grain exchange" in doc.text
    root = shared_data / "corpus" / "warc"
    spec = ReadSpec("w", 0, "warc", str(root), extractor="resiliparse")
    docs = list(readers.read_file(spec, root / "warcio_example.warc.gz", Ledger()))
    assert [d.url for d in docs] == ["http://example.com/"]


def test_curate_a_warc_source(shared_data, tmp_path, source, config):
    root = shared_data / "corpus" / "warc"
    cfg = config(
        source("crawl", root, format="warc", include=["warcio_example*", "dolma_sample-0001.warc.gz"]),
        min_chars=200,
    )
    stats = curate(cfg, tmp_path / "out")
    assert stats["documents_in"] == 17
    assert stats["documents_in"] == (
        stats["documents_kept"] + sum(stats["dropped"].values()) + sum(stats["quarantined"].values())
    )
    assert stats["documents_kept"] > 0 and not stats["quarantined"]
    rows = [
        r
        for p in sorted((tmp_path / "out").glob("*/crawl/part-*.parquet"))
        for r in pq.read_table(p).to_pylist()
    ]
    assert len(rows) == stats["documents_kept"]
    for row in rows:
        assert row["url"].startswith("https://") or row["url"].startswith("http://")
        file, _, offset = row["id"].partition("@")
        assert file in (
            "warcio_example.warc.gz",
            "warcio_example-iana.org-chunked.warc",
            "dolma_sample-0001.warc.gz",
        )
        assert json.loads(row["meta"])["offset"] == int(offset)
