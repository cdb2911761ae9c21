"""Sharded initialisation (train/materialize.py): under FSDP2, TP and PP every rank builds the model on
the meta device and initialises only its shards, and the weights are bitwise those of the one-process
init with the same seed."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from smelt.config import config_from_dict
from smelt.model.transformer import Transformer

WORKER = Path(__file__).with_name("sharded_init_worker.py")


def raw_config(**train) -> dict:
    return {
        "run": {"seed": 11},
        # 3 layers and a vocabulary of 384 over 2 ranks: blocks split unevenly across pipeline stages
        "model": {"d_model": 64, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64,
                  "tie_embeddings": train.pop("tie", True)},
        "train": {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 2560, "threads": 1, **train},
    }  # fmt: skip


def one_process_init(raw: dict) -> dict[str, torch.Tensor]:
    cfg = config_from_dict(raw)
    torch.manual_seed(cfg.run.seed)
    return dict(Transformer(cfg.model, 384).named_parameters())


def run_workers(nproc: int, raw: dict, tmp_path: Path, *args: str) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    config, out = tmp_path / "config.json", tmp_path / "init.pt"
    config.write_text(json.dumps(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1"}
    result = subprocess.run(
        [str(torchrun), "--standalone", "--nproc_per_node", str(nproc), str(WORKER), str(config), str(out), *args],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out)


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout",
    [
        {"parallel": "fsdp"},
        {"parallel": "fsdp", "tie": False},
        {"parallel": "fsdp", "tensor_parallel": 2, "tie": False},
        {"pipeline_parallel": 2, "tie": False},
    ],
    ids=["fsdp2", "fsdp2-untied", "tp2", "pp2"],
)
def test_sharded_init_equals_the_one_process_init(layout, tmp_path):
    raw = raw_config(**layout)
    got = run_workers(2, raw, tmp_path)
    assert got["built"] == "sharded"
    expected = one_process_init(raw)
    assert set(got["params"]) == set(expected)
    for name, value in expected.items():
        assert torch.equal(got["params"][name], value.detach()), name


@pytest.mark.slow
def test_a_sharded_build_holds_at_most_60_percent_of_a_whole_one(tmp_path):
    """2-rank FSDP2 of a model whose fp32 weights and Adam moments take 1.6 GB (132M parameters): the
    growth of each rank's peak host memory while building, sharded against every rank building the whole
    model first (what smelt did before)."""
    raw = {
        "run": {"seed": 1}, "vocab": 20480,
        "model": {"d_model": 1024, "n_layers": 8, "n_heads": 16, "n_kv_heads": 4, "max_seq_len": 64,
                  "tie_embeddings": False},
        "train": {"seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 2560, "threads": 1,
                  "parallel": "fsdp"},
    }  # fmt: skip
    growth = {}
    for mode in ("whole", "sharded"):
        got = run_workers(2, raw, tmp_path / mode, mode, "memory")
        assert got["built"] == mode
        growth[mode] = max(p - b for p, b in zip(got["rss_peak_kb"], got["rss_before_kb"], strict=True))
    weights_kb = 132e6 * 4 / 1024
    assert growth["whole"] > 0.9 * weights_kb  # the old way: the whole model on every rank
    assert growth["sharded"] <= 0.6 * growth["whole"], growth


@pytest.mark.parametrize("kind", ["trunc_normal", "linear_weight", "embedding_weight", "ones"])
@pytest.mark.parametrize("shape", [(7, 5), (33, 16), (100, 3), (37,)])
def test_drawing_in_row_blocks_draws_the_whole_tensors_values(kind, shape, monkeypatch):
    """A draw through small scratch blocks (what keeps a rank's memory to its shards) gives the values of
    one draw of the whole tensor, and leaves the generator where that draw leaves it; a rank's region
    (rows and columns of its shard) gets its part."""
    from smelt.model.init import InitStep
    from smelt.train import materialize

    if kind == "linear_weight" and len(shape) < 2:
        pytest.skip("nn.Linear's weight has two dimensions")
    step = InitStep("", "weight", kind, 0.02)
    torch.manual_seed(5)
    whole = torch.empty(shape)
    step.draw(whole)
    after_whole = torch.rand(4)
    for block_values in (16, 40, 1 << 22):
        monkeypatch.setattr(materialize, "BLOCK_VALUES", block_values)
        torch.manual_seed(5)
        rows = [(first, block) for first, block in materialize.row_blocks(step, shape)]
        assert torch.equal(torch.cat([b for _, b in rows]), whole)
        assert torch.equal(torch.rand(4), after_whole)
        offset = (2,) + (1,) * (len(shape) - 1)
        size = (min(4, shape[0] - 2),) + tuple(min(2, n - 1) for n in shape[1:])
        local = torch.zeros(size)
        for first, block in rows:
            materialize.write_rows(local, (offset, size), first, block)
        expected = whole[tuple(slice(o, o + n) for o, n in zip(offset, size, strict=True))]
        assert torch.equal(local, expected)
