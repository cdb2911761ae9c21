"""Publishers' wrappers: Project Gutenberg headers, START/END lines and licence footers are stripped.

The fixtures are written by hand after the layouts Project Gutenberg used over the years (1990s small
print, 2000s `***START OF THE ...` and `*** START OF THIS ...`, 2020s `*** START OF THE ...`), with
and without credit lines; none is one of the books in the shared corpus.
"""

import json

import pyarrow.parquet as pq
import pytest

from smelt.config import DataConfig, SourceConfig
from smelt.data.curate import build_steps, curate
from smelt.data.filters.boilerplate import WRAPPERS, Boilerplate, find_cuts, resolve_wrappers
from smelt.data.ledger import Doc, Ledger
from smelt.data.normalize import normalize_text
from smelt.errors import ConfigError

BODY = "\n\n".join(
    [
        "CHAPTER I. THE FERRY",
        "The ferry left the harbour at dawn, and the keeper of the lighthouse watched it go from the "
        "gallery, counting the gulls that followed it out past the breakwater.",
        "Nobody in the village remembered a winter as long as that one. The wells froze, the school "
        "closed for a fortnight, and the baker sold bread from his kitchen window.",
        "CHAPTER II. THE LETTER",
        "When the letter came at last it was addressed in a hand she did not know, and she carried it "
        "about unopened for a whole day before she dared to break the seal.",
    ]
)

LICENCE = "\n\n".join(
    [
        "*** START: FULL LICENSE ***",
        "THE FULL PROJECT GUTENBERG LICENSE\nPLEASE READ THIS BEFORE YOU DISTRIBUTE OR USE THIS WORK",
        "To protect the Project Gutenberg-tm mission of promoting the free distribution of electronic "
        "works, by using or distributing this work (or any other work associated in any way with the "
        'phrase "Project Gutenberg"), you agree to comply with all the terms of the Full Project '
        "Gutenberg-tm License available with this file or online at www.gutenberg.org/license.",
        "Section 1. General Terms of Use and Redistributing Project Gutenberg-tm electronic works",
        "1.A. By reading or using any part of this Project Gutenberg-tm electronic work, you indicate "
        "that you have read, understand, agree to and accept all the terms of this license and "
        "intellectual property (trademark/copyright) agreement.",
        "Section 5. General Information About Project Gutenberg-tm electronic works.",
        "Most people start at our Web site which has the main PG search facility: www.gutenberg.org",
        "This Web site includes information about Project Gutenberg-tm, including how to make donations "
        "to the Project Gutenberg Literary Archive Foundation, how to help produce our new eBooks, and "
        "how to subscribe to our email newsletter to hear about new eBooks.",
    ]
)

MODERN = f"""\ufeffThe Project Gutenberg eBook of The Lighthouse Keeper, by Ada Finch

This eBook is for the use of anyone anywhere in the United States and
most other parts of the world at no cost and with almost no restrictions
whatsoever. You may copy it, give it away or re-use it under the terms
of the Project Gutenberg License included with this eBook or online at
www.gutenberg.org.

Title: The Lighthouse Keeper

Author: Ada Finch

Release Date: March 3, 2021 [eBook #65001]

Language: English

Produced by: Jane Roe and the Online Distributed Proofreading Team

*** START OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***

{BODY}

*** END OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***

Updated editions will replace the previous one--the old editions will
be renamed.

{LICENCE}
"""

NOUGHTIES_PRODUCED_BY = f"""The Project Gutenberg EBook of The Lighthouse Keeper, by Ada Finch

This eBook is for the use of anyone anywhere at no cost and with
almost no restrictions whatsoever.  You may copy it, give it away or
re-use it under the terms of the Project Gutenberg License included
with this eBook or online at www.gutenberg.org


Title: The Lighthouse Keeper

Author: Ada Finch

Release Date: May 12, 2004 [EBook #12345]

Language: English


***START OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER***




Produced by Jane Roe, John Doe and the Online Distributed
Proofreading Team.




{BODY}




End of the Project Gutenberg EBook of The Lighthouse Keeper, by Ada Finch

***END OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER***

***** This file should be named 12345.txt or 12345.zip *****
This and all associated files of various formats will be found in:
        http://www.gutenberg.org/1/2/3/4/12345/

Produced by Jane Roe, John Doe and the Online Distributed
Proofreading Team.

{LICENCE}
"""

