"""The report's tokens/s and MFU are the trainer's summary figures (the terminal, summary.json),
computed from metrics.jsonl's log windows."""

from __future__ import annotations

import json

import pytest

from helpers import write_token_data
from smelt.config import config_from_dict
from smelt.report.run import final_metrics, load_run, throughput
from smelt.report.single import summary_rows


@pytest.mark.slow
def test_report_throughput_is_the_trainers_summary(tmp_path, monkeypatch):
    from smelt.train.trainer import train

    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = write_token_data(tmp_path)
    cfg = config_from_dict({
        "run": {"seed": 3},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * 10, "lr": 3e-3,
                  "log_every": 3, "eval_every": 0, "precision": "fp32"},
        "checkpoint": {"every_steps": 0},
    })  # fmt: skip
    summary = train(cfg, tokens, tokenizer, tmp_path / "run")
    run = load_run(tmp_path / "run")
    figures = final_metrics(run)
    assert figures["tokens_per_s"] == pytest.approx(summary["tokens_per_s"], rel=1e-9)
    assert figures["mfu"] == pytest.approx(summary["mfu"], rel=1e-9)
    # Not the median of the log windows, which is what disagreed with the terminal.
    windows = sorted(r["tokens_per_s"] for r in run.kind("train"))
    assert len(windows) == 5 and figures["tokens_per_s"] != windows[len(windows) // 2]
    rows = dict(summary_rows(run))
    assert rows["training tokens/s"] == f"{summary['tokens_per_s']:,.0f}"
    assert rows["MFU"] == f"{100 * summary['mfu']:.1f}%"


def test_a_resumed_run_reports_its_last_launch(tmp_path):
    start = {"kind": "event", "event": "start", "step": 0, "tokens": 0, "flops_per_token": 1e6,
             "peak_flops": 1e12}  # fmt: skip
    records = [
        start,
        {"kind": "train", "step": 2, "tokens": 200, "tokens_per_s": 100.0},  # 2 s
        {"kind": "train", "step": 4, "tokens": 400, "tokens_per_s": 50.0},  # 4 s, then a crash
        {**start, "event": "resume", "step": 2, "tokens": 200},
        {"kind": "train", "step": 4, "tokens": 400, "tokens_per_s": 200.0},  # 1 s
        {"kind": "train", "step": 6, "tokens": 700, "tokens_per_s": 100.0},  # 3 s
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = throughput(load_run(run_dir))
    assert figures["tokens_per_s"] == pytest.approx(500 / 4)  # the trainer's: tokens since resume / step time
    assert figures["mfu"] == pytest.approx(1e6 * 125 / 1e12)
