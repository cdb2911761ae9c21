"""Two "nodes" on this machine: two torchrun agents, each with one process, meet over a c10d rendezvous
on 127.0.0.1 with the options `smelt launch` emits, and train exactly as 2 processes on one node do."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from smelt.train.ops.launch import Cluster, torchrun_args

from .test_distributed import losses, raw_config, run_two_processes
from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

WORKER = Path(__file__).with_name("dist_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_two_nodes(raw: dict, tokens: Path, tokenizer: Path, out: Path) -> list[dict]:
    out.mkdir(parents=True)
    config = out / "config.json"
    config.write_text(json.dumps(raw))
    launch = torchrun_args(Cluster(nodes=2, gpus_per_node=1), f"127.0.0.1:{free_port()}", "two-nodes-test")
    launch[0] = str(Path(sys.executable).with_name("torchrun"))
    command = [*launch, str(WORKER), str(config), str(tokens), str(tokenizer), str(out)]
    # gloo connects to the address the hostname resolves to unless told the interface: loopback here.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12",
           "GLOO_SOCKET_IFNAME": "lo"}  # fmt: skip
    logs = [out / f"node{i}.log" for i in range(2)]
    agents = []
    for log in logs:
        with log.open("w") as sink:  # a file, not a pipe: neither agent may block on a full one
            agents.append(subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT))
    for agent, log in zip(agents, logs, strict=True):
        agent.wait(timeout=300)
        assert agent.returncode == 0, log.read_text()[-3000:]
    return read_metrics(out)


@pytest.mark.slow  # two torchrun agents and a 2-process reference run (gloo)
def test_two_nodes_train_like_two_processes_on_one(data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    raw = raw_config("ddp")
    raw["train"]["tokens"] = 256 * 5  # 5 steps
    one_node = run_two_processes(raw, tokens, tokenizer, tmp_path / "one-node")
    two_nodes = run_two_nodes(raw, tokens, tokenizer, tmp_path / "two-nodes")
    start = next(r for r in two_nodes if r.get("event") == "start")
    assert start["world_size"] == 2
    reference = losses(one_node)
    assert [step for step, _, _ in reference] == [1, 2, 3, 4, 5]
    assert losses(two_nodes) == reference  # the same ranks, batches and reductions: bitwise the same
