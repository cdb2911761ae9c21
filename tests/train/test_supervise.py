"""The supervisor relaunches a crashing child with backoff and gives up after N restarts."""

import json
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from smelt.cli import build_parser, main
from smelt.errors import UserError
from smelt.train.ops.supervise import STOPPED_EXIT_CODE, backoff_s, child_command, describe_exit, supervise

# A fake training run: attempt k writes checkpoint step 10 k, then fails until attempt FAIL_UNTIL.
CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    ckpts, fail_until = Path(sys.argv[1]), int(sys.argv[2])
    attempt = int(os.environ["SMELT_ATTEMPT"])
    step_dir = ckpts / f"step_{10 * attempt:07d}"
    step_dir.mkdir(parents=True)
    (step_dir / "meta.json").write_text(json.dumps({"step": 10 * attempt}))
    (step_dir / "COMMITTED").write_text("")
    sys.exit(1 if attempt <= fail_until else 0)
    """
)


def events(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def fake(tmp_path, fail_until):
    return [sys.executable, "-c", CHILD, str(tmp_path / "ckpts"), str(fail_until)]


def test_fails_twice_then_succeeds(tmp_path, capsys):
    waits = []
    log = tmp_path / "restarts.jsonl"
    outcome = supervise(fake(tmp_path, 2), tmp_path / "ckpts", log, 3, backoff_base_s=0.5, sleep=waits.append)
    assert outcome.exit_code == 0
    assert outcome.exit_codes == [1, 1, 0] and outcome.attempts == 3 and outcome.last_step == 30
    assert waits == [0.5, 1.0]  # exponential backoff
    log_events = events(log)
    assert [e["event"] for e in log_events] == [
        "launch", "exit", "restart", "launch", "exit", "restart", "launch", "exit", "done",
    ]  # fmt: skip
    launches = [e for e in log_events if e["event"] == "launch"]
    assert [e["resume_step"] for e in launches] == [None, 10, 20]  # restored from the latest checkpoint
    assert log_events[-1]["exit_codes"] == [1, 1, 0]
    err = capsys.readouterr().err
    assert "restart 1/3" in err and "from checkpoint step 10" in err and "restart 2/3" in err


def test_always_failing_gives_up_after_n_restarts_with_a_summary(tmp_path, capsys):
    log = tmp_path / "restarts.jsonl"
    outcome = supervise(
        fake(tmp_path, 99), tmp_path / "ckpts", log, 2, backoff_base_s=0, sleep=lambda s: None
    )
    assert outcome.exit_code == 1
    assert outcome.exit_codes == [1, 1, 1]
    summary = events(log)[-1]
    assert summary == {**summary, "event": "gave_up", "attempts": 3, "restarts": 2, "last_step": 30}
    err = capsys.readouterr().err
    assert "giving up after 3 attempts (2 restarts)" in err and "[1, 1, 1]" in err and "step 30" in err


def test_bad_input_is_not_retried(tmp_path, capsys):
    log = tmp_path / "restarts.jsonl"
    outcome = supervise([sys.executable, "-c", "raise SystemExit(2)"], tmp_path / "none", log, 5, sleep=None)
    assert outcome.exit_code == 2 and outcome.exit_codes == [2]
    assert "not restarting" in capsys.readouterr().err
    assert events(log)[-1]["event"] == "stopped"


# A training run that stops itself (non-finite weights): its end record, then a save that committed
# while it closed, then exit 1 as the CLI gives any failure while running.
STOPPING_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    train = Path(sys.argv[1])
    train.mkdir(parents=True, exist_ok=True)
    with open(train / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"kind": "event", "step": 6, "event": "end", "status": "failed",
                            "reason": "nonfinite_weights", "deterministic": True, "time": time.time(),
                            "error": "training stopped at step 6: the weights hold NaN or Inf"}) + "\\n")
        f.write(json.dumps({"kind": "event", "step": 4, "event": "checkpoint"}) + "\\n")
    sys.exit(1)
    """
)


def test_a_run_that_stopped_itself_is_not_restarted(tmp_path, capsys):
    log = tmp_path / "restarts.jsonl"
    child = [sys.executable, "-c", STOPPING_CHILD, str(tmp_path / "train")]
    outcome = supervise(child, tmp_path / "train" / "checkpoints", log, 3, sleep=lambda s: None)
    assert outcome.exit_code == STOPPED_EXIT_CODE and outcome.exit_codes == [1]
    err = capsys.readouterr().err
    assert "not restarting: the run stopped itself at step 6 (nonfinite_weights; the message above" in err
    assert [e["event"] for e in events(log)] == ["launch", "exit", "deterministic_stop", "stopped"]
    assert events(log)[2] == {**events(log)[2], "step": 6, "reason": "nonfinite_weights"}


