"""bench/speedrun.py's machinery at tiny size: the training time to the target read from a run's metrics
(evaluation excluded), bits per byte from a loss, and the GPT-2-style baseline learning, scored by smelt's
validation code and stopping at the target."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from helpers import write_token_data

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import speedrun  # noqa: E402
from speedrun_gpt2 import GPT2, GPT2Shape, lr_at, run_baseline  # noqa: E402
from speedrun_report import spread  # noqa: E402


def test_time_to_target_sums_step_times_and_leaves_evaluation_out(tmp_path):
    split = {"val_tokens": 1000, "val_bytes": 4000, "xz_bits_per_byte": 1.0}
    loss_at = {2: 4000 * 1.5 * math.log(2) / 1000, 4: 4000 * 0.9 * math.log(2) / 1000}  # 1.5, then 0.9 bpb
    records = [{"kind": "event", "event": "start", "peak_flops": 1e9, "precision": "bf16"}]
    for step in range(1, 5):
        records.append({"kind": "train", "step": step, "tokens": 10 * step, "step_time_s": 0.5, "mfu": 0.3})
        if step in loss_at:
            records.append(
                {"kind": "eval", "step": step, "tokens": 10 * step, "val_loss": loss_at[step], "eval_s": 7.0}
            )
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    curve, figures = speedrun.smelt_curve(metrics, split)
    assert [round(row[3], 6) for row in curve] == [1.5, 0.9]
    assert figures["train_s"] == 2.0 and figures["eval_s"] == 14.0
    hit = speedrun.crossing(curve, split["xz_bits_per_byte"])
    assert hit == {"step": 4, "tokens": 40, "train_s": 2.0, "bits_per_byte": 0.9}
    assert speedrun.crossing(curve, 0.5) is None
    assert spread([3.0, 1.0, 2.0])["median"] == 2.0 and spread([1.0, None]) is None


def test_baseline_schedule_and_tied_head():
    assert lr_at(5, 1.0, 10, 100) == 0.5 and lr_at(100, 1.0, 10, 100) == 0.1
    model = GPT2(GPT2Shape(vocab=64, d_model=16, n_layers=1, n_heads=2, seq_len=8))
    # embedding 64 x 16, positions 8 x 16, one block (2 LayerNorms, qkv, proj, 4d MLP) 3,280, final norm 32;
    # a separate head would add another 64 x 16
    assert sum(p.numel() for p in model.parameters()) == 1024 + 128 + 3280 + 32


def test_baseline_learns_and_stops_at_the_target(tmp_path):
    tokens, _ = write_token_data(tmp_path)
    split = {"val_tokens": 1, "val_bytes": 1}  # bits per byte = loss / ln 2 per token here
    validate, _ = speedrun.validator(tokens, 32, 8, "fp32", split)
    shape = GPT2Shape(vocab=384, d_model=32, n_layers=2, n_heads=2, seq_len=32)
    common = {"lr": 1e-2, "seed": 1, "batch_tokens": 256, "warmup_tokens": 512, "validate": validate,
              "precision": "fp32", "eval_every": 10}  # fmt: skip
    run = run_baseline(tokens, shape, tokens=256 * 40, **common)
    first, last = run["curve"][0][3], run["curve"][-1][3]
    assert last < first - 0.5, run["curve"]  # counting sequences are learnable
    assert run["steps_run"] == 40 and run["train_s"] > 0 and run["eval_s"] > 0
    stopped = run_baseline(tokens, shape, tokens=256 * 40, stop_below=run["curve"][1][3] + 0.5, **common)
    assert stopped["steps_run"] < 40