THIS_EBOOK_NO_CREDIT = f"""The Project Gutenberg EBook of The Lighthouse Keeper, by Ada Finch

Title: The Lighthouse Keeper

Author: Ada Finch

Posting Date: June 1, 2011 [EBook #4321]

*** START OF THIS PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***

{BODY}

End of Project Gutenberg's The Lighthouse Keeper, by Ada Finch

*** END OF THIS PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER ***

{LICENCE}
"""

SMALL_PRINT = f"""**The Project Gutenberg Etext of The Lighthouse Keeper, by Ada Finch**
#3 in our series by Ada Finch

Copyright laws are changing all over the world, be sure to check
the copyright laws for your country before posting these files!!

**Welcome To The World of Free Plain Vanilla Electronic Texts**

**Etexts Readable By Both Humans and By Computers, Since 1971**

*These Etexts Prepared By Hundreds of Volunteers and Donations*

The Lighthouse Keeper

by Ada Finch

March, 1996  [Etext #432]

**Information prepared by the Project Gutenberg legal advisor**

(Three Pages)

***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN ETEXTS**START***
Why is this "Small Print!" statement here?  You know: lawyers.
They tell us you might sue us if there is something wrong with
your copy of this etext, even if you got it for free from
someone other than us, and even if what's wrong is not our
fault.  So, among other things, this "Small Print!" statement
disclaims most of our liability to you.

*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

This etext was prepared by Jane Roe of Westfield, NJ.

{BODY}

End of The Project Gutenberg Etext of The Lighthouse Keeper
"""

WRAPPED_TITLE = f"""The Project Gutenberg EBook of The Lighthouse Keeper and Other Stories of the
Northern Coast, by Ada Finch

This eBook is for the use of anyone anywhere at no cost and with
almost no restrictions whatsoever.  You may copy it, give it away or
re-use it under the terms of the Project Gutenberg License included
with this eBook or online at www.gutenberg.org


Title: The Lighthouse Keeper and Other Stories of the Northern Coast

Author: Ada Finch

Release Date: January 9, 2006 [EBook #17492]

Language: English

Character set encoding: ISO-8859-1

***START OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER AND OTHER
STORIES OF THE NORTHERN COAST***




E-text prepared by Jane Roe, John Doe,
and the Project Gutenberg Online Distributed Proofreading Team
(http://www.pgdp.net/)



Note: Project Gutenberg also has an HTML version of this
      file which includes the original illustrations.
      See 17492-h.htm or 17492-h.zip:
      (http://www.gutenberg.org/dirs/1/7/4/9/17492/17492-h/17492-h.htm)
      or
      (http://www.gutenberg.org/dirs/1/7/4/9/17492/17492-h.zip)




{BODY}





End of the Project Gutenberg EBook of The Lighthouse Keeper and Other
Stories of the Northern Coast, by Ada Finch

***END OF THE PROJECT GUTENBERG EBOOK THE LIGHTHOUSE KEEPER AND OTHER
STORIES OF THE NORTHERN COAST***

***** This file should be named 17492-8.txt or 17492-8.zip *****
This and all associated files of various formats will be found in:
        http://www.gutenberg.org/1/7/4/9/17492/

{LICENCE}
"""

VARIANTS = {
    "modern": MODERN,
    "noughties_wrapped_title": WRAPPED_TITLE,
    "noughties_produced_by": NOUGHTIES_PRODUCED_BY,
    "this_ebook_no_credit": THIS_EBOOK_NO_CREDIT,
    "small_print_1990s": SMALL_PRINT,
}


def doc(text, source="books", file="a.txt", id="a.txt"):
    return Doc(source, 0, id, text, file)


def step(text_sources=frozenset({"books"})):
    return Boilerplate(resolve_wrappers(["gutenberg"]), frozenset({"books"}), text_sources)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_gutenberg_layout_leaves_the_body_alone(variant):
    text = VARIANTS[variant]
    ledger = Ledger()
    (out,) = step().run([doc(text)], ledger)
    assert out.text == BODY
    removed = out.meta["boilerplate"]["gutenberg"]
    head, tail = text.split(BODY)
    assert (removed["head_bytes"], removed["tail_bytes"]) == (len(head.encode()), len(tail.encode()))
    assert ledger.notes[("books", "boilerplate_gutenberg_docs")] == 1
    assert ledger.notes[("books", "boilerplate_gutenberg_bytes")] == len(text.encode()) - len(BODY.encode())