def test_an_earlier_runs_stop_does_not_stop_restarts(tmp_path):
    train = tmp_path / "train"
    train.mkdir()
    old_end = {"event": "end", "status": "failed", "deterministic": True, "time": time.time() - 3600}
    (train / "metrics.jsonl").write_text(json.dumps(old_end) + "\n")
    log = tmp_path / "restarts.jsonl"
    crash = [sys.executable, "-c", "raise SystemExit(1)"]  # dies before writing anything
    outcome = supervise(crash, train / "checkpoints", log, 1, backoff_base_s=0, sleep=lambda s: None)
    assert outcome.exit_code == 1 and outcome.exit_codes == [1, 1]


def test_sigterm_is_forwarded_to_the_child_and_stops_restarts(tmp_path, capsys):
    ready = tmp_path / "ready"
    child = f"import pathlib, time; pathlib.Path({str(ready)!r}).write_text('1'); time.sleep(120)"

    def terminate_supervisor():
        while not ready.exists():
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # as a scheduler preempting the job would

    threading.Thread(target=terminate_supervisor, daemon=True).start()
    log = tmp_path / "restarts.jsonl"
    outcome = supervise([sys.executable, "-c", child], tmp_path / "none", log, 5)
    assert outcome.exit_code == 128 + signal.SIGTERM
    assert outcome.exit_codes == [-signal.SIGTERM]  # the child got the signal too
    assert events(log)[-1]["event"] == "stopped"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the handler is put back


def test_restart_command_differs_from_the_first():
    # The first attempt may carry --force; restarts never do, so they continue instead of starting over.
    parser = build_parser()
    args = parser.parse_args(
        ["train", "cfg.toml", "--set", "train.lr=1e-3", "--force", "--max-restarts", "2"]
    )
    first = child_command(args.config, args.overrides, first=True, force=args.force)
    again = child_command(args.config, args.overrides, first=False, force=args.force)
    assert first[1:] == ["-m", "smelt.cli", "train", "cfg.toml", "--set", "train.lr=1e-3", "--force"]
    assert "--force" not in again and "--max-restarts" not in again and "--max-restarts" not in first


def test_backoff_and_exit_descriptions():
    assert [backoff_s(k, 5.0) for k in (1, 2, 3, 8)] == [5.0, 10.0, 20.0, 300.0]
    assert backoff_s(4, 0.0) == 0.0
    assert "SIGKILL" in describe_exit(-signal.SIGKILL) and "SIGKILL" in describe_exit(137)
    assert "watchdog" in describe_exit(124)
    with pytest.raises(UserError, match="--max-restarts"):
        supervise(["true"], Path("."), Path("x"), -1)


@pytest.mark.slow
def test_cli_supervised_train_without_inputs_stops_on_bad_input(tmp_path, capsys):
    # End to end through `smelt train`: the child is the real CLI, which has no tokens to train on.
    config = tmp_path / "pipeline.toml"
    config.write_text(f"[run]\ndir = '{tmp_path / 'runs'}'\n")
    code = main(["train", str(config), "--max-restarts", "3", "--restart-backoff", "0"])
    assert code == 2
    assert "not restarting" in capsys.readouterr().err
    (log,) = (tmp_path / "runs").glob("*/restarts.jsonl")
    assert [e["event"] for e in events(log)] == ["launch", "exit", "stopped"]
    assert events(log)[1]["exit_code"] == 2


def _train_children(config: Path) -> list[int]:
    """Pids of running `smelt train CONFIG` processes (the supervisor's children)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"smelt.cli" in argv and b"train" in argv and str(config).encode() in argv:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="finds the child through /proc")
def test_smelt_run_with_max_restarts_survives_a_killed_training_child(tmp_path):
    import subprocess

    from smelt.cli import QUICKSTART_CONFIG

    from ..test_pipeline_e2e import TINY

    config = tmp_path / "pipeline.toml"
    config.write_text(Path(QUICKSTART_CONFIG).read_text())
    settings = [*TINY, "train.tokens=81920", "checkpoint.every_steps=4", f"run.dir='{tmp_path / 'runs'}'"]
    argv = [sys.executable, "-m", "smelt.cli", "run", str(config), "--max-restarts", "2"]
    argv += ["--restart-backoff", "0", *[arg for s in settings for arg in ("--set", s)]]
    env = {**os.environ, "SMELT_QUIET": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 600
    killed = None
    while killed is None and run.poll() is None and time.monotonic() < deadline:
        committed = list((tmp_path / "runs").glob("*/train/checkpoints/step_*/COMMITTED"))
        children = _train_children(config)
        if committed and children:
            killed = children[0]
            os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    out, err = run.communicate(timeout=900)
    assert killed is not None, err[-3000:]
    assert run.returncode == 0, err[-3000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    log = events(run_dir / "restarts.jsonl")
    assert [e["event"] for e in log] == ["launch", "exit", "restart", "launch", "exit", "done"]
    assert "SIGKILL" in log[1]["reason"] and log[3]["resume_step"] >= 4
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["train_tokens"] == 81920 and 0 < summary["val_bits_per_byte"] < 8
    assert (run_dir / "eval" / "manifest.json").is_file() and "report" in out
