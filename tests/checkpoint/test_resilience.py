"""Checkpoints that survive: SIGKILL at random moments, damaged and foreign checkpoints, a full disk,
async snapshots, milestones, and metadata that is never unpickled blindly."""

import errno
import json
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import VOCAB, build_model, tiny_model_config, write_token_data
from smelt.checkpoint.failures import CheckpointSaveError
from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import (
    MARKER,
    latest_checkpoint,
    list_checkpoints,
    load_model,
    read_meta,
    save_checkpoint,
)
from smelt.checkpoint.tools import verify
from smelt.cli import main
from smelt.config import config_from_dict
from smelt.errors import UserError
from smelt.train.setup import resolve_resume
from smelt.train.trainer import train

WORKER = Path(__file__).parents[1] / "train" / "dist_worker.py"
STEPS = 24


def raw_config(**checkpoint) -> dict:
    return {
        "run": {"seed": 5},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
        },
        "checkpoint": {"every_steps": 3, "keep_last": 2, **checkpoint},
    }  # fmt: skip


def step_losses(out: Path) -> dict[int, float]:
    """Loss per step; each step is logged once (a resume moves what it replays to the superseded file)."""
    found: dict[int, float] = {}
    for line in (out / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)  # a line cut by SIGKILL is moved aside at resume
        if record.get("kind") == "train":
            assert record["step"] not in found, f"step {record['step']} logged twice"
            found[record["step"]] = record["loss"]
    return found


