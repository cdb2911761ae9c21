"""`smelt checkpoint drill RUN`: a side process resumes the newest checkpoint with logged steps after
it, replays them, and the losses must equal the run's metrics.jsonl (CPU fp32: bitwise)."""

import json
from pathlib import Path

import pytest

from helpers import write_token_data
from smelt.checkpoint.drill import DrillResult, Window, choose_checkpoint, drill_config, logged_windows
from smelt.cli import main
from smelt.config import config_from_dict
from smelt.errors import UserError
from smelt.train.trainer import train

STEPS = 8


def _config(tmp_path: Path, every_steps: int):
    return config_from_dict({
        "run": {"seed": 5, "dir": str(tmp_path), "name": "run"},
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 32},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 128, "tokens": 128 * STEPS, "lr": 3e-3,
            "log_every": 2, "eval_every": 0, "eval_tokens": 256, "precision": "fp32", "threads": 1,
        },
        "checkpoint": {"every_steps": every_steps, "keep_last": 5},
    })  # fmt: skip


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """RUN with tokens/, tokenizer/ and train/ (checkpoints at 4 and the final 8; log every 2 steps)."""
    root = tmp_path_factory.mktemp("drill")
    run = root / "run"
    run.mkdir()
    tokens, tokenizer = write_token_data(run)
    train(_config(root, every_steps=4), tokens, tokenizer, run / "train")
    return run


@pytest.mark.slow
def test_drill_replays_the_steps_after_the_checkpoint_bitwise(trained_run, capsys):
    assert main(["checkpoint", "drill", str(trained_run), "--steps", "4"]) == 0
    out = capsys.readouterr().out
    assert "step_0000004 (step 4); replayed steps 5-8" in out  # the final checkpoint has nothing after it
    assert "5-6" in out and "7-8" in out
    assert "PASS: 2 logged window(s) after step 4 match exactly (CPU fp32" in out
    assert "largest relative difference 0.00e+00" in out


@pytest.mark.slow
def test_a_log_that_disagrees_fails_with_exit_1(trained_run, tmp_path, capsys):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    metrics = run / "train" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    for record in records:
        if record["kind"] == "train" and record["step"] == 6:
            record["loss"] *= 1 + 1e-7  # the smallest change still shows: the drill asks for equality
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["checkpoint", "drill", str(run)]) == 1
    out = capsys.readouterr().out
    assert "FAIL: 1 logged window(s) after step 4 do not match exactly" in out


def test_a_tolerance_accepts_what_equality_refuses():
    window = Window(5, 6, 3.0, 0.5, replayed_loss=3.0 * (1 + 1e-7), replayed_norm=0.5)
    exact = DrillResult(Path("step_0000004"), 2, exact=True, tolerance=0.0, windows=[window])
    assert not exact.passed and exact.worst == pytest.approx(1e-7)
    assert DrillResult(Path("step_0000004"), 2, exact=False, tolerance=1e-5, windows=[window]).passed
    assert not DrillResult(Path("step_0000004"), 2, exact=False, tolerance=1e-5, windows=[]).passed


def test_windows_and_the_checkpoint_they_choose(tmp_path):
    records = [{"kind": "event", "event": "start"}, {"kind": "train", "step": 1, "loss": 5.0, "grad_norm": 1.0},
               {"kind": "train", "step": 4, "loss": 4.0, "grad_norm": 0.5},
               {"kind": "train", "step": 8, "loss": 3.0, "grad_norm": 0.4}]  # fmt: skip
    windows = logged_windows(records)
    assert [(w.first, w.last, w.loss) for w in windows] == [(1, 1, 5.0), (2, 4, 4.0), (5, 8, 3.0)]
    checkpoints = tmp_path / "checkpoints"
    for step in (4, 8):
        (checkpoints / f"step_{step:07d}").mkdir(parents=True)
        (checkpoints / f"step_{step:07d}" / "COMMITTED").write_text("")
    assert choose_checkpoint(checkpoints, windows, None).name == "step_0000004"
    with pytest.raises(UserError, match=r"no committed checkpoint of step 6 under .*\(committed: 4, 8\)"):
        choose_checkpoint(checkpoints, windows, 6)
    with pytest.raises(UserError, match="has no train record after step 8"):
        choose_checkpoint(checkpoints, windows, 8)
    with pytest.raises(UserError, match="nothing to replay against.*checkpoint.every_steps"):
        choose_checkpoint(checkpoints, [Window(1, 8, 3.0, 0.4)], None)


def test_a_multi_process_run_is_replayed_on_one_within_a_tolerance():
    meta = {
        "config": {"train": {"tensor_parallel": 2, "batch_tokens": 0}},
        "world_size": 2,
        "precision": "fp32",
    }
    config, exact, why = drill_config(meta, {"device": "cpu", "batch_tokens": 512})
    assert not exact and why == "the run trained on 2 processes, the drill replays on one"
    assert config["train"]["tensor_parallel"] == 1 and config["train"]["batch_tokens"] == 512
    assert config["eval"]["every_steps"] == 0 and config["train"]["tensorboard"] is False
    _, exact, why = drill_config({"config": {}, "world_size": 1, "precision": "bf16"}, {"device": "cuda:0"})
    assert not exact and why == "the run trained on cuda:0; in bf16"
    assert drill_config({"config": {}, "world_size": 1, "precision": "fp32"}, {"device": "cpu"})[1]


def test_user_errors_exit_2_naming_the_fix(tmp_path, capsys):
    assert main(["checkpoint", "drill", str(tmp_path / "absent")]) == 2
    assert "not a run directory with checkpoints" in capsys.readouterr().err
