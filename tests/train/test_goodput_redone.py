"""Goodput counts every step a resume ran again, including those the dead process ran after its last log
line: metrics.jsonl has a train record every train.log_every steps, so a kill at step 73 with a
checkpoint at 50 and log lines every 25 left no record of steps 51-73 and goodput said lost_steps 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import write_token_data
from smelt.report.goodput import goodput
from smelt.run.training import with_goodput
from smelt.train.monitors import SUPERSEDED_METRICS
from smelt.train.ops.watchdog import Watchdog
from smelt.train.step_times import STEP_MARKER, StepMarker
from smelt.train.trainer import train

from .test_goodput import _config, _train, _write


class Killed(Exception):
    """Stands in for SIGKILL after a step."""


def test_a_resume_event_says_how_far_the_dead_process_got(tmp_path):
    # Process 1 logged steps 25 and 50 (checkpoint at 50), then ran to 73 and died; process 2 resumed
    # at 50. Nothing after 50 was logged, so nothing moved to metrics.superseded.jsonl.
    first, second = 1000.0, 1200.0
    _write(tmp_path / "metrics.jsonl", [
        _train(25, first, 1025.0, 25.0), _train(50, first, 1050.0, 25.0),
        {"kind": "event", "event": "resume", "step": 50, "reached_step": 73},
        _train(75, second, 1225.0, 25.0), _train(100, second, 1250.0, 25.0),
    ])  # fmt: skip
    assert goodput(tmp_path)["lost_steps"] == 23


def test_resume_events_and_older_superseded_blocks_are_each_counted_once(tmp_path):
    # A resume at 4 written before the marker (its block: steps 6 and 8 moved), then one at 8 with the
    # marker (the dead process reached 11; its logged step 10 moved too).
    _write(tmp_path / "metrics.jsonl", [
        _train(2, 1000.0, 1002.0, 1.0), _train(4, 1000.0, 1004.0, 1.0),
        {"kind": "event", "event": "resume", "step": 4},
        _train(6, 1100.0, 1102.0, 1.0), _train(8, 1100.0, 1104.0, 1.0),
        {"kind": "event", "event": "resume", "step": 8, "reached_step": 11},
        _train(10, 1200.0, 1202.0, 1.0),
    ])  # fmt: skip
    _write(tmp_path / SUPERSEDED_METRICS, [
        {"kind": "event", "event": "superseded", "resumed_at_step": 4, "records": 2},
        _train(6, 1000.0, 1006.0, 1.0), _train(8, 1000.0, 1008.0, 1.0),
        {"kind": "event", "event": "superseded", "resumed_at_step": 8, "records": 1},
        _train(10, 1100.0, 1106.0, 1.0),
    ])  # fmt: skip
    assert goodput(tmp_path)["lost_steps"] == (8 - 4) + (11 - 8)


def test_the_marker_is_rewritten_in_place(tmp_path):
    marker = StepMarker(tmp_path, 40)
    for _ in range(12):
        marker.advance()
    assert StepMarker.read(tmp_path) == 52 and len((tmp_path / STEP_MARKER).read_bytes()) == StepMarker.WIDTH
    marker.close()
    assert StepMarker.read(tmp_path / "absent") is None


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


@pytest.mark.slow  # two short trainings
def test_a_run_killed_between_log_lines_reports_the_steps_it_redid(tmp_path, monkeypatch):
    # 8 steps, a checkpoint at 4 and log lines at 4 and 8; killed after step 7: steps 5, 6 and 7 ran
    # twice, and none of them had a train record.
    tokens, tokenizer = write_token_data(tmp_path)
    cfg, out = _config(tmp_path, log_every=4), tmp_path / "train"
    real_beat = Watchdog.beat

    def beat(self: Watchdog, at: int) -> None:
        real_beat(self, at)
        if at == 7:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Watchdog, "beat", beat)
        with pytest.raises(Killed):
            train(cfg, tokens, tokenizer, out)
    assert StepMarker.read(out) == 7
    assert not (out / SUPERSEDED_METRICS).exists()  # no record after the checkpoint to move
    summary = with_goodput(cfg, out, train(cfg, tokens, tokenizer, out, resume="auto"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (resume,) = [r for r in records if r.get("event") == "resume"]
    assert resume["step"] == 4 and resume["reached_step"] == 7
    figures = summary["goodput"]
    assert figures["restarts"] == 1 and figures["lost_steps"] == 3
    assert StepMarker.read(out) == 8
    assert json.loads((Path(out) / "summary.json").read_text())["goodput"]["lost_steps"] == 3
