"""DDP and FSDP2 on 2 CPU processes (gloo) make the same updates as one process, step for step, and
their checkpoints reshard: 2 -> 1 and 1 -> 2 processes, DDP <-> FSDP2, optimizer state included."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from smelt.config import config_from_dict
from smelt.train.parallel.distributed import rank_seed
from smelt.train.trainer import train

from .test_trainer import data, read_metrics  # noqa: F401 - the data fixture

WORKER = Path(__file__).with_name("dist_worker.py")
STEPS = 20


def raw_config(parallel: str) -> dict:
    return {
        "run": {"seed": 3},
        "model": {"d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64},
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
            "parallel": parallel,
        },
        "checkpoint": {"every_steps": 10, "keep_last": 1},
    }  # fmt: skip


def run_two_processes(
    raw: dict, tokens: Path, tokenizer: Path, out: Path, resume: Path | None = None
) -> list[dict]:
    out.mkdir(parents=True)
    config = out / "config.json"
    config.write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(config), str(tokens),
         str(tokenizer), str(out), *([str(resume)] if resume else [])],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return read_metrics(out)


def losses(lines: list[dict]) -> list[tuple[int, float, float]]:
    return [(r["step"], r["loss"], r["grad_norm"]) for r in lines if r["kind"] == "train"]


@pytest.fixture
def single(data, tmp_path, monkeypatch):  # noqa: F811 - pytest fixture injection
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")
    tokens, tokenizer = data
    train(config_from_dict(raw_config("ddp")), tokens, tokenizer, tmp_path / "single")
    return losses(read_metrics(tmp_path / "single"))


@pytest.mark.slow  # two training processes (gloo)
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_processes_match_one(single, data, tmp_path, parallel):  # noqa: F811
    tokens, tokenizer = data
    lines = run_two_processes(raw_config(parallel), tokens, tokenizer, tmp_path / parallel)
    start = next(r for r in lines if r.get("event") == "start")
    assert start["world_size"] == 2 and start["parallel"] == parallel and start["grad_accum"] == 1
    two = losses(lines)
    assert len(two) == len(single) == STEPS
    for (step_a, loss_a, norm_a), (step_b, loss_b, norm_b) in zip(single, two, strict=True):
        assert step_a == step_b
        assert abs(loss_a - loss_b) < 1e-5, (step_a, loss_a, loss_b)
        assert abs(norm_a - norm_b) < 1e-4 * max(1.0, norm_a), (step_a, norm_a, norm_b)
    assert single[-1][1] < single[0][1] - 0.5  # it trained: equal because the updates are, not trivially
    summary = json.loads((tmp_path / parallel / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["checkpoint"].endswith("step_0000020")
    middle = tmp_path / parallel / "checkpoints" / "step_0000010"
    assert len(list(middle.glob("*.distcp"))) == 2  # each rank wrote its own file
    assert json.loads((middle / "meta.json").read_text())["world_size"] == 2

    # 2 -> 1 process: the rest of the run matches the uninterrupted single-process run.
    one = tmp_path / f"{parallel}-to-1"
    train(config_from_dict(raw_config("ddp")), tokens, tokenizer, one, resume=middle)
    assert_same_tail(single, losses(read_metrics(one)))
    # 2 -> 2 with the other strategy: DDP <-> FSDP2.
    other = "ddp" if parallel == "fsdp" else "fsdp"
    assert_same_tail(single, losses(run_two_processes(raw_config(other), tokens, tokenizer,
                                                      tmp_path / f"{parallel}-to-{other}", resume=middle)))  # fmt: skip


def assert_same_tail(reference: list, resumed: list) -> None:
    assert [step for step, _, _ in resumed] == list(range(11, STEPS + 1))
    for (step_a, loss_a, norm_a), (step_b, loss_b, norm_b) in zip(reference[10:], resumed, strict=True):
        assert step_a == step_b
        assert abs(loss_a - loss_b) < 1e-5, (step_a, loss_a, loss_b)
        assert abs(norm_a - norm_b) < 1e-4 * max(1.0, norm_a), (step_a, norm_a, norm_b)


@pytest.mark.slow  # two training processes (gloo)
def test_one_process_checkpoint_loads_into_two(single, data, tmp_path):  # noqa: F811
    tokens, tokenizer = data
    middle = tmp_path / "single" / "checkpoints" / "step_0000010"
    lines = run_two_processes(raw_config("fsdp"), tokens, tokenizer, tmp_path / "1-to-2", resume=middle)
    resumed = next(r for r in lines if r.get("event") == "resume")
    assert resumed["world_size"] == 2 and resumed["world_size_changed"]
    assert_same_tail(single, losses(lines))


def test_rank_seeds_differ_across_ranks_and_are_stable():
    seeds = [rank_seed(3, rank, "train") for rank in range(8)]
    assert len(set(seeds)) == 8
    assert seeds == [rank_seed(3, rank, "train") for rank in range(8)]
    assert rank_seed(3, 0, "train") != rank_seed(4, 0, "train") != rank_seed(3, 0, "dropout")