def launch(config: Path, tokens: Path, tokenizer: Path, out: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    return subprocess.Popen(
        [sys.executable, str(WORKER), str(config), str(tokens), str(tokenizer), str(out), "auto"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def logged_steps(out: Path) -> int:
    path = out / "metrics.jsonl"
    return path.read_text().count('"kind": "train"') if path.is_file() else 0


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume_auto_is_bitwise_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = write_token_data(tmp_path)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(raw_config()))
    train(config_from_dict(raw_config()), tokens, tokenizer, tmp_path / "reference")
    expected = step_losses(tmp_path / "reference")
    assert sorted(expected) == list(range(1, STEPS + 1))

    out, chooser, kills = tmp_path / "killed", random.Random(7), 0
    for attempt in range(4):
        process = launch(config, tokens, tokenizer, out)
        if attempt == 3:  # three kills, then let it finish
            assert process.wait(timeout=300) == 0, process.stderr.read()[-3000:]
            break
        before = logged_steps(out)
        # Kill at a random moment after this attempt made progress: inside a step, during an async
        # save or between saves (saves come every 3 steps, so all three happen across attempts).
        deadline = time.time() + 120
        target = before + chooser.randint(1, 8)
        while process.poll() is None and logged_steps(out) < target and time.time() < deadline:
            time.sleep(0.005)
        time.sleep(chooser.uniform(0.0, 0.05))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
            kills += 1
            continue
        assert process.returncode == 0, process.stderr.read()[-3000:]
        break
    assert kills >= 3
    resumed = step_losses(out)
    assert resumed == expected  # bitwise: floats compared exactly
    events = [
        json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.startswith("{")
    ]
    assert any(e.get("event") == "resume" for e in events)


def trained(tmp_path, steps: int = 9, **checkpoint) -> tuple[dict, Path, Path]:
    tokens, tokenizer = write_token_data(tmp_path)
    raw = raw_config(**checkpoint)
    raw["train"]["tokens"] = 256 * steps
    return raw, tokens, tokenizer


@pytest.mark.slow
def test_damaged_checkpoints_are_passed_over_with_a_warning(tmp_path):
    raw, tokens, tokenizer = trained(tmp_path)
    out = tmp_path / "run"
    train(config_from_dict(raw), tokens, tokenizer, out)
    names = [p.name for p in list_checkpoints(out / "checkpoints")]
    assert names == ["step_0000003", "step_0000006", "step_0000009"]
    final, middle = out / "checkpoints" / "step_0000009", out / "checkpoints" / "step_0000006"
    (final / MARKER).unlink()  # an unfinished save: not a checkpoint at all
    with pytest.raises(UserError, match="no COMMITTED marker"):
        load_model(final)
    shard = next(middle.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a truncated shard

    chosen, warnings = resolve_resume("auto", out / "checkpoints")
    assert chosen is not None and chosen.name == "step_0000003"
    assert len(warnings) == 2
    assert "step_0000009" in warnings[0] and "no COMMITTED marker" in warnings[0]
    assert "step_0000006" in warnings[1] and shard.name in warnings[1]
    summary = train(config_from_dict(raw), tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] == 3
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    alerts = [r for r in lines if r.get("alert") == "damaged_checkpoint"]
    assert [a["action"] for a in alerts] == ["fallback", "fallback"]
    assert "step_0000009" in alerts[0]["message"] and "step_0000006" in alerts[1]["message"]
    # The damaged ones are kept aside, out of the resume chain; the run rewrote steps 6 and 9.
    superseded = out / "checkpoints" / "superseded"
    assert sorted(p.name for p in superseded.iterdir()) == ["step_0000006", "step_0000009"]
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == [
        "step_0000003",
        "step_0000006",
        "step_0000009",
    ]


@pytest.mark.slow
def test_unmarked_checkpoint_alerts_in_the_terminal_and_metrics(tmp_path, monkeypatch, capsys):
    raw, tokens, tokenizer = trained(tmp_path, steps=6)
    out = tmp_path / "run"
    train(config_from_dict(raw), tokens, tokenizer, out)
    (out / "checkpoints" / "step_0000006" / MARKER).unlink()  # killed between the rename and the marker
    monkeypatch.delenv("SMELT_QUIET", raising=False)
    capsys.readouterr()
    summary = train(config_from_dict(raw), tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] == 3
    assert (
        "warning: skipping damaged checkpoint step_0000006: it has no COMMITTED marker"
        in capsys.readouterr().err
    )
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (alert,) = [r for r in records if r.get("alert") == "damaged_checkpoint"]
    assert alert["step"] == 3 and "step_0000006" in alert["message"]


@pytest.mark.slow
def test_edited_meta_json_fails_verify_and_resume_falls_back(tmp_path, capsys):
    raw, tokens, tokenizer = trained(tmp_path, steps=6)
    out = tmp_path / "run"
    train(config_from_dict(raw), tokens, tokenizer, out)
    final = out / "checkpoints" / "step_0000006"
    assert "files and meta.json match their sha256" in verify(out / "checkpoints")
    meta = json.loads((final / "meta.json").read_text())
    meta["loader"]["step"] = 1  # an edit the file checksums cannot see: the loader would replay data
    (final / "meta.json").write_text(json.dumps(meta))
    code = main(["checkpoint", "verify", str(out / "checkpoints")])
    captured = capsys.readouterr()
    err = captured.err
    assert code == 2 and "step_0000006: CORRUPT" in captured.out and "corrupt (step_0000006)" in err
    assert "meta.json does not match its sha256 in COMMITTED; it was edited or is corrupt" in err
    summary = train(config_from_dict(raw), tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] == 3
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (alert,) = [r for r in records if r.get("alert") == "damaged_checkpoint"]
    assert "meta.json does not match" in alert["message"] and alert["action"] == "fallback"
    assert (out / "checkpoints" / "superseded" / "step_0000006" / "meta.json").read_text() == json.dumps(meta)


@pytest.mark.slow
def test_emptied_marker_fails_verify_and_resume_falls_back(tmp_path, capsys):
    raw, tokens, tokenizer = trained(tmp_path, steps=6)
    out = tmp_path / "run"
    train(config_from_dict(raw), tokens, tokenizer, out)
    final = out / "checkpoints" / "step_0000006"
    meta = json.loads((final / "meta.json").read_text())
    meta["tokens"] = 1000  # an edit that an emptied marker used to let through
    (final / "meta.json").write_text(json.dumps(meta))
    (final / MARKER).write_text("")  # `: > COMMITTED`
    assert main(["checkpoint", "verify", str(out / "checkpoints")]) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert (
        "step_0000006: CORRUPT" in captured.out
        and "COMMITTED marker is empty" in err
        and "unchecked" not in err
    )
    summary = train(config_from_dict(raw), tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] == 3
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (alert,) = [r for r in records if r.get("alert") == "damaged_checkpoint"]
    assert "COMMITTED marker is empty" in alert["message"] and alert["action"] == "fallback"
    assert (out / "checkpoints" / "superseded" / "step_0000006" / MARKER).read_text() == ""
    # The resumed run rewrote step 6 with a marker that vouches for its meta.json.
    assert read_meta(out / "checkpoints" / "step_0000006")["tokens"] == 256 * 6


@pytest.mark.slow
def test_every_checkpoint_damaged_starts_over_and_keeps_the_old_metrics(tmp_path):
    raw, tokens, tokenizer = trained(tmp_path, steps=6)
    out = tmp_path / "run"
    train(config_from_dict(raw), tokens, tokenizer, out)
    old_metrics = (out / "metrics.jsonl").read_text()
    for path in list_checkpoints(out / "checkpoints"):
        (path / "meta.json").write_text("{}")
    summary = train(config_from_dict(raw), tokens, tokenizer, out, resume="auto")
    assert summary["resumed_from_step"] is None
    assert (out / "metrics.jsonl.1").read_text() == old_metrics  # what took compute to make is kept
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert records[0]["event"] == "start"
    alerts = [r for r in records if r.get("alert") == "damaged_checkpoint"]
    assert len(alerts) == 2 and {a["action"] for a in alerts} == {"start_over"}
    notes = [r["message"] for r in records if r.get("event") == "note"]
    assert any("kept as metrics.jsonl.1" in n for n in notes)
    assert sorted(p.name for p in (out / "checkpoints" / "superseded").iterdir()) == [
        "step_0000003",
        "step_0000006",
    ]


@pytest.mark.slow
def test_checkpoint_of_another_model_shape_or_tokenizer_is_refused(tmp_path):
    raw, tokens, tokenizer = trained(tmp_path, steps=6)
    meta = json.loads((tokens / "meta.json").read_text())
    (tokens / "meta.json").write_text(json.dumps({**meta, "tokenizer_hash": "a" * 64}))
    train(config_from_dict(raw), tokens, tokenizer, tmp_path / "run")
    ckpt = tmp_path / "run" / "checkpoints" / "step_0000003"
    wider = json.loads(json.dumps(raw))
    wider["model"]["d_model"] = 128
    with pytest.raises(UserError, match=r"model\.d_model: checkpoint 64, this run 128"):
        train(config_from_dict(wider), tokens, tokenizer, tmp_path / "other", resume=ckpt)
    (tokens / "meta.json").write_text(json.dumps({**meta, "tokenizer_hash": "f" * 64}))
    with pytest.raises(UserError, match="tokenizer: checkpoint"):
        train(config_from_dict(raw), tokens, tokenizer, tmp_path / "third", resume=ckpt)


def model_and_optimizer():
    model = build_model(tiny_model_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (2, 16))
    model(x, x)[1].backward()
    optimizer.step()
    return model, optimizer


META = {"model_config": tiny_model_config(), "vocab_size": VOCAB}


@pytest.mark.parametrize("async_save", [False, True])
@pytest.mark.slow
def test_full_disk_during_save_is_clear_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch, async_save):
    model, optimizer = model_and_optimizer()
    saver = Checkpointer(tmp_path / "ckpt", keep_last=2, async_save=async_save)
    saver.save(1, model, optimizer, {**META, "tokens": 1}, {"rng": {}}, batch_tokens=1)
    saver.wait()

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", full_disk)
    with pytest.raises(CheckpointSaveError) as caught:
        saver.save(2, model, optimizer, {**META, "tokens": 2}, {"rng": {}}, batch_tokens=1)
        saver.wait()
    monkeypatch.undo()
    saver.close()
    message = str(caught.value)
    assert not isinstance(caught.value, UserError)  # a failure while running (exit 1), not bad input
    assert f"step 2 failed: no space left on device at {tmp_path / 'ckpt'} (needs ~" in message
    assert "step_0000001 is intact" in message and "--resume auto" not in message
    assert "--max-restarts N" in message and "--resume-from STEP" in message
    assert caught.value.disk_full
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == ["step_0000001"]
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))
    assert not (tmp_path / "ckpt" / "step_0000002").exists()
    load_model(tmp_path / "ckpt" / "step_0000001")  # still loads