def test_a_wrapped_start_line_with_credit_and_notes_on_a_real_book(shared_data):
    """A real book (Sherlock Holmes, 1661.txt) rewritten in the 2000s layout whose START and END lines
    wrap the title over two lines, with an "E-text prepared by" credit and the HTML-version note (two
    URLs) after the START line: stripped to the same text as the book in its own layout."""
    original = normalize_text((shared_data / "corpus/prose/gutenberg/1661.txt").read_text(encoding="utf-8"))
    (expected,) = step().run([doc(original)], Ledger())
    start = "*** START OF THIS PROJECT GUTENBERG EBOOK THE ADVENTURES OF SHERLOCK HOLMES ***"
    credit = "Produced by an anonymous Project Gutenberg volunteer and Jose Menendez"
    end = "*** END OF THIS PROJECT GUTENBERG EBOOK THE ADVENTURES OF SHERLOCK HOLMES ***"
    assert original.count(start) == original.count(end) == 1 and original.index(credit) > original.index(
        start
    )
    wrapped = (
        original.replace(
            start, "***START OF THE PROJECT GUTENBERG EBOOK THE ADVENTURES OF\nSHERLOCK HOLMES***"
        )
        .replace(
            credit,
            "E-text prepared by an anonymous Project Gutenberg volunteer and Jose Menendez\n"
            "(http://www.pgdp.net/)\n\n"
            "Note: Project Gutenberg also has an HTML version of this\n"
            "      file which includes the original illustrations.\n"
            "      See 1661-h.htm or 1661-h.zip:\n"
            "      (http://www.gutenberg.org/dirs/1/6/6/1661/1661-h/1661-h.htm)\n"
            "      or\n"
            "      (http://www.gutenberg.org/dirs/1/6/6/1661/1661-h.zip)",
            1,  # the credit after the START line; the footer repeats it
        )
        .replace(end, "***END OF THE PROJECT GUTENBERG EBOOK THE ADVENTURES OF\nSHERLOCK HOLMES***")
    )
    (out,) = step().run([doc(wrapped)], Ledger())
    assert out.text == expected.text
    assert out.text.startswith("THE ADVENTURES OF SHERLOCK HOLMES") and "gutenberg" not in out.text.lower()


def test_a_wrapped_start_line_does_not_reach_into_the_book():
    """An unclosed START line followed by a blank line, or by text without a closing `***`, is one line."""
    for after in ("\n\nCHAPTER I\n\nIt was *** a storm.", "\nCHAPTER I\nIt was a dark night\nand a storm."):
        text = f"Header\n\n***START OF THE PROJECT GUTENBERG EBOOK THE KEEPER{after}\n\n{BODY}"
        (out,) = step().run([doc(text)], Ledger())
        assert out.text == text[text.index("EBOOK THE KEEPER") + 16 :].strip()


def test_text_without_a_wrapper_is_untouched_even_when_it_names_project_gutenberg():
    text = (
        "Project Gutenberg is a volunteer effort to digitize books.\n\n"
        "*** start of the interview ***\n\nEnd of the Project Gutenberg story, for now."
    )
    for body in (text, BODY):
        (out,) = step().run([doc(body)], Ledger())
        assert out.text == body and "boilerplate" not in out.meta


def test_a_marker_far_from_either_end_is_not_a_marker():
    """An anthology quoting an END line in its middle keeps its second half."""
    filler = "\n\n".join([BODY] * 300)  # ~200k characters, far past the 60k window on each side
    text = f"{filler}\n\n*** END OF THE PROJECT GUTENBERG EBOOK, as the note said ***\n\n{filler}"
    (out,) = step().run([doc(text)], Ledger())
    assert out.text == text


