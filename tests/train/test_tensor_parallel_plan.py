"""`smelt plan memory` recommends a layout as `[train]` keys, and `smelt train --check` accepts them."""

import dataclasses
import json

import pytest
import tomllib

from helpers import VOCAB
from smelt.config import config_from_dict
from smelt.errors import ConfigError
from smelt.plan.layout_keys import train_keys, train_keys_toml
from smelt.plan.memory import Cluster, Layout, ModelShape, memory, recommend
from smelt.train.check import pilot_checks

from .test_trainer import data, tiny_config  # noqa: F401 - the data fixture


def tensor_parallel_recommendation(monkeypatch):
    """The tiny model on 4 GPUs, 2 per node, with just too little memory for data parallelism alone."""
    # The width rule (>= 1,024 hidden columns per TP rank) would never split a d_model of 64.
    monkeypatch.setattr("smelt.plan.memory.MIN_HIDDEN_PER_TP", 32)
    cfg = tiny_config()
    shape = ModelShape.from_config(cfg.model, VOCAB, "tiny")
    base = Layout(zero=1, seq_len=cfg.train.seq_len, micro_batch=1, precision="fp32")
    whole = memory(shape, dataclasses.replace(base, dp=4), overhead_gb=0.0).peak.total
    split = memory(shape, dataclasses.replace(base, tp=2, dp=2), overhead_gb=0.0).peak.total
    assert split < whole
    cluster = Cluster(gpus=4, gpus_per_node=2, memory_gb=(split + whole) / 2 / 1e9)
    return recommend(
        shape, cluster, seq_len=cfg.train.seq_len, global_batch_tokens=256, precision="fp32",
        headroom=0.0, overhead_gb=0.0, max_micro_batch=4,
    )  # fmt: skip


@pytest.mark.slow
def test_a_recommended_tensor_parallel_layout_passes_train_check(data, monkeypatch):  # noqa: F811
    tokens, tokenizer = data
    rec = tensor_parallel_recommendation(monkeypatch)
    assert (rec.layout.tp, rec.layout.pp, rec.layout.dp) == (2, 1, 2)
    keys = tomllib.loads(train_keys_toml(rec.layout, 256))["train"]
    assert keys == train_keys(rec.layout, 256)[0]
    assert keys["tensor_parallel"] == 2 and keys["data_parallel"] == 2 and keys["parallel"] == "fsdp"
    raw = tiny_config().to_dict()
    raw["train"].update(keys)
    monkeypatch.setattr("smelt.train.check.OVERFIT_LR", 3e-3)  # a tiny model overfits faster
    rows = pilot_checks(config_from_dict(raw), tokens, tokenizer)
    assert rows[0] == ("parallel layout", True, "dp_replicate 1 x dp_shard 2 x tp 2 = 4 processes")
    assert all(passed for _, passed, _ in rows), rows


def test_train_check_rejects_a_layout_the_model_cannot_take(data):  # noqa: F811
    tokens, tokenizer = data
    raw = tiny_config().to_dict()
    raw["train"].update({"tensor_parallel": 8, "data_parallel": 1})  # 4 query heads, 2 key/value heads
    with pytest.raises(ConfigError, match=r"train.tensor_parallel = 8 cannot be used: model.n_heads \(4\)"):
        pilot_checks(config_from_dict(raw), tokens, tokenizer)
    raw["train"].update({"tensor_parallel": 2, "data_parallel": 3})  # 256 tokens do not split over 3
    with pytest.raises(ConfigError, match="train.batch_tokens"):
        pilot_checks(config_from_dict(raw), tokens, tokenizer)


def test_pipeline_stages_are_emitted_as_keys():
    layout = Layout(tp=2, pp=2, dp=4, zero=1, seq_len=32, micro_batch=2, microbatches=8)
    keys, not_built = train_keys(layout, 32 * 2 * 8 * 4)
    assert keys == {"parallel": "fsdp", "data_parallel": 4, "tensor_parallel": 2, "pipeline_parallel": 2,
                    "seq_len": 32, "micro_batch": 2, "batch_tokens": 2048}  # fmt: skip
    assert not_built == []
    assert "\npipeline_parallel = 2\n" in train_keys_toml(layout, 2048)


def test_plan_memory_prints_and_writes_the_keys(tmp_path, capsys):
    from smelt.cli import main

    argv = [
        "plan",
        "memory",
        "--preset",
        "llama-7b",
        "--gpus",
        "16",
        "--gpus-per-node",
        "8",
        "--gpu-memory",
        "24",
    ]
    assert main([*argv, "--json", str(tmp_path / "plan.json")]) == 0
    out = capsys.readouterr().out
    toml = out.split("checks them):\n", 1)[1].split("\n\n", 1)[0]
    keys = tomllib.loads(toml)["train"]
    assert keys == {"parallel": "fsdp", "data_parallel": 2, "tensor_parallel": 4, "pipeline_parallel": 2,
                    "seq_len": 4096, "micro_batch": 2, "batch_tokens": 4194304}  # fmt: skip
    assert "not built" not in out
    written = json.loads((tmp_path / "plan.json").read_text())
    assert written["train_keys"] == keys and written["not_built"] == []
