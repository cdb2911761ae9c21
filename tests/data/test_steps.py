from collections import Counter

from smelt.data.dedup.exact import ExactDedup, text_digest
from smelt.data.filters import LengthFilter
from smelt.data.ids import UniqueIds
from smelt.data.ledger import DROP_SAMPLE_DOCS, Doc, Ledger
from smelt.data.split import TEST, TRAIN, VAL, Split, assign_split, forced_units, split_hash, unit_key
from smelt.data.steps import CorpusStep, DocStep, run_steps, split_at_first_corpus_step


def doc(text, id="a", source="s", index=0, file="f", line=None):
    return Doc(source, index, id, text, file, line)


def test_length_filter_bounds_and_reasons():
    ledger = Ledger()
    step = LengthFilter(3, 5)
    docs = [
        doc("ab", "1"),
        doc("abc", "2"),
        doc("abcde", "3"),
        doc("abcdef", "4"),
        doc(" \n\t ", "5"),
        doc("", "6"),
    ]
    kept = list(run_steps([step], docs, ledger))
    assert [d.id for d in kept] == ["2", "3"]
    reasons = {e["id"]: e["reason"] for e in ledger.entries}
    assert reasons == {"1": "too_short", "4": "too_long", "5": "empty", "6": "empty"}
    assert all(e["kind"] == "dropped" for e in ledger.entries)
    assert (
        sum(n for (step, _, kind), n in ledger.steps.items() if step == "length_filter" and kind == "in") == 6
    )
    assert (
        sum(n for (step, _, kind), n in ledger.steps.items() if step == "length_filter" and kind == "out")
        == 2
    )


def test_empty_is_dropped_even_with_min_chars_zero():
    ledger = Ledger()
    assert LengthFilter(0, 10).apply(doc("   "), ledger) is None
    assert ledger.entries[0]["reason"] == "empty"


def test_drop_entries_keep_full_text_only_for_a_sample():
    ledger = Ledger()
    step = LengthFilter(0, 10)
    list(step.run([doc("x" * 1000, id=str(i)) for i in range(DROP_SAMPLE_DOCS + 5)], ledger))
    entry = ledger.entries[0]
    assert entry["reason"] == "too_long" and entry["chars"] == 1000 and len(entry["preview"]) == 200
    assert entry["step"] == "length_filter" and entry["text"] == "x" * 1000
    assert sum("text" in e for e in ledger.entries) == DROP_SAMPLE_DOCS
    assert "text" not in ledger.entries[-1]


def test_exact_dedup_keeps_first_in_canonical_order():
    docs = [
        doc("same", "b", "web", 0),
        doc("same", "c", "web", 0),
        doc("same", "a", "code", 1),
        doc("other", "z"),
    ]
    ledger = Ledger()
    kept = list(ExactDedup().run(docs, ledger))
    assert [(d.source, d.id) for d in kept] == [("web", "b"), ("s", "z")]
    dropped = sorted((e["source"], e["id"], e["kept_source"], e["kept_id"]) for e in ledger.entries)
    assert dropped == [("code", "a", "web", "b"), ("web", "c", "web", "b")]
    assert all(e["reason"] == "exact_duplicate" for e in ledger.entries)
    assert kept[0].meta["text_hash"] == text_digest("same").hex() and len(text_digest("x")) == 16


def test_unique_ids_quarantines_later_duplicates():
    docs = [doc("t1", "x", file="a", line=1), doc("t2", "x", file="b", line=7), doc("t3", "y")]
    ledger = Ledger()
    kept = list(UniqueIds().run(docs, ledger))
    assert [(d.id, d.file) for d in kept] == [("x", "a"), ("y", "f")]
    (entry,) = ledger.entries
    assert entry["reason"] == "duplicate_id" and entry["kind"] == "quarantined" and entry["kept_file"] == "a"
    assert entry["file"] == "b" and entry["line"] == 7


def hashed(d):
    d.unit_hash = split_hash(d.source, unit_key(d, "id"))
    return d


def test_split_is_deterministic_and_independent_of_other_docs():
    ids = [f"doc-{i}" for i in range(2000)]
    first = {i: assign_split(split_hash("web", i), 0.1) for i in ids}
    share = sum(s == VAL for s in first.values()) / len(ids)
    assert 0.07 < share < 0.13
    # the same id lands in the same split whatever else is in the corpus
    alone = list(Split(0.1).run([hashed(doc("t", "doc-7", "web"))], Ledger()))
    crowd = list(Split(0.1).run([hashed(doc("t", i, "web")) for i in ids], Ledger()))
    assert alone[0].split == next(d.split for d in crowd if d.id == "doc-7") == first["doc-7"]
    assert split_hash("web", "a") != split_hash("code", "a")
    assert all(assign_split(split_hash("web", i), 0.0) == TRAIN for i in ids[:50])
    tested = [assign_split(split_hash("web", i), 0.1, 0.1) for i in ids]
    assert 0.07 < tested.count(TEST) / len(ids) < 0.13
    assert [s for s in tested if s != TEST] == [s for i, s in zip(ids, tested, strict=True) if s != TEST]


def test_split_units_keep_related_documents_together():
    a = Doc("s", 0, "p1", "x", "repoA/src/a.py", url="https://www.example.org/a?x=1", meta={"repo": "r1"})
    b = Doc("s", 0, "p2", "y", "repoA/docs/b.md", url="https://example.org/b", meta={"repo": "r1"})
    assert unit_key(a, "domain") == unit_key(b, "domain") == "example.org"
    assert unit_key(a, "dir") == unit_key(b, "dir") == "repoA"
    assert unit_key(a, "field:repo") == unit_key(b, "field:repo") == "r1"
    assert unit_key(a, "url") != unit_key(b, "url") and unit_key(a, "file") != unit_key(b, "file")
    no_url = Doc("s", 0, "p3", "z", "top.txt")
    assert unit_key(no_url, "domain") == "p3" and unit_key(no_url, "dir") == "top.txt"


def test_forced_units_fill_the_minimum_from_the_smallest_hashes():
    units = {"s": Counter({h: 1 for h in (5, 9, 2**63, 2**64 - 1)})}
    forced = forced_units(units, 1e-20, 1e-20, 1)
    assert forced == {"s": {5: VAL, 9: TEST}}
    assert forced_units({"s": Counter({5: 3})}, 1e-12, 0.0, 1) == {}  # train keeps its only unit
    assert forced_units(units, 0.0, 0.0, 5) == {}
    step = Split(1e-20, 1e-20, forced)
    docs = [Doc("s", 0, str(h), "t", "f", unit_hash=h) for h in (2**63, 5, 9)]
    assert [d.split for d in step.run(docs, Ledger())] == [TRAIN, VAL, TEST]


def test_pipeline_split_point():
    class A(DocStep):
        name = "a"

    class B(CorpusStep):
        name = "b"

    a, b, c = A(), B(), A()
    assert split_at_first_corpus_step([a, b, c]) == ([a], [b, c])
    assert split_at_first_corpus_step([a, c]) == ([a, c], [])
