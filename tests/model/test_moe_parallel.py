"""Expert parallelism on 2 gloo processes (experts split, all-to-all dispatch, FSDP2 for the rest)
makes the same updates as one process; its checkpoint loads in one process; bad settings are named."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import write_token_data
from smelt.checkpoint import latest_checkpoint, load_model
from smelt.config import config_from_dict
from smelt.errors import ConfigError, UserError
from smelt.model.moe_parallel import setup_expert_parallel
from smelt.model.transformer import Transformer
from smelt.train.trainer import train

WORKER = Path(__file__).parents[1] / "train" / "dist_worker.py"
STEPS = 5


def raw_config(**train_keys) -> dict:
    return {
        "run": {"seed": 3},
        "model": {
            "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64,
            "moe_experts": 4, "moe_top_k": 2, "moe_d_ff": 32, "moe_bias_rate": 0.001,
        },
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * STEPS, "lr": 3e-3,
            "log_every": 1, "eval_every": 0, "eval_tokens": 512, "precision": "fp32", "threads": 1,
            **train_keys,
        },
        "checkpoint": {"every_steps": STEPS, "keep_last": 1},
    }  # fmt: skip


def records(out: Path, kind: str) -> list[dict]:
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in lines if r["kind"] == kind]


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


@pytest.mark.slow  # two training processes (gloo)
def test_two_expert_parallel_processes_match_one(tmp_path):
    tokens, tokenizer = write_token_data(tmp_path)
    single = tmp_path / "single"
    train(config_from_dict(raw_config()), tokens, tokenizer, single)

    two = tmp_path / "ep"
    two.mkdir()
    config = two / "config.json"
    config.write_text(json.dumps(raw_config(parallel="fsdp", expert_parallel=2)))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(config), str(tokens),
         str(tokenizer), str(two)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]

    a, b = records(single, "train"), records(two, "train")
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, STEPS + 1))
    for ra, rb in zip(a, b, strict=True):
        assert abs(ra["loss"] - rb["loss"]) < 1e-5, (ra["step"], ra["loss"], rb["loss"])
        assert abs(ra["grad_norm"] - rb["grad_norm"]) < 1e-5 * max(1.0, ra["grad_norm"])
    assert a[-1]["loss"] != a[0]["loss"]
    # The router figures are global sums over both processes, so they equal the single process's.
    for ma, mb in zip(records(single, "moe"), records(two, "moe"), strict=True):
        flat_a, flat_b = (sum(m["moe_load"], []) for m in (ma, mb))
        assert flat_a == pytest.approx(flat_b, abs=1e-4)

    # The expert shards were saved as one tensor per layer: one process loads the whole model.
    one, _ = load_model(latest_checkpoint(single / "checkpoints"))
    both, _ = load_model(latest_checkpoint(two / "checkpoints"))
    for (name, p), (_, q) in zip(one.state_dict().items(), both.state_dict().items(), strict=True):
        assert torch.allclose(p, q, atol=1e-5), name


def test_expert_parallel_settings_that_cannot_work_are_named():
    # When the config loads: what no launch could run.
    with pytest.raises(
        ConfigError, match=r"train.expert_parallel = 2 composes with FSDP2: set train.parallel = 'fsdp'"
    ):
        config_from_dict(raw_config(expert_parallel=2))
    with pytest.raises(
        ConfigError, match=r"model.moe_experts \(4\) must be a multiple of train.expert_parallel \(3\)"
    ):
        config_from_dict(raw_config(expert_parallel=3, parallel="fsdp"))
    dense = raw_config(expert_parallel=2, parallel="fsdp")
    dense["model"]["moe_experts"] = 0
    with pytest.raises(ConfigError, match=r"needs experts to split, but model.moe_experts = 0"):
        config_from_dict(dense)
    # When training starts: the launch itself.
    cfg = config_from_dict(raw_config(expert_parallel=2, parallel="fsdp"))
    model = Transformer(cfg.model, 384)
    with pytest.raises(UserError, match=r"it must equal the number of processes \(1\); launch with torchrun"):
        setup_expert_parallel(model, cfg, 1, torch.device("cpu"))
