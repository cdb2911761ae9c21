"""Cluster operations: per-rank step-time percentiles and the straggler alert (one all_gather per log
window), goodput from metrics.jsonl across a crash and its resume, and the Young-Daly interval."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import write_token_data
from smelt.config import config_from_dict
from smelt.errors import ConfigError
from smelt.report import goodput as goodput_module
from smelt.report.goodput import goodput, interval_advice, run_goodput
from smelt.run.training import with_goodput
from smelt.train import step_times
from smelt.train.monitors import SUPERSEDED_METRICS
from smelt.train.ops.watchdog import Watchdog
from smelt.train.step_times import RankTimes, percentile, straggler_alert
from smelt.train.trainer import train


def test_percentile_interpolates_between_ranks():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile(list(map(float, range(101))), 99) == 99.0
    assert math.isnan(percentile([], 50))


def test_straggler_alert_names_the_slowest_rank_past_the_ratio():
    alert = straggler_alert([0.010, 0.011, 0.030, 0.010], ratio=1.5, step=40, tokens=4096)
    assert alert["alert"] == "straggler" and alert["rank"] == 2 and alert["ranks"] == [2]
    assert alert["median"] == pytest.approx(0.0105) and alert["threshold"] == pytest.approx(1.5 * 0.0105)
    assert "rank 2 is a straggler" in alert["message"] and "2.86x the median" in alert["message"]
    assert straggler_alert([0.010, 0.011, 0.012], ratio=1.5, step=1, tokens=0) is None
    assert straggler_alert([0.010, 0.030], ratio=0.0, step=1, tokens=0) is None  # off
    assert straggler_alert([0.030], ratio=1.5, step=1, tokens=0) is None  # one rank


def test_own_time_leaves_out_the_synchronised_section(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(step_times.time, "perf_counter", lambda: now[0])
    times = RankTimes()
    for wait_for_others in (0.0, 0.5, 0.5):
        now[0] += 0.3 + wait_for_others  # 0.2 s of own work; 0.1 s of collectives, plus the wait
        times.synced(0.1 + wait_for_others)
        times.add_step(0.3 + wait_for_others)
    assert times.step_s == [0.3, 0.8, 0.8]
    assert times.own_s == pytest.approx([0.2, 0.2, 0.2])
    restored = RankTimes()
    restored.load_state_dict(times.state_dict())
    assert restored.state_dict() == times.state_dict()


def test_straggler_ratio_is_validated():
    with pytest.raises(ConfigError, match="straggler_ratio"):
        config_from_dict({"train": {"straggler_ratio": -1}})
    assert config_from_dict({"checkpoint": {"mtbf_hours": 12}}).checkpoint.mtbf_hours == 12


# --- goodput ----------------------------------------------------------------------------------------


def _train(step: int, start: float, at: float, step_s: float, wait_s: float = 0.0) -> dict:
    return {"kind": "train", "step": step, "tokens": step * 10, "loss": 1.0, "time": at,
            "elapsed_s": at - start, "step_time_s": step_s, "checkpoint_wait_s": wait_s,
            "step_time_p50_s": step_s / 2}  # fmt: skip


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_goodput_splits_the_wall_time_across_a_crash_and_its_resume(tmp_path):
    # Process 1 starts at t=1000, trains steps 1-6 (checkpoint at 4), dies after its step-6 record at
    # t=1060; process 2 starts at t=1100, resumes from step 4 and ends at t=1150.
    first, second = 1000.0, 1100.0
    kept = [
        _train(2, first, 1020.0, 10.0), _train(4, first, 1040.0, 10.0, wait_s=1.0),
        {"kind": "event", "event": "checkpoint", "step": 4, "stall_s": 2.0},
        {"kind": "eval", "step": 4, "eval_s": 3.0},
        _train(6, second, 1120.0, 10.0), _train(8, second, 1140.0, 10.0),
        {"kind": "event", "event": "checkpoint", "step": 8, "stall_s": 4.0},
        {"kind": "event", "event": "end", "step": 8, "wall_time_s": 50.0},
    ]  # fmt: skip
    moved = [
        {"kind": "event", "event": "superseded", "resumed_at_step": 2, "records": 1},
        _train(3, 500.0, 520.0, 10.0),  # set aside by a history before a fresh start: not this run's
        {"kind": "event", "event": "superseded", "resumed_at_step": 4, "records": 1},
        _train(6, first, 1060.0, 10.0),
    ]
    _write(tmp_path / "metrics.jsonl", kept)
    _write(tmp_path / SUPERSEDED_METRICS, moved)
    figures = goodput(tmp_path)
    assert figures["wall_s"] == pytest.approx(150.0)
    assert figures["restarts"] == 1 and figures["restart_downtime_s"] == pytest.approx(40.0)
    assert figures["productive_s"] == pytest.approx(39.0)  # 4 windows of 10 s, less the 1 s host-copy wait
    assert figures["lost_s"] == pytest.approx(10.0) and figures["lost_steps"] == 2
    assert figures["checkpoint_stall_s"] == pytest.approx(6.0) and figures["checkpoints"] == 2
    assert figures["eval_s"] == pytest.approx(3.0)
    assert figures["other_s"] == pytest.approx(150.0 - 39.0 - 10.0 - 40.0 - 6.0 - 3.0)
    assert figures["goodput"] == pytest.approx(39.0 / 150.0)
    assert figures["save_cost_s"] == pytest.approx(3.0) and figures["step_time_p50_s"] == pytest.approx(5.0)


def test_a_process_that_only_finishes_is_a_restart_closed_by_its_end_record(tmp_path):
    # Killed after its final save (step 8) but before its end record; "auto" finds the final
    # checkpoint, and a second process (start 1100) only writes the end (at 1110).
    _write(tmp_path / "metrics.jsonl", [
        _train(4, 1000.0, 1040.0, 30.0), _train(8, 1000.0, 1080.0, 30.0),
        {"kind": "event", "event": "end", "step": 8, "wall_time_s": 10.0, "time": 1110.0},
    ])  # fmt: skip
    figures = goodput(tmp_path)
    assert figures["restarts"] == 1 and figures["restart_downtime_s"] == pytest.approx(20.0)
    assert figures["wall_s"] == pytest.approx(110.0) and figures["productive_s"] == pytest.approx(60.0)


def test_goodput_is_none_without_timed_records(tmp_path):
    _write(tmp_path / "metrics.jsonl", [{"kind": "train", "step": 1, "loss": 2.0, "elapsed_s": 1.0}])
    assert goodput(tmp_path) is None and run_goodput(tmp_path, 24.0, 100) is None
    assert goodput(tmp_path / "absent") is None


def test_young_daly_interval_and_its_hint():
    advice = interval_advice(save_cost_s=2.0, step_s=0.5, mtbf_hours=1.0, every_steps=1000)
    optimal = math.sqrt(2 * 2.0 * 3600)  # 120 s
    assert advice["optimal_interval_s"] == pytest.approx(optimal) and advice["optimal_every_steps"] == 240
    assert advice["expected_waste_at_optimal"] == pytest.approx(2.0 / 120 + 120 / 7200)
    assert advice["expected_waste_at_every_steps"] == pytest.approx(2.0 / 500 + 500 / 7200)
    assert "checkpoint.every_steps = 1000 is far from the Young-Daly interval" in advice["hint"]
    assert "set checkpoint.every_steps = 240" in advice["hint"]
    assert interval_advice(2.0, 0.5, 1.0, every_steps=300)["hint"] is None  # within 2x
    assert "no periodic checkpoint" in interval_advice(2.0, 0.5, 1.0, every_steps=0)["hint"]
    assert interval_advice(2.0, 0.5, mtbf_hours=0.0, every_steps=100) is None  # no MTBF: no advice
    assert interval_advice(None, 0.5, 1.0, 100) is None


# --- in the trainer ---------------------------------------------------------------------------------

STEPS = 8


class Killed(Exception):
    """Stands in for SIGKILL after a logged step."""


def _config(tmp_path: Path, **train_keys):
    return config_from_dict({
        "run": {"seed": 5, "dir": str(tmp_path / "runs"), "name": "r"},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 32},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 128, "tokens": 128 * STEPS, "lr": 3e-3,
            "log_every": 2, "eval_every": 0, "eval_tokens": 256, "precision": "fp32", "threads": 1,
            **train_keys,
        },
        "checkpoint": {"every_steps": 4, "keep_last": 5, "mtbf_hours": 0.001},
    })  # fmt: skip


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


@pytest.mark.slow
def test_a_killed_and_resumed_run_reports_its_restart_and_lost_steps(tmp_path, monkeypatch):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg, out = _config(tmp_path), tmp_path / "train"
    real_beat = Watchdog.beat

    def beat(self, at: int) -> None:
        real_beat(self, at)
        if at == 6:
            raise Killed

    with monkeypatch.context() as patched:
        patched.setattr(Watchdog, "beat", beat)
        with pytest.raises(Killed):
            train(cfg, tokens, tokenizer, out)
    summary = with_goodput(cfg, out, train(cfg, tokens, tokenizer, out, resume="auto"))
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if r["kind"] == "train"]
    assert all(r["step_time_p50_s"] <= r["step_time_p99_s"] and r["time"] > r["elapsed_s"] for r in logged)
    assert all(r["step_time_s"] > 0 and r["checkpoint_wait_s"] >= 0 for r in logged)
    figures = summary["goodput"]
    assert json.loads((out / "summary.json").read_text())["goodput"] == figures
    assert figures["restarts"] == 1 and figures["lost_steps"] == 2  # steps 5 and 6 were trained twice
    assert 0 < figures["goodput"] < 1 and figures["lost_s"] > 0 and figures["checkpoints"] == 2
    parts = ("productive_s", "lost_s", "restart_downtime_s", "checkpoint_stall_s", "eval_s", "other_s")
    assert sum(figures[k] for k in parts) == pytest.approx(figures["wall_s"], rel=1e-6)
    advice = figures["checkpoint_interval"]
    assert advice["mtbf_hours"] == 0.001 and advice["optimal_every_steps"] >= 1
    assert advice["save_cost_s"] == pytest.approx(figures["save_cost_s"])
    from smelt.report.run import load_run
    from smelt.report.train_sections import throughput_section

    html = throughput_section(load_run(tmp_path))
    assert "where the wall time went" in html and "1 restart(s), 2 step(s) redone after a resume" in html


_STRAGGLER_WORKER = """
import json, sys, time
from pathlib import Path
import torch.distributed as dist
from smelt.config import config_from_dict
from smelt.tokens.loader import TokenLoader
from smelt.train.trainer import train

