"""A WARC record with a wrong Content-Length costs that record only: reading resumes at the next header."""

import gzip

import pytest

from smelt.data.ingest.readers import ReadSpec
from smelt.data.ingest.warc import WarcError, iter_records
from smelt.data.ingest.web import read_warc
from smelt.data.ledger import Ledger

RESPONSES = 21
BAD = 8  # the response whose Content-Length is corrupted


def response(i: int, length_delta: int = 0, length_text: str | None = None) -> bytes:
    paragraphs = "".join(
        f"<p>Page {i}, paragraph {k}: the tide tables for the harbour are posted at the ferry office.</p>"
        for k in range(3)
    )
    body = f"<html><body><article><h1>Page {i}</h1>{paragraphs}</article></body></html>".encode()
    block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + body
    length = length_text if length_text is not None else str(len(block) + length_delta)
    head = [
        "WARC/1.0",
        "WARC-Type: response",
        f"WARC-Target-URI: http://tide.test/{i}",
        f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{i:012d}>",
        "Content-Type: application/http; msgtype=response",
        f"Content-Length: {length}",
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def request(i: int) -> bytes:
    block = f"GET /{i} HTTP/1.1\r\nHost: tide.test\r\n\r\n".encode()
    head = ["WARC/1.0", "WARC-Type: request", f"WARC-Target-URI: http://tide.test/{i}"]
    head.append(f"Content-Length: {len(block)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + block + b"\r\n\r\n"


def write_warc(path, bad_record: bytes, compressed: bool) -> list[int]:
    """A request and a response per page, page BAD's response replaced by `bad_record`; the offsets of
    the records."""
    records = []
    for i in range(RESPONSES):
        records.append(request(i))
        records.append(bad_record if i == BAD else response(i))
    pieces = [gzip.compress(r, mtime=0) for r in records] if compressed else records
    offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
    path.write_bytes(b"".join(pieces))
    return offsets


def read(path):
    spec = ReadSpec("web", 0, "warc", str(path.parent), extractor="resiliparse")
    ledger, state = Ledger(), {"records": 0}
    docs = list(read_warc(spec, path, path.name, ledger, state))
    return docs, ledger, state


CORRUPTIONS = {
    "longer": dict(length_delta=5000),  # swallows the next records
    "slightly_longer": dict(length_delta=7),
    "shorter": dict(length_delta=-40),  # leaves part of the block where a header should be
    "past_the_end": dict(length_text="99999999"),
    "not_a_number": dict(length_text="5l2"),
}


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "plain"])
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_bad_content_length_quarantines_one_record_and_reads_the_rest(tmp_path, compressed, corruption):
    path = tmp_path / ("tide.warc.gz" if compressed else "tide.warc")
    offsets = write_warc(path, response(BAD, **CORRUPTIONS[corruption]), compressed)
    bad, resume = offsets[2 * BAD + 1], offsets[2 * BAD + 2]  # the bad response; the request after it
    responses = offsets[1::2]
    docs, ledger, state = read(path)

    assert [d.url for d in docs] == [f"http://tide.test/{i}" for i in range(RESPONSES) if i != BAD]
    assert [d.line for d in docs] == [o for i, o in enumerate(responses) if i != BAD]
    assert all(f"Page {d.url.rsplit('/', 1)[1]}, paragraph 2" in d.text for d in docs)
    (entry,) = ledger.entries
    assert (entry["reason"], entry["line"], entry["id"]) == ("bad_warc", bad, f"{path.name}@{bad}")
    assert "Content-Length" in entry["detail"]
    assert entry["detail"].endswith(f"reading resumes at the record at byte {resume}")
    assert state["records"] == ledger.records_in["web"] == RESPONSES


def test_bad_length_in_a_single_gzip_member_resumes_inside_it(tmp_path):
    """Several records packed into one gzip member: the resumed record is found by its version line."""
    plain = tmp_path / "plain.warc"
    write_warc(plain, response(BAD, length_delta=5000), compressed=False)
    packed = tmp_path / "packed.warc.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes(), mtime=0))
    docs, ledger, _ = read(packed)
    assert len(docs) == RESPONSES - 1
    (entry,) = ledger.entries
    assert entry["reason"] == "bad_warc" and entry["line"] == 0


def test_garbage_between_records_is_one_quarantined_record(tmp_path):
    path = tmp_path / "junk.warc"
    path.write_bytes(response(0) + b"this line is not a record\nnor is this one\n" + response(1))
    docs, ledger, state = read(path)
    assert [d.url for d in docs] == ["http://tide.test/0", "http://tide.test/1"]
    (entry,) = ledger.entries
    assert entry["reason"] == "bad_warc" and entry["line"] == len(response(0))
    assert "expected a WARC/1.x version line" in entry["detail"]
    assert f"reading resumes at the record at byte {len(response(0)) + 42}" in entry["detail"]


def test_a_file_cut_inside_its_last_block_is_still_truncated(tmp_path):
    """After a resynchronised bad record, a file cut inside its last block ends as `truncated`."""
    path = tmp_path / "cut.warc"
    whole = response(0) + response(1, length_delta=-40) + response(2) + response(3)
    path.write_bytes(whole[: len(whole) - 60])
    docs, ledger, _ = read(path)
    assert [d.url for d in docs] == ["http://tide.test/0", "http://tide.test/2"]
    assert [(e["reason"], e["line"]) for e in ledger.entries] == [
        ("bad_warc", len(response(0))),
        ("truncated", len(whole) - len(response(3))),
    ]


def test_without_a_callback_a_bad_record_still_raises(tmp_path):
    path = tmp_path / "tide.warc"
    write_warc(path, response(BAD, length_delta=-40), compressed=False)
    with open(path, "rb") as handle, pytest.raises(WarcError, match="Content-Length"):
        list(iter_records(handle, lambda headers: True))


@pytest.mark.parametrize("compressed", [True, False], ids=["gzip", "plain"])
def test_resync_after_a_length_that_ran_megabytes_ahead(tmp_path, compressed):
    """The bad block is read past what the stream keeps in memory: resynchronising seeks the file back."""
    filler = "".join(f"<p>Filler paragraph {k} about harbour tides and ferries.</p>" for k in range(2000))
    pages = []
    for i in range(24):
        body = f"<html><body><article><h1>Page {i}</h1>{filler}</article></body></html>".encode()
        block = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n\r\n" + body
        length = 10**8 if i == 3 else len(block)
        head = f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Target-URI: http://tide.test/{i}\r\n"
        pages.append(f"{head}Content-Length: {length}\r\n\r\n".encode() + block + b"\r\n\r\n")
    pieces = [gzip.compress(p, mtime=0) for p in pages] if compressed else pages
    path = tmp_path / ("big.warc.gz" if compressed else "big.warc")
    path.write_bytes(b"".join(pieces))
    assert sum(len(p) for p in pages[4:]) > 2 << 20  # more than the stream buffers
    with open(path, "rb") as handle:
        errors = []
        records = list(iter_records(handle, lambda headers: True, errors.append))
    assert [r.url for r in records] == [f"http://tide.test/{i}" for i in range(24) if i != 3]
    assert all(r.block.endswith(b"</html>") for r in records)
    (error,) = errors
    assert error.offset == sum(len(p) for p in pieces[:3])
    assert error.detail.startswith("Content-Length 100000000 reaches past the end of the file")
