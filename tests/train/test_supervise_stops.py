"""Failures a restart would repeat are not retried: a run that stopped itself exits 3 (the child
`smelt train` too, with one paragraph instead of a traceback), a run stopped on a signal after its
checkpoint exits 75, and a crash on a disk with less room than one checkpoint is not relaunched."""

import json
import shutil
import sys
import textwrap
from collections import namedtuple

from smelt.cli import main
from smelt.train.alerts import TrainingStopped
from smelt.train.ops.supervise import STOPPED_EXIT_CODE, describe_exit, supervise

from .test_supervise import events, fake

Usage = namedtuple("Usage", "total used free")


def test_the_child_exits_3_with_one_paragraph_on_a_deliberate_stop(monkeypatch, capsys):
    message = (
        "training stopped at step 30: the weights hold NaN or Inf after a non-finite update was applied, in "
        "28 parameter tensors (tok_emb.weight, ...); no checkpoint was written with them (lr 7.53). Lower "
        "train.lr, raise train.warmup_tokens or check the data."
    )

    def stopped(args):
        raise TrainingStopped(message, "nonfinite_weights")

    monkeypatch.setattr("smelt.cli._dispatch", stopped)
    assert main(["train", "pipeline.toml"]) == STOPPED_EXIT_CODE == 3
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1  # one paragraph
    assert err.startswith(f"smelt: {message} (exit 3: the run stopped itself, and a restart from its last")
    assert "--max-restarts does not relaunch it" in err
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "pipeline.toml"]) == 3 and capsys.readouterr().err == ""  # rank 0 says it


def test_other_failures_still_exit_1_with_the_traceback(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr("smelt.cli._dispatch", broken)
    assert main(["train", "pipeline.toml"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_exit_3_is_not_retried_even_without_an_end_record(tmp_path, capsys):
    log = tmp_path / "restarts.jsonl"
    child = [sys.executable, "-c", "raise SystemExit(3)"]
    outcome = supervise(child, tmp_path / "train" / "checkpoints", log, 3, sleep=lambda s: None)
    assert outcome.exit_code == 3 and outcome.exit_codes == [3]
    assert (
        "not restarting: the run stopped itself (exit 3; the message above says why)"
        in capsys.readouterr().err
    )
    assert [e["event"] for e in events(log)] == ["launch", "exit", "deterministic_stop", "stopped"]
    assert "stopped itself" in describe_exit(3)


def test_a_stop_on_a_signal_is_not_retried(tmp_path, capsys):
    log = tmp_path / "restarts.jsonl"
    child = [sys.executable, "-c", "raise SystemExit(75)"]
    outcome = supervise(child, tmp_path / "ckpts", log, 3, sleep=lambda s: None)
    assert outcome.exit_code == 75 and outcome.exit_codes == [75]
    assert "not restarting: training stopped on a signal" in capsys.readouterr().err
    assert events(log)[-1]["event"] == "stopped"


def free_space(monkeypatch, free: int) -> None:
    usage = Usage(10**12, 10**12 - free, free)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage)


def test_no_relaunch_when_the_disk_has_less_room_than_one_checkpoint(tmp_path, monkeypatch, capsys):
    # The fake run: attempt 1 commits step 10 (a meta.json of 12 bytes) and crashes, attempt 2 finishes.
    log = tmp_path / "restarts.jsonl"
    free_space(monkeypatch, 10**9)
    outcome = supervise(fake(tmp_path, 1), tmp_path / "ckpts", log, 3, backoff_base_s=0, sleep=lambda s: None)
    assert outcome.exit_codes == [1, 0]  # room enough: relaunched
    shutil.rmtree(tmp_path / "ckpts")
    log.unlink()
    capsys.readouterr()

    free_space(monkeypatch, 5)
    outcome = supervise(fake(tmp_path, 1), tmp_path / "ckpts", log, 3, backoff_base_s=0, sleep=lambda s: None)
    assert outcome.exit_code == 1 and outcome.exit_codes == [1]  # not relaunched
    err = capsys.readouterr().err
    assert "not restarting: 0.0 MB free on the disk of" in err and "less than one checkpoint takes" in err
    assert "step_0000010), so the next save would fail the same way" in err and "resumes from step 10" in err
    assert "giving up" not in err
    record = events(log)[-2]
    assert record == {**record, "event": "no_space", "attempt": 1, "checkpoint": "step_0000010"}
    assert events(log)[-1]["event"] == "stopped"


# A run whose first save failed on a full disk: no checkpoint, the failure's event in metrics.jsonl.
DISK_FULL_CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    train = Path(sys.argv[1])
    train.mkdir(parents=True, exist_ok=True)
    with open(train / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "event", "step": 50, "event": "checkpoint_failed", "disk_full": True,
                            "needed_mb": 1.7, "free_mb": 0.8}) + "\\n")
    sys.exit(1)
    """
)


def test_before_any_checkpoint_the_failed_saves_size_decides(tmp_path, monkeypatch, capsys):
    free_space(monkeypatch, 800_000)
    log = tmp_path / "restarts.jsonl"
    child = [sys.executable, "-c", DISK_FULL_CHILD, str(tmp_path / "train")]
    outcome = supervise(
        child, tmp_path / "train" / "checkpoints", log, 3, backoff_base_s=0, sleep=lambda s: None
    )
    assert outcome.exit_code == 1 and outcome.exit_codes == [1]
    err = capsys.readouterr().err
    assert (
        "0.8 MB free" in err and "(1.7 MB, the step 50 save that failed)" in err and "from the start" in err
    )
    assert json.loads(log.read_text().splitlines()[-2])["needed_mb"] == 1.7