real = TokenLoader.next_step
def slow_on_rank_1(self):
    if dist.get_rank() == 1:
        time.sleep(0.05)
    return real(self)
TokenLoader.next_step = slow_on_rank_1
config_path, tokens, tokenizer, out = sys.argv[1:5]
train(config_from_dict(json.loads(Path(config_path).read_text())), tokens, tokenizer, out)
"""


@pytest.mark.slow
def test_two_process_training_names_the_rank_whose_loader_sleeps(tmp_path, capsys):
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = _config(tmp_path, micro_batch=2, log_every=4, straggler_ratio=1.5)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    (tmp_path / "worker.py").write_text(_STRAGGLER_WORKER)
    out = tmp_path / "train"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_PEAK_FLOPS": "1e12", "SMELT_QUIET": "0"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(tmp_path / "worker.py"), str(tmp_path / "config.json"), str(tokens), str(tokenizer), str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if r["kind"] == "train"]
    assert all(len(r["rank_step_time_p50_s"]) == 2 for r in windows)
    # Rank 0 waits for rank 1 inside every step, so both wall step times hold the 50 ms sleep; the own
    # time (step end to step end, less the synchronised section) holds it on rank 1 alone.
    later = windows[1:]
    assert all(min(r["rank_step_time_p50_s"]) > 0.04 for r in later)
    assert all(r["rank_own_time_p50_s"][1] > 0.04 > r["rank_own_time_p50_s"][0] for r in later)
    stragglers = [r for r in records if r.get("alert") == "straggler"]
    assert stragglers and {r["rank"] for r in stragglers} == {1}
    assert len(stragglers) == len({r["step"] for r in stragglers})  # at most one per window
    assert "rank 1 is a straggler" in done.stderr
    from smelt.report.run import load_run
    from smelt.report.train_sections import throughput_section

    html = throughput_section(load_run(tmp_path))
    assert f"{len(stragglers)} straggler alert(s), ranks [1]" in html and "rank 1 own time p50" in html
    # The same run (RUN = tmp_path) passes the restore drill, replayed on one process within a tolerance.
    from smelt.cli import main

    assert main(["checkpoint", "drill", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "step_0000004 (step 4); replayed steps 5-8" in out
    assert (
        "within a relative tolerance of 0.0001 (the run trained on 2 processes, the drill replays on one)"
        in out
    )


def test_the_pipeline_summary_prints_goodput_and_the_interval_hint():
    from smelt.run.summary import goodput_rows

    figures = {"goodput": 0.8, "wall_s": 100.0, "restart_downtime_s": 0.0, "lost_s": 5.0,
               "checkpoint_stall_s": 3.0, "eval_s": 2.0, "other_s": 10.0,
               "checkpoint_interval": interval_advice(2.0, 0.5, 1.0, every_steps=1000)}  # fmt: skip
    rows = dict(goodput_rows(figures))
    assert (
        rows["goodput"]
        == "80.0% of 100.0s (redone steps 5.0s, checkpoint stalls 3.0s, eval 2.0s, other 10.0s)"
    )
    assert rows["checkpoint interval"].startswith("checkpoint.every_steps = 1000 is far from the Young-Daly")
    figures["checkpoint_interval"] = interval_advice(2.0, 0.5, 1.0, every_steps=250)
    assert dict(goodput_rows(figures))["checkpoint interval"] == (
        "every 250 steps is near the Young-Daly interval of 240"
    )
    assert goodput_rows(None) == []


def test_the_end_of_a_run_prints_the_interval_hint(monkeypatch):
    said = []
    monkeypatch.setattr(goodput_module, "say", said.append)
    goodput_module.say_interval_hint(
        {"checkpoint_interval": interval_advice(2.0, 0.5, 1.0, every_steps=1000)}
    )
    goodput_module.say_interval_hint({"checkpoint_interval": interval_advice(2.0, 0.5, 1.0, every_steps=250)})
    goodput_module.say_interval_hint(None)
    assert len(said) == 1 and said[0].startswith("hint: checkpoint.every_steps = 1000 is far from")
