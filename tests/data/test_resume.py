"""A curate run killed with SIGKILL resumes at its unfinished work shards and ends byte-identical."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TOML = """
[run]
name = "{name}"
dir = "{runs}"

[data]
min_chars = 1
val_fraction = 0.2
workers = 1
shard_bytes = 1000

[[data.sources]]
name = "notes"
format = "text"
root = "{root}"
include = ["**/*.txt"]
filters = []
"""


def _corpus(root: Path, n: int) -> None:
    for i in range(n):
        path = root / f"d{i // 100}" / f"{i:04d}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        words = " ".join(f"w{(i * 7 + j) % 997}" for j in range(150))
        path.write_text(f"Note {i % 350}.\n\n{words}\n")


def _start(config: Path) -> subprocess.Popen:
    env = {**os.environ, "SMELT_QUIET": "1"}
    return subprocess.Popen([sys.executable, "-m", "smelt.cli", "curate", str(config)], env=env)


def _files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != "manifest.json"
    }


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_is_byte_identical(tmp_path):
    root = tmp_path / "raw"
    _corpus(root, 400)
    runs = tmp_path / "runs"
    configs = {}
    for name in ("killed", "clean"):
        configs[name] = tmp_path / f"{name}.toml"
        configs[name].write_text(TOML.format(name=name, runs=runs, root=root))

    proc = _start(configs["killed"])
    map_dir = runs / "killed" / "documents" / "_work" / "map"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if map_dir.is_dir() and len(list(map_dir.glob("*.done"))) >= 20:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    done_at_kill = len(list(map_dir.glob("*.done")))
    assert 20 <= done_at_kill < 400
    assert not (runs / "killed" / "documents" / "stats.json").exists()

    assert _start(configs["killed"]).wait() == 0
    assert _start(configs["clean"]).wait() == 0
    killed = _files(runs / "killed" / "documents")
    clean = _files(runs / "clean" / "documents")
    assert not any(k.startswith("_work") for k in killed)
    assert killed.keys() == clean.keys() and any(k.startswith("train/notes/") for k in killed)
    assert all(killed[k] == clean[k] for k in killed)
