"""TensorBoard export and the live sinks (TensorBoard, W&B offline); clear errors when an extra is missing."""

from __future__ import annotations

import json
import sys

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.report.sinks import export_tensorboard
from smelt.train.sinks import TensorBoardSink, WandbSink, scalars


def test_scalars_of_each_record_kind(metrics_records):
    records = metrics_records()
    train = next(r for r in records if r["kind"] == "train")
    tags = dict(scalars(train))
    assert tags["train/loss"] == train["loss"] and tags["train/clipped"] == 1.0 and "train/stage" not in tags
    evaluation = dict(scalars(next(r for r in records if r["kind"] == "eval")))
    assert {"eval/val_loss", "eval/val_loss/code", "eval/val_loss/web"} <= set(evaluation)
    assert dict(scalars({"kind": "eval", "tokens": 1, "tasks": {"arc": {"acc": 0.5}}})) == {
        "eval/task/arc/acc": 0.5
    }


def test_tensorboard_export_reads_back_against_tokens(tiny_run, tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path / "tb"
    assert main(["report", str(tiny_run), "--tensorboard", str(logdir)]) == 0
    assert "tensorboard:" in capsys.readouterr().out
    events = EventAccumulator(str(logdir))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "eval/val_loss", "events/alert_loss_spike", "events/rollback"} <= set(
        tags
    )
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [2048 * s for s in range(2, 41, 2)]  # x axis: tokens
    assert "events/text_summary" in events.Tags()["tensors"]  # event descriptions as text


def test_tensorboard_export_has_the_data_sets_smelt_eval_scored(tiny_run, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    label = "../shared/data/corpus/web/dolma-cc-sample"
    for step in (20, 40):  # `smelt eval RUN --data PATH` adds the set to the step file
        path = tiny_run / "eval" / f"step_{step:07d}.json"
        result = json.loads(path.read_text())
        result["data"] = {label: {"documents": 20, "bytes": 155587, "tokens": 50734, "seq_len": 256,
                                  "loss": 7.0 - step / 10, "bits_per_byte": 3.0 - step / 100,
                                  "gzip_bits_per_byte": 3.06, "xz_bits_per_byte": 2.78,
                                  "gzip_window_bits_per_byte": 4.56, "xz_window_bits_per_byte": 5.1}}  # fmt: skip
        path.write_text(json.dumps(result))
    logdir, _ = export_tensorboard(tiny_run, tmp_path / "tb")
    events = EventAccumulator(str(logdir))
    events.Reload()
    prefix = "checkpoint_eval/data/shared_data_corpus_web_dolma-cc-sample/"
    tags = {t for t in events.Tags()["scalars"] if t.startswith(prefix)}
    figures = ("loss", "bits_per_byte", "gzip_bits_per_byte", "xz_bits_per_byte")
    assert tags == {prefix + k for k in (*figures, "gzip_window_bits_per_byte", "xz_window_bits_per_byte")}
    points = events.Scalars(prefix + "bits_per_byte")
    assert [(e.step, round(e.value, 4)) for e in points] == [(20 * 2048, 2.8), (40 * 2048, 2.6)]
    assert "checkpoint_eval/bits_per_byte" in events.Tags()["scalars"]  # held-out, as before


def test_tensorboard_missing_extra_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(UserError, match=r"pip install 'smelt\[tensorboard\]'"):
        TensorBoardSink(tmp_path / "tb")
    with pytest.raises(UserError, match="does not exist"):
        export_tensorboard(tmp_path / "nope", tmp_path / "tb")


def test_wandb_sink_offline(tmp_path, metrics_records, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sink = WandbSink("smelt-test", "tiny", tmp_path / "wandb", mode="offline")
    for record in metrics_records():
        sink.log(record)
    sink.close()
    files = list((tmp_path / "wandb").rglob("*.wandb"))
    assert len(files) == 1 and b"train/loss" in files[0].read_bytes()


def test_wandb_missing_extra_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(UserError, match=r"pip install 'smelt\[wandb\]'"):
        WandbSink("p", "n", tmp_path)