def test_short_write_without_errno_is_reported_as_a_full_disk(tmp_path, monkeypatch):
    # torch's serializer reports a short write as "unexpected pos", with the errno lost.
    model, optimizer = model_and_optimizer()
    save_checkpoint(tmp_path / "ckpt", 1, model, optimizer, {**META, "tokens": 1})

    def short_write(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 704 vs 598")

    monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", short_write)
    monkeypatch.setattr(
        shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000)
    )
    with pytest.raises(
        CheckpointSaveError, match=r"no space left on device at .* \(needs ~\d+\.\d MB, 0\.0 MB free\)"
    ):
        save_checkpoint(tmp_path / "ckpt", 2, model, optimizer, {**META, "tokens": 2})
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, 10**12))
    with pytest.raises(CheckpointSaveError, match=r"failed: .*unexpected pos 704 vs 598 \(writing under"):
        save_checkpoint(tmp_path / "ckpt", 2, model, optimizer, {**META, "tokens": 2})


def test_marker_write_failing_leaves_the_step_uncommitted(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()
    import smelt.checkpoint.store as store

    real = store._write_json_synced

    def full_at_marker(path, value):
        if path.name == MARKER:
            path.write_text("{")  # a half-written marker
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, value)

    monkeypatch.setattr(store, "_write_json_synced", full_at_marker)
    with pytest.raises(CheckpointSaveError, match="no space left on device"):
        save_checkpoint(tmp_path / "ckpt", 1, model, optimizer, {**META, "tokens": 1})
    assert list((tmp_path / "ckpt").iterdir()) == []


