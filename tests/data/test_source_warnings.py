"""A source that loses more than half its text in curation is warned about, with the top reason, in
stats.json, the terminal and the report."""

from __future__ import annotations

import json
import textwrap

from smelt.cli import main
from smelt.data.curate import curate
from smelt.data.stats import retention_table
from smelt.report.data_sections import retention_section
from smelt.report.run import Run

PROSE = "The river runs past the mill and the miller counts the sacks of grain. " * 4


def test_a_source_losing_most_of_its_text_is_warned_about_with_the_top_reason(
    tmp_path, write, source, config
):
    # three long pages dropped as too long, two short ones kept: "long" loses most of its text
    pages = {f"big{i}.txt": PROSE * 20 + f"Big {i}." for i in range(3)}
    pages |= {f"small{i}.txt": PROSE + f"Small {i}." for i in range(2)}
    long_root = write(tmp_path / "long", pages)
    fine_root = write(tmp_path / "fine", {f"doc{i}.txt": PROSE + f"Page {i}." for i in range(3)})
    cfg = config(
        source("long", long_root, include=["*.txt"]),
        source("fine", fine_root, include=["*.txt"]),
        max_chars=2_000,
    )
    out = tmp_path / "run" / "documents"
    stats = curate(cfg, out)
    [warning] = stats["warnings"]
    assert (warning["source"], warning["step"], warning["reason"]) == ("long", "length_filter", "too_long")
    dropped, kept = 3 * len(PROSE * 20 + "Big 0."), 2 * len(PROSE + "Small 0.")
    assert (warning["chars_read"], warning["chars_kept"], warning["reason_chars"]) == (
        dropped + kept,
        kept,
        dropped,
    )
    assert warning["message"] == (
        f"source 'long' kept {kept / (dropped + kept):.0%} of the text it read ({kept:,} of {dropped + kept:,} "
        f"characters); most was removed by too_long (step length_filter: {dropped:,} characters in 3 "
        f"documents). Look at it with `smelt inspect documents RUN --dropped-by length_filter --source long`, "
        f"then change that step's settings or the source's `filters` if it should have stayed."
    )
    assert json.loads((out / "stats.json").read_text())["warnings"] == stats["warnings"]
    assert retention_table(stats).endswith("\nwarning: " + warning["message"])
    html = retention_section(Run(tmp_path / "run", tmp_path / "run" / "metrics.jsonl", []))
    assert '<p class="diff">warning: source &#x27;long&#x27; kept 3% of the text it read' in html


def test_text_cut_out_of_kept_documents_is_named_as_the_step(tmp_path, write, source, config):
    # C4 removes the lines without terminal punctuation: the documents stay, most of their text goes
    menu = "\n".join(f"Home about contact products item number {i} and more links" for i in range(40))
    text = "\n".join(f"This is sentence number {i} of the article." for i in range(6)) + "\n" + menu
    root = write(tmp_path / "web", {f"p{i}.txt": text + f"\nPage {i} ends here." for i in range(3)})
    stats = curate(config(source("web", root, include=["*.txt"], filters=["c4"])), tmp_path / "out")
    [warning] = stats["warnings"]
    assert warning["step"] == "c4" and warning["reason"] == ""
    assert "most was removed by step c4 cutting text out of the documents it kept" in warning["message"]
    assert "smelt inspect documents RUN --kept --source web" in warning["message"]
    assert stats["sources"]["web"]["documents_kept"] == 3


def test_smelt_curate_prints_the_warning_at_the_end(tmp_path, write, capsys, monkeypatch):
    monkeypatch.setenv("SMELT_QUIET", "0")  # the curate log goes to stderr
    root = write(tmp_path / "books", {"a.txt": PROSE * 30, "b.txt": PROSE})
    path = tmp_path / "pipeline.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            [run]
            dir = "{tmp_path / "runs"}"
            [data]
            max_chars = 1000
            val_fraction = 0.0
            workers = 1
            [[data.sources]]
            name = "books"
            root = "{root}"
            include = ["*.txt"]
            filters = []
            """
        )
    )
    assert main(["curate", str(path)]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert (
        "\nwarning: source 'books' kept 3% of the text it read" in out
        and "most was removed by too_long" in out
    )
    documents = tmp_path / "runs" / "run" / "documents"
    assert "curate: warning: source 'books' kept 3%" in captured.err
    assert f"`smelt inspect documents {documents} --dropped-by length_filter --source books`" in captured.err
    assert main(["curate", str(path)]) == 0  # up to date: the warning is repeated from stats
    assert "warning: source 'books' kept 3%" in capsys.readouterr().out
