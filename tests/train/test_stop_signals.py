"""SIGTERM and SIGINT while training: the step in progress finishes, its checkpoint is committed, the
run ends with a message and exit code 75, and running it again continues exactly where it stopped. A
signal is never left waiting: past SMELT_STOP_GRACE_S the process ends on its own, and a second
signal (not the launcher's copy of the first) stops it at once."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from smelt.cli import main
from smelt.train.ops.watchdog import SIGNAL_EXIT_CODE, StopRequested
from smelt.train.trainer import Trainer, train

from .test_rank_output import write_pipeline
from .test_trainer import data, read_metrics, tiny_config  # noqa: F401 - the data fixture


def losses(lines: list[dict]) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in lines if r["kind"] == "train"]


def signal_during(monkeypatch, step: int, signum: int) -> None:
    """Send `signum` to this process while step `step` is starting (as its batch is read)."""
    real = Trainer.next_batch

    def next_batch(self, at):
        if at == step:
            os.kill(os.getpid(), signum)
        return real(self, at)

    monkeypatch.setattr(Trainer, "next_batch", next_batch)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_the_step_in_progress_and_the_rerun_continues_exactly(
    data,  # noqa: F811
    tmp_path,
    monkeypatch,
    signum,
):
    tokens, tokenizer = data
    cfg = tiny_config(log_every=1, eval_every=0)  # 12 steps, a checkpoint every 4
    train(cfg, tokens, tokenizer, tmp_path / "whole")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    out = tmp_path / "stopped"
    signal_during(monkeypatch, 6, signum)
    with pytest.raises(StopRequested) as stopped:
        train(cfg, tokens, tokenizer, out)
    name = signal.Signals(signum).name
    assert stopped.value.exit_code == SIGNAL_EXIT_CODE == 75
    assert f"training stopped by {name} after step 6 of 12; its checkpoint" in str(stopped.value)
    assert {s: signal.getsignal(s) for s in before} == before  # the handlers are put back
    assert (out / "checkpoints" / "step_0000006" / "COMMITTED").is_file()  # not a scheduled save
    records = read_metrics(out)
    assert [r["step"] for r in records if r["kind"] == "train"] == [1, 2, 3, 4, 5, 6]
    end = records[-1]
    assert end == {**end, "event": "end", "status": "stopped", "signal": name, "step": 6}

    monkeypatch.undo()
    train(cfg, tokens, tokenizer, out, resume="auto")
    assert losses(read_metrics(out)) == losses(read_metrics(tmp_path / "whole"))  # bit for bit


def test_a_signal_during_the_last_validation_stops_the_process_once_training_is_done(
    data,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    tokens, tokenizer = data
    real = Trainer.finish

    def finish(self):
        os.kill(os.getpid(), signal.SIGINT)
        real(self)

    monkeypatch.setattr(Trainer, "finish", finish)
    # The signal is delivered again to the handler that was there before training: pin it to Python's
    # own, so that a handler another test left in this worker process (Ray's, say) cannot take it.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):  # delivered again once the handlers are put back
            train(tiny_config(eval_every=0), tokens, tokenizer, tmp_path / "run")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (tmp_path / "run" / "checkpoints" / "step_0000012" / "COMMITTED").is_file()
    assert read_metrics(tmp_path / "run")[-1] == {**read_metrics(tmp_path / "run")[-1], "status": "ok"}


def test_the_cli_prints_the_stop_and_exits_75(monkeypatch, capsys):
    def stopped(args):
        raise StopRequested(
            "training stopped by SIGTERM after step 6 of 12; its checkpoint X is committed.", 15
        )

    monkeypatch.setattr("smelt.cli._dispatch", stopped)
    assert main(["train", "pipeline.toml"]) == 75
    err = capsys.readouterr().err
    assert err == "smelt: training stopped by SIGTERM after step 6 of 12; its checkpoint X is committed.\n"
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["train", "pipeline.toml"]) == 75
    assert capsys.readouterr().err == ""  # rank 0 says it


# A step that never ends, under the stop handlers of a 0.5 s grace.
HANGING = textwrap.dedent(
    """
    import os, signal, sys, time
    from smelt.train.ops.watchdog import StopSignals
    with StopSignals(grace_s=float(sys.argv[1])):
        print("ready", flush=True)
        time.sleep(60)
    """
)


@pytest.mark.slow  # subprocesses
def test_the_stop_is_bounded_and_a_second_signal_stops_at_once():
    child = subprocess.Popen([sys.executable, "-c", HANGING, "0.5"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout.readline() == "ready\n"
    sent = time.monotonic()
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=30)
    assert child.returncode == 128 + signal.SIGTERM and time.monotonic() - sent < 10
    assert "SIGTERM: finishing the step in progress, saving its checkpoint and stopping (within 0.5 s" in err
    assert (
        "did not finish within 0.5 s of SIGTERM (SMELT_STOP_GRACE_S); exiting without them (exit 143)" in err
    )

    child = subprocess.Popen([sys.executable, "-c", HANGING, "60"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGTERM)
    child.send_signal(signal.SIGTERM)  # the same request again (a launcher forwarding it): ignored
    time.sleep(2.5)
    assert child.poll() is None
    child.send_signal(signal.SIGTERM)  # a second request: at once
    child.communicate(timeout=30)
    assert child.returncode == -signal.SIGTERM


@pytest.mark.slow  # the data stages, then `smelt train` twice as subprocesses
def test_sigterm_on_smelt_train_saves_says_so_and_exits_75_then_the_run_resumes(tmp_path):
    config = write_pipeline(tmp_path)
    for words in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        assert main([*words, str(config)]) == 0
    command = [sys.executable, "-m", "smelt.cli", "train", str(config), "--set", "train.tokens=12800"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1"}
    child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "ranks" / "train" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while child.poll() is None and time.monotonic() < deadline:
        lines = metrics.read_text().splitlines() if metrics.is_file() else []
        if any(json.loads(line).get("kind") == "train" and json.loads(line)["step"] >= 3 for line in lines):
            break
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == SIGNAL_EXIT_CODE, err[-3000:]
    end = json.loads(metrics.read_text().splitlines()[-1])
    step = end["step"]
    assert end["status"] == "stopped" and 3 <= step < 100
    assert f"smelt: training stopped by SIGTERM after step {step} of 100; its checkpoint" in err
    checkpoint = tmp_path / "runs" / "ranks" / "train" / "checkpoints" / f"step_{step:07d}"
    assert (checkpoint / "COMMITTED").is_file()

    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r for r in resumed if r.get("event") == "resume"][0]["step"] == step
    assert [r["step"] for r in resumed if r["kind"] == "train"] == list(range(1, 101))