@pytest.mark.slow
def test_full_disk_in_training_is_exit_1_with_a_checkpoint_failed_event(tmp_path, monkeypatch, capsys):
    raw, tokens, tokenizer = trained(tmp_path, steps=9)
    out = tmp_path / "run"
    real = torch.distributed.checkpoint.FileSystemWriter.write_data

    def full_at_step_6(self, *args, **kwargs):
        if "step_0000006" in str(self.path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(torch.distributed.checkpoint.FileSystemWriter, "write_data", full_at_step_6)
    with pytest.raises(CheckpointSaveError) as caught:
        train(config_from_dict(raw), tokens, tokenizer, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (failed,) = [r for r in records if r.get("event") == "checkpoint_failed"]
    assert failed["step"] == 6 and failed["disk_full"] and failed["previous"] == "step_0000003"
    assert failed["path"].endswith("step_0000006") and failed["needed_mb"] > 0 and failed["free_mb"] >= 0
    assert "no space left on device" in failed["message"]
    assert records[-1]["event"] == "end" and records[-1]["status"] == "failed"
    assert [p.name for p in list_checkpoints(out / "checkpoints")] == ["step_0000003"]
    assert not (out / "checkpoints" / "step_0000006").exists()
    assert not list((out / "checkpoints").glob(".tmp-*"))

    # The CLI says so and exits 1 (a failure while running), which --max-restarts retries.
    import smelt.cli as cli

    def dispatch(args):
        raise caught.value

    monkeypatch.setattr(cli, "_dispatch", dispatch)
    assert main(["train", "config.toml"]) == 1
    assert "no space left on device" in capsys.readouterr().err


def test_async_snapshot_is_isolated_from_later_updates(tmp_path):
    model, optimizer = model_and_optimizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    saver = Checkpointer(tmp_path / "ckpt", keep_last=2, async_save=True)
    events = saver.save(4, model, optimizer, {**META, "tokens": 4}, {"rng": {}}, batch_tokens=1)
    saver.before_update()  # the trainer's contract: the host copy is done before weights change
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next optimizer step, while the save may still be writing
    events += saver.close()
    assert [e["event"] for e in events] == ["checkpoint"] and events[0]["async"]
    loaded, _ = load_model(latest_checkpoint(tmp_path / "ckpt"))
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, before[name]), name


@pytest.mark.slow
def test_milestones_survive_retention(tmp_path):
    model, optimizer = model_and_optimizer()
    saver = Checkpointer(tmp_path / "ckpt", keep_last=1, async_save=False, milestone_every_tokens=500)
    for step in range(1, 8):
        saver.save(step, model, optimizer, {**META, "tokens": step * 200}, {"rng": {}}, batch_tokens=200)
    saver.close()
    # tokens 200..1400: the 500 and 1000 marks are crossed at steps 3 (600) and 5 (1000); besides
    # milestones, the newest and keep_last=1 more survive
    assert [p.name for p in list_checkpoints(tmp_path / "ckpt")] == [
        "step_0000003",
        "step_0000005",
        "step_0000006",
        "step_0000007",
    ]


class _Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_foreign_pickle_in_metadata_is_refused_not_executed(tmp_path, monkeypatch):
    model, optimizer = model_and_optimizer()
    path = save_checkpoint(tmp_path / "ckpt", 1, model, optimizer, META)
    (path / ".metadata").write_bytes(pickle.dumps(_Evil()))
    monkeypatch.chdir(tmp_path)
    from smelt.checkpoint.store import SafeReader

    with pytest.raises(UserError, match="refusing to load posix.system"):
        SafeReader(path).read_metadata()
    assert not (tmp_path / "pwned").exists()
