"""The report's expected-trajectory section: the pre-registered band behind the validation curve."""

import json

from smelt.report.run import load_run
from smelt.report.single import build_run_report
from smelt.report.trajectory_section import trajectory_section

CURVE = {"tokens": [1000.0, 10_000.0], "loss": [4.0, 3.0], "lo": [3.8, 2.8], "hi": [4.2, 3.2]}


def write_run(root, val_losses, alert=False):
    train = root / "run" / "train"
    train.mkdir(parents=True)
    records = [
        {"kind": "event", "event": "start", "step": 0, "tokens": 0, "steps": 10},
        {"kind": "event", "event": "expected_trajectory", "step": 0, "tokens": 0, "file": "ladder/fit.json",
         "tolerance_tokens": 500, "target": {"params": 1e5, "tokens": 1e4}, "curve": CURVE, "band": "95%"},
        {"kind": "eval", "step": 0, "tokens": 0, "val_loss": 5.9},  # before the curve: not judged
    ]  # fmt: skip
    for i, loss in enumerate(val_losses, start=1):
        records.append({"kind": "eval", "step": i, "tokens": 1000 * i, "val_loss": loss})
    if alert:
        records.append({"kind": "event", "event": "alert", "alert": "off_trajectory", "step": 4, "tokens": 4000,
                        "action": "log", "message": "validation loss 4.5 has been above the expected band"})  # fmt: skip
    (train / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return root / "run"


def test_the_band_the_curve_and_the_count_inside(tmp_path):
    run = load_run(write_run(tmp_path, [4.0, 4.5, 4.5, 4.5], alert=True))
    body = trajectory_section(run)
    assert "<svg" in body and "expected band" in body and "validation loss" in body
    assert "Pre-registered from ladder/fit.json for N 100,000, D 10,000" in body
    assert "1 of 4 validations inside the band; 1 off-trajectory alert(s)" in body
    assert body.count(">above<") == 3 and body.count(">inside<") == 1
    assert "off band" in body  # the alert is marked on the chart
    html = build_run_report(run)
    assert '<section id="trajectory">' in html


def test_a_run_without_train_expect_says_how_to_get_one(tmp_path):
    train = tmp_path / "run" / "train"
    train.mkdir(parents=True)
    (train / "metrics.jsonl").write_text(
        json.dumps({"kind": "eval", "step": 1, "tokens": 5, "val_loss": 3}) + "\n"
    )
    body = trajectory_section(load_run(tmp_path / "run"))
    assert "no expected trajectory" in body and "train.expect = FIT_FILE" in body and "<svg" not in body
