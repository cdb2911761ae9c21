"""`torchrun --max-restarts` restarts a run with asynchronous checkpoints (the default) bit for bit.

torchrun keeps one key-value store for the whole launch, and the addresses a dead attempt's ranks
published there stay; a restarted rank read them and dialled a dead port (`Gloo connectFullMesh failed
... Connection refused`). Each attempt now works under a key prefix its ranks agree on first."""

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from smelt.train.parallel.distributed import attempt_name

from .test_distributed import losses, raw_config
from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

WORKER = Path(__file__).with_name("dist_worker.py")
STEPS = 30


def agree(port: int, world_size: int, order: list[int], pause_s: float = 0.0) -> dict[int, str]:
    """Run attempt_name for every rank, each on a thread with its own store client, started in `order`."""
    names: dict[int, str] = {}

    def rank(r: int) -> None:
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))
        names[r] = attempt_name(client, r, world_size, timeout_s=30)

    threads = [threading.Thread(target=rank, args=(r,)) for r in order]
    for thread in threads:
        thread.start()
        time.sleep(pause_s)
    for thread in threads:
        thread.join(60)
    return names


def test_every_attempt_gets_one_new_name_whatever_an_earlier_attempt_left():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=30))
    first = agree(server.port, 3, [0, 1, 2])
    assert len(set(first.values())) == 1
    # The next attempts find the keys of the first in the store. Rank 0 first: it sees the old
    # tokens before the new ranks write theirs. Rank 0 last: the others wait for it.
    for order in ([0, 1, 2], [2, 1, 0]):
        again = agree(server.port, 3, order, pause_s=0.2)
        assert len(again) == 3 and len(set(again.values())) == 1, again
        assert set(again.values()) != set(first.values())
        first = again
    assert list(agree(server.port, 1, [0]).values()) != list(first.values())  # one process: a name too


def rank_pid(out: Path, rank: int) -> int | None:
    """The pid of the worker process of `rank` that trains into `out`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(WORKER).encode() in argv and str(out).encode() in argv and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    return None


def launch(raw: dict, tokens: Path, tokenizer: Path, out: Path, *options: str) -> subprocess.Popen:
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    with open(out.parent / f"{out.name}.log", "w") as log:
        return subprocess.Popen(
            [str(torchrun), "--standalone", "--nproc_per_node", "2", *options, str(WORKER),
             str(out / "config.json"), str(tokens), str(tokenizer), str(out), "auto"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip


@pytest.mark.slow  # two 2-process torchrun launches (gloo), one of them restarted
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the rank through /proc")
def test_torchrun_restarts_an_async_checkpointing_fsdp_run_bit_for_bit(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    raw = raw_config("fsdp")
    raw["train"]["tokens"] = 256 * STEPS
    raw["checkpoint"] = {"every_steps": 3, "keep_last": 2}  # async_save: the default

    reference = launch(raw, tokens, tokenizer, tmp_path / "whole")
    assert reference.wait(timeout=600) == 0, (tmp_path / "whole.log").read_text()[-3000:]

    out = tmp_path / "restarted"
    run = launch(raw, tokens, tokenizer, out, "--max-restarts", "1")
    killed = None
    deadline = time.monotonic() + 600
    while killed is None and run.poll() is None and time.monotonic() < deadline:
        if len(list((out / "checkpoints").glob("step_*/COMMITTED"))) >= 2:
            killed = rank_pid(out, 1)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.02)
    code = run.wait(timeout=600)
    log = (tmp_path / "restarted.log").read_text()
    assert killed is not None, log[-3000:]
    assert code == 0, log[-3000:]
    assert "connectFullMesh" not in log
    records = read_metrics(out)
    resume = next(r for r in records if r.get("event") == "resume")
    assert resume["step"] >= 6 and resume["world_size"] == 2
    assert losses(records) == losses(read_metrics(tmp_path / "whole"))  # every step, bit for bit
