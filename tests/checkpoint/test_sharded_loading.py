"""A fork (`--from`, weights only) and a resume (weights and optimizer) under 2-rank FSDP2 read the
checkpoint from DCP into the sharded model: each rank holds its shards and what DCP reads in flight,
never the whole model. The checkpoint is written by one process (one chunk per tensor), so every rank
reads a slice of each saved tensor; the loaded weights and Adam moments are the saved ones exactly."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from smelt.checkpoint import save_checkpoint
from smelt.config import config_from_dict
from smelt.model.transformer import Transformer
from smelt.train.optim import build_optimizer

WORKER = Path(__file__).with_name("sharded_load_worker.py")
VOCAB = 2048
RAW = {
    "run": {"seed": 5}, "vocab": VOCAB,
    # 13.9M parameters (55.6 MB of fp32 weights); the largest tensor (the embedding) is 4.2 MB
    "model": {"d_model": 512, "n_layers": 4, "n_heads": 8, "n_kv_heads": 4, "max_seq_len": 64,
              "tie_embeddings": False},
    "train": {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 2560, "threads": 1,
              "parallel": "fsdp", "precision": "fp32"},
}  # fmt: skip


def trained_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor], float]:
    """One process's model after one AdamW step, saved as RUN/train/checkpoints/step_0000003."""
    raw = {k: v for k, v in RAW.items() if k != "vocab"}
    cfg = config_from_dict(raw)
    torch.manual_seed(9)  # another seed than the run's: loaded weights differ from the init's
    model = Transformer(cfg.model, VOCAB)
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    x = torch.randint(0, VOCAB, (2, 32))
    model(x, x)[1].backward()
    optimizer.step()
    meta = {"model_config": cfg.model, "vocab_size": VOCAB, "tokens": 768}
    path = save_checkpoint(tmp_path / "run" / "train" / "checkpoints", 3, model, optimizer, meta)
    moments = sum(
        float(s[k].double().pow(2).sum()) for s in optimizer.state.values() for k in ("exp_avg", "exp_avg_sq")
    )
    return path, {n: p.detach().clone() for n, p in model.named_parameters()}, moments


def load_under_torchrun(tmp_path: Path, checkpoint: Path, train: dict) -> dict:
    config, out = tmp_path / "config.json", tmp_path / "loaded.pt"
    config.write_text(json.dumps({**RAW, "train": {**RAW["train"], **train}}))
    torchrun = Path(sys.executable).with_name("torchrun")
    # The resident size follows the live tensors: every block of 128 kB or more is its own mapping.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "MALLOC_MMAP_THRESHOLD_": "131072"}
    command = [str(torchrun), "--standalone", "--nproc_per_node", "2", str(WORKER), str(config), str(checkpoint),
               str(out)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "train", [{"parallel": "fsdp"}, {"parallel": "ddp", "tensor_parallel": 2}], ids=["fsdp2", "tp2"]
)
def test_fork_and_resume_load_shards_not_the_whole_model(tmp_path, train):
    checkpoint, saved, moments = trained_checkpoint(tmp_path)
    got = load_under_torchrun(tmp_path, checkpoint, train)
    assert got["built"] == "sharded"
    for load in ("fork", "resume"):
        assert set(got["params"][load]) == set(saved)
        for name, value in saved.items():
            assert torch.equal(got["params"][load][name], value), (load, name)
    assert got["moments"] == pytest.approx(moments, rel=1e-9)
    weights_kb = sum(p.numel() * 4 for p in saved.values()) / 1024
    growth = {
        load: max(r[f"peak_{load}"] - r[f"before_{load}"] for r in got["rss_kb"]) / weights_kb
        for load in ("fork", "resume")
    }
    # Into weights already sharded, a fork adds what DCP reads in flight: a tensor or two, not the model
    # (a whole copy would be 1.0 of the weights).
    assert growth["fork"] < 0.25, growth
    # A resume also makes the Adam moments, each rank its half (2 x 0.5 of the weights' bytes), through one
    # optimizer step on zero gradients (torch's get_state_dict initialising the state: 0.5 more while it
    # runs), plus what is in flight; a whole copy of weights and moments would add 3.0.
    assert 0.9 < growth["resume"] < 1.75, growth