def test_the_parts_of_a_split_book_are_stripped_as_one_text():
    """A book read as parts of one file: a part that is all header or all licence is dropped whole, the
    parts holding the START and END lines are cut there, the parts between are left alone."""
    text = NOUGHTIES_PRODUCED_BY
    body_at = text.index(BODY)
    bounds = [
        0,
        text.index("***START") // 2,
        body_at + 20,
        body_at + len(BODY) - 30,
        text.index("Section 1."),
    ]
    parts = [
        doc(text[a:b], file="book.txt", id=f"book.txt#part{i:04d}")
        for i, (a, b) in enumerate(zip(bounds, [*bounds[1:], len(text)], strict=True))
    ]
    other = doc(MODERN, file="other.txt", id="other.txt")
    ledger = Ledger()
    out = list(step().run([*parts, other], ledger))
    assert [d.id for d in out] == [f"book.txt#part000{i}" for i in (1, 2, 3)] + ["other.txt"]
    assert [d.text for d in out] == [BODY[:20], BODY[20:-30], BODY[-30:], BODY]
    assert "boilerplate" not in out[1].meta  # the middle part had nothing to remove
    drops = [(e["id"], e["reason"]) for e in ledger.entries]
    assert drops == [
        ("book.txt#part0000", "boilerplate.gutenberg"),
        ("book.txt#part0004", "boilerplate.gutenberg"),
    ]
    removed = len(text.encode()) + len(MODERN.encode()) - 2 * len(BODY.encode())
    assert ledger.notes[("books", "boilerplate_gutenberg_bytes")] == removed
    assert ledger.notes[("books", "boilerplate_gutenberg_docs")] == 5  # parts 0, 1, 3, 4 and the other book


def test_records_of_a_jsonl_file_are_judged_one_by_one():
    """Only parts of a `text` file are stripped together: a JSONL record after a book's END line is a
    document of its own."""
    book = doc(THIS_EBOOK_NO_CREDIT, source="books", file="shelf.jsonl", id="shelf.jsonl:1")
    note = doc(BODY, source="books", file="shelf.jsonl", id="shelf.jsonl:2")
    out = list(step(text_sources=frozenset()).run([book, note], Ledger()))
    assert [d.text for d in out] == [BODY, BODY]


def test_find_cuts_reports_none_without_markers():
    assert find_cuts([BODY], WRAPPERS["gutenberg"]) is None


def test_unknown_publisher_is_a_config_error():
    with pytest.raises(
        ConfigError, match=r"data\.boilerplate\.publishers: unknown publisher 'gutenburg'"
    ) as err:
        resolve_wrappers(["gutenberg", "gutenburg"])
    assert "did you mean 'gutenberg'?" in str(err.value) and "Known publishers: gutenberg" in str(err.value)


@pytest.mark.slow
def test_the_step_runs_right_after_normalize_by_default_and_skips_code():
    cfg = DataConfig(sources=[SourceConfig(name="books"), SourceConfig(name="code", code=True)])
    steps = build_steps(cfg)
    assert [s.name for s in steps[:3]] == ["normalize", "boilerplate", "language_id"]
    assert steps[1].sources == frozenset({"books"})
    cfg.boilerplate.enabled = False
    assert "boilerplate" not in [s.name for s in build_steps(cfg)]


def test_curate_strips_gutenberg_books_and_counts_the_bytes(tmp_path):
    books = tmp_path / "books"
    books.mkdir()
    for name, text in VARIANTS.items():  # CRLF line endings, as Project Gutenberg ships them
        (books / f"{name}.txt").write_bytes(text.replace("\n", "\r\n").encode("utf-8"))
    source = SourceConfig(name="books", root=str(books), filters=[], languages=[])
    cfg = DataConfig(sources=[source], min_chars=10, val_fraction=0.0, min_split_docs=0, workers=1)
    stats = curate(cfg, tmp_path / "out")
    rows = [row for part in (tmp_path / "out").rglob("*.parquet") for row in pq.read_table(part).to_pylist()]
    # the five layouts leave byte-identical books: exact dedup keeps the first
    assert [(r["id"], r["text"]) for r in rows] == [("modern.txt", BODY)]
    assert stats["dropped"] == {"exact_duplicate": len(VARIANTS) - 1}
    assert json.loads(rows[0]["meta"])["boilerplate"]["gutenberg"]["tail_bytes"] > 0
    notes = stats["sources"]["books"]["notes"]
    assert notes["boilerplate_gutenberg_docs"] == len(VARIANTS)
    # bytes of the text as read (no BOM) and normalized (LF line ends, blank-line runs collapsed)
    expected = sum(
        len(normalize_text(t.lstrip("\ufeff")).encode()) - len(BODY.encode()) for t in VARIANTS.values()
    )
    assert notes["boilerplate_gutenberg_bytes"] == expected
