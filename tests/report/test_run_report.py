"""`smelt report RUN`: every section and plot, no external reference, graceful gaps, clear bad input."""

from __future__ import annotations

import json
import re

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.report.run import final_metrics, load_run
from smelt.report.single import SECTIONS, write_run_report
from smelt.report.svg import Chart, Series, chart_svg

EXTERNAL = ("http://", "https://", "<link", "<script", "src=", "url(", "@import", "//cdn", "<iframe", "<img")


def _section(html: str, anchor: str) -> str:
    match = re.search(rf'<section id="{anchor}">(.*?)</section>', html, re.S)
    assert match, f"section {anchor} missing"
    return match.group(1)


def test_report_holds_every_section_and_plot(tiny_run):
    path = write_run_report(tiny_run)
    assert path == tiny_run / "report.html"
    html = path.read_text()
    for anchor in ["summary", *[a for a, _, _ in SECTIONS], "decisions"]:
        body = _section(html, anchor)
        assert "could not be drawn" not in body, anchor
    plots = {
        "retention": "documents after each step",
        "mixture": "target vs realized share",
        "tokenizer": "bytes per token per group",
        "loss": "loss against tokens",
        "lr": "learning rate",
        "gradients": "gradient norm before clipping",
        "throughput": "model FLOPs utilization",
        "events": "events against tokens",
        "evaluation": "task hellaswag",
    }
    for anchor, title in plots.items():
        body = _section(html, anchor)
        assert "<svg" in body and title in body, anchor
    assert "clip" in _section(html, "gradients") and "update ratio" in _section(html, "gradients")
    assert "throughput" in _section(html, "throughput")
    # Events are marked on the loss plot, each with its details as a hover title.
    loss = _section(html, "loss")
    assert "loss 9.1 is 6.2 std above its mean" in loss and "rollback to step 15" in loss
    assert "stage &#x27;anneal&#x27;" in loss and "resume" in loss
    assert "val code" in loss and "val web" in loss  # validation loss per source
    events = _section(html, "events")
    for kind in ("alert", "skip", "rollback", "resume", "stage"):
        assert f"{kind} (" in events, kind
    # The manifest chain: hashes, seeds, versions; a stage that read stale upstream outputs is flagged.
    manifests = _section(html, "manifests")
    assert "docs-h" in manifests and "STALE" in manifests and "0.1.0 abcdef1234" in manifests
    evaluation = _section(html, "evaluation")
    assert (
        "held-out bits per byte" in evaluation and "arc_easy" in evaluation and "acc_per_char" in evaluation
    )
    assert "model: code" in evaluation and "model: web" in evaluation  # bits/byte per source
    assert "task piqa" in evaluation  # logged in-loop, in metrics.jsonl
    assert "chance" in evaluation and "± 1 standard error" in evaluation
    assert "hellaswag/score" not in evaluation and "hellaswag/items" not in evaluation
    assert (
        "Tasks at step 40" in evaluation and "3 of 500 items in 2 training documents (remove)" in evaluation
    )
    gallery = _section(html, "gallery")
    assert (
        "foo_40():" in gallery and "import re" in gallery and "import sys" in gallery and "Parser:" in gallery
    )
    assert gallery.count("import re") == 1  # gallery.json repeats the step files' greedy completions
    summary = _section(html, "summary")
    assert "task hellaswag (acc, step 40)" in summary and "acc_per_char" not in summary
    assert "0 / 0" not in summary  # 3 skipped steps, 1 rollback
    assert "3 / 1" in summary


def test_report_has_no_external_references(tiny_run):
    html = write_run_report(tiny_run).read_text()
    for needle in EXTERNAL:
        assert needle not in html, needle
    assert "<style>" in html and html.count("<svg") >= 12


def test_missing_inputs_say_so(run_factory):
    run = run_factory("bare", full=False)
    html = write_run_report(run).read_text()
    assert "no stage manifests" in _section(html, "manifests")
    assert "no curate statistics" in _section(html, "retention")
    assert "no task evaluations yet" in _section(html, "evaluation")
    assert "no gallery yet" in _section(html, "gallery")
    assert "<svg" in _section(html, "loss")  # training plots need metrics.jsonl alone


def test_metrics_only_in_run_dir_and_torn_last_line(tmp_path, metrics_records):
    run = tmp_path / "trainer-out"
    run.mkdir()
    lines = [json.dumps(r) for r in metrics_records()]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"kind": "train", "st')
    loaded = load_run(run)
    assert loaded.metrics_path == run / "metrics.jsonl" and len(loaded.records) == len(lines)
    assert any("torn last line" in n for n in loaded.notes)
    assert "torn last line" in write_run_report(run).read_text()


def test_final_metrics(tiny_run):
    figures = final_metrics(load_run(tiny_run))
    assert figures["tokens"] == 40 * 2048 and figures["flops"] == 40 * 2048 * 5.0e6
    assert figures["task/hellaswag/acc"] == pytest.approx(0.35)
    assert figures["heldout_bits_per_byte"] == pytest.approx(2.01)
    assert not {"task/hellaswag/items", "task/hellaswag/score", "task/hellaswag/stderr"} & set(figures)


def test_bad_input_names_the_path(tmp_path, capsys):
    missing = tmp_path / "nope"
    with pytest.raises(UserError, match=re.escape(str(missing))):
        write_run_report(missing)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"no metrics\.jsonl.*train/metrics\.jsonl"):
        write_run_report(empty)
    assert main(["report", str(empty)]) == 2
    assert str(empty) in capsys.readouterr().err
    broken = tmp_path / "broken"
    (broken / "train").mkdir(parents=True)
    (broken / "train" / "metrics.jsonl").write_text('{"kind": "train"}\nnot json\n{"kind": "train"}\n')
    with pytest.raises(UserError, match=r"metrics\.jsonl:2 is not a JSON object"):
        write_run_report(broken)


def test_cli_report_prints_path(tiny_run, capsys):
    assert main(["report", str(tiny_run)]) == 0
    assert f"report: {tiny_run / 'report.html'}" in capsys.readouterr().out


def test_chart_breaks_lines_at_gaps_and_says_no_data():
    svg = chart_svg(Chart("t", "tokens", "loss", [Series("a", [0, 1, 2, 3, 4], [1.0, 2.0, None, 3.0, 4.0])]))
    assert svg.count("<polyline") == 2
    assert "no data" in chart_svg(Chart("t", "tokens", "loss", [Series("a", [1], [None])]))


def test_long_series_are_thinned_but_keep_spikes():
    xs = list(range(100_000))
    ys = [2.0 + (50.0 if x == 77_777 else 0.001 * (x % 7)) for x in xs]
    svg = chart_svg(Chart("t", "tokens", "loss", [Series("a", xs, ys)]))
    points = re.search(r'<polyline points="([^"]+)"', svg).group(1).split()
    assert len(points) <= 2 * 1200
    top = min(float(p.split(",")[1]) for p in points)  # the spike is the highest point drawn
    assert top < 60  # within the top of the plot area (y grows downwards)
