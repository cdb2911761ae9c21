"""`smelt decide`: records appended to the decision log and shown in the reports of the runs involved."""

from __future__ import annotations

import json

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.report.compare import write_comparison
from smelt.report.decisions import decide
from smelt.report.run import final_metrics, load_run
from smelt.report.single import write_run_report


def test_decide_appends_records(run_factory, runs_dir, capsys):
    a, b, other = run_factory("a", seed=1), run_factory("b", seed=3), run_factory("other", seed=2)
    write_run_report(a)
    args = ["decide", "Does seed 3 help?", "--runs", str(a), str(b), "--metric", "final_val_loss"]
    assert main([*args, "--outcome", "no: within noise"]) == 0
    out = capsys.readouterr().out
    assert "a  final_val_loss" in out and "<- best" in out
    assert (
        main(["decide", "Second question", "--runs", str(b), str(a), "--metric", "task/hellaswag/acc"]) == 0
    )
    log = runs_dir / "decisions.jsonl"
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 2
    first = records[0]
    assert first["question"] == "Does seed 3 help?" and first["outcome"] == "no: within noise"
    assert first["metric"] == "final_val_loss" and first["better"] == "lower" and first["best"] == "a"
    assert [e["name"] for e in first["runs"]] == ["a", "b"]
    assert first["runs"][1]["value"] == final_metrics(load_run(b))["final_val_loss"]
    assert first["date"].endswith("Z")
    assert records[1]["better"] == "higher" and records[1]["outcome"] is None
    # The existing report of `a` was refreshed; reports show only the decisions their run took part in.
    assert "Does seed 3 help?" in (a / "report.html").read_text()
    assert "Second question" in write_run_report(b).read_text()
    assert "Does seed 3 help?" not in write_run_report(other).read_text()
    assert "Does seed 3 help?" in write_comparison([a, other]).read_text()


def test_decide_bad_input(run_factory, tmp_path):
    a, b = run_factory("a"), run_factory("b")
    with pytest.raises(UserError, match=r"no metric 'val_acc'.*final_train_loss"):
        decide("q", [a, b], "val_acc")
    with pytest.raises(UserError, match="title"):
        decide("  ", [a, b], "final_val_loss")
    with pytest.raises(UserError, match=str(tmp_path / "gone")):
        decide("q", [a, tmp_path / "gone"], "final_val_loss")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    moved = b.rename(elsewhere / "b")
    with pytest.raises(UserError, match="--log FILE"):
        decide("q", [a, moved], "final_val_loss")
    b = moved
    log = tmp_path / "log.jsonl"
    log.write_text("{broken\n")
    decide("q", [a, b], "final_val_loss", log=log)  # appending never reads the log
    with pytest.raises(UserError, match=r"log\.jsonl:1"):
        write_run_report(a, decisions_log=log)
