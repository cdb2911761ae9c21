"""Ranks die with their launcher. torchrun starts its ranks in sessions of their own, so a SIGKILL of
torchrun never reached them: one trained on to the end, and rank 0 held the run's lock, which refused
the next launch. Now the kernel ends them (PR_SET_PDEATHSIG) and the relaunch resumes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from smelt.cli import main

from .test_rank_output import write_pipeline


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(condition, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def train_steps(metrics: Path) -> list[int]:
    lines = metrics.read_text().splitlines() if metrics.is_file() else []
    return [r["step"] for r in map(json.loads, lines) if r.get("kind") == "train"]


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds processes through /proc")


@pytest.mark.slow  # a child and a grandchild process
def test_a_launched_process_dies_with_its_parent():
    # The parent starts a child as smelt's supervisor does (SMELT_ATTEMPT set), then waits forever.
    child_code = textwrap.dedent(
        """
        import time
        from smelt.train.ops.watchdog import die_with_parent, launched
        assert launched()
        die_with_parent()
        print("armed", flush=True)
        time.sleep(120)
        """
    )
    parent_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        env = {{**os.environ, "SMELT_ATTEMPT": "1"}}
        child = subprocess.Popen([sys.executable, "-c", {child_code!r}], env=env, start_new_session=True)
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline() == "armed\n"  # the child shares the parent's stdout
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not alive(child), 10), "the child outlived its parent's SIGKILL"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


@pytest.mark.slow  # the data stages, then two 2-process torchrun launches (gloo)
def test_sigkill_on_torchrun_ends_its_ranks_and_the_relaunch_resumes(tmp_path):
    config = write_pipeline(tmp_path)
    for words in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        assert main([*words, str(config)]) == 0
    launcher = Path(sys.executable).with_name("torchrun")
    command = [str(launcher), "--standalone", "--nproc-per-node", "2", "-m", "smelt.cli", "train", str(config),
               "--set", "train.tokens=51200", "--set", "tokens.allow_repeat=true",
               "--set", "checkpoint.every_steps=2"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1"}
    metrics = tmp_path / "runs" / "ranks" / "train" / "metrics.jsonl"
    with open(tmp_path / "first.log", "w") as log:
        run = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    ranks: list[int] = []
    try:
        committed = tmp_path / "runs" / "ranks" / "train" / "checkpoints"
        assert wait_until(lambda: any(committed.glob("step_*/COMMITTED")) or run.poll() is not None, 300)
        ranks = children(run.pid)
        assert len(ranks) == 2 and run.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        run.kill()  # SIGKILL to torchrun alone
        run.wait()
        gone = wait_until(lambda: not any(alive(pid) for pid in ranks), 5)
        assert gone and train_steps(metrics)[-1] < 400, "the ranks outlived torchrun"
    finally:
        for pid in ranks:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    # The lock went with rank 0: the same command resumes and finishes.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["step"] >= 2 and train_steps(metrics) == list(range(1, 401))
