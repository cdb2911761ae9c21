"""The watchdog turns a hang into a crash with every thread's stack, in a real subprocess."""

import subprocess
import sys
import textwrap

import pytest

from smelt.train.ops.watchdog import WATCHDOG_EXIT_CODE, Watchdog, format_all_stacks

PRELUDE = """
import re, sys, threading, time
from pathlib import Path
from smelt.train.ops.watchdog import Watchdog

def loader_worker_loop():
    time.sleep(600)

threading.Thread(target=loader_worker_loop, name="loader-worker", daemon=True).start()
"""


def run_child(body: str, *args: str) -> subprocess.CompletedProcess:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.slow
def test_hang_is_killed_with_all_stacks_in_stderr_and_log(tmp_path):
    log = tmp_path / "train" / "watchdog.log"
    result = run_child(
        """
        wd = Watchdog(0.5, Path(sys.argv[1]), poll_s=0.05).start()
        for step in range(1, 4):
            time.sleep(0.01)
            wd.beat(step)

        def stuck_in_training_step():
            time.sleep(600)

        stuck_in_training_step()
        """,
        str(log),
    )
    assert result.returncode == WATCHDOG_EXIT_CODE, result.stderr
    text = log.read_text()
    for output in (result.stderr, text):
        assert "watchdog: no training progress" in output
        assert "last finished step 3" in output
        assert 'Thread "loader-worker"' in output and "loader_worker_loop" in output
        assert 'Thread "MainThread"' in output and "stuck_in_training_step" in output
        assert "faulthandler" in output and "Thread 0x" in output  # the C-level dump too


@pytest.mark.slow
def test_beats_keep_it_alive_and_stop_disarms_the_backstop():
    result = run_child(
        """
        wd = Watchdog(0.4, None, poll_s=0.02, backstop_grace_s=0.2).start()
        for step in range(30):
            time.sleep(0.01)
            wd.beat(step)
        wd.stop()
        time.sleep(1.5)  # past timeout + grace: neither layer may fire once stopped
        print("finished")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "finished"
    assert "watchdog" not in result.stderr


@pytest.mark.slow
def test_hang_holding_the_gil_is_caught_by_the_backstop():
    # Catastrophic regex backtracking runs in C without releasing the GIL, so the Python
    # watchdog thread starves; faulthandler's C timer must still dump and end the process.
    result = run_child(
        """
        wd = Watchdog(0.3, None, poll_s=0.02, backstop_grace_s=0.5).start()
        wd.beat(1)
        time.sleep(0.1)  # let the thread arm the backstop
        re.match(r"(a+)+$", "a" * 64 + "b")
        """
    )
    assert result.returncode != 0
    assert "Timeout" in result.stderr and "Thread 0x" in result.stderr
    assert "<string>" in result.stderr  # the main thread's frame, inside the regex call


def test_disabled_watchdog_starts_no_thread():
    wd = Watchdog(0)
    assert not wd.enabled
    with wd:
        wd.beat(1)
        assert wd._thread is None


def test_format_all_stacks_names_threads():
    text = format_all_stacks()
    assert 'Thread "MainThread"' in text
    assert "test_format_all_stacks_names_threads" in text
