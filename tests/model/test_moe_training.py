"""An MoE model through the trainer: balancing losses optimized, router figures in metrics.jsonl,
TensorBoard scalars and the report's Experts section, the aux-loss-free bias updated per step."""

import json

import pytest
import torch

from helpers import write_token_data
from smelt.checkpoint import latest_checkpoint, load_model
from smelt.config import config_from_dict
from smelt.model.moe import MoE
from smelt.report.single import write_run_report
from smelt.train.sinks import scalars
from smelt.train.trainer import train


@pytest.fixture(autouse=True)
def fixed_peak(monkeypatch):
    monkeypatch.setenv("SMELT_PEAK_FLOPS", "1e12")


def moe_config(**model):
    raw = {
        "run": {"seed": 3},
        "model": {
            "d_model": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64,
            "moe_experts": 4, "moe_top_k": 2, "moe_d_ff": 32, **model,
        },
        "train": {
            "seq_len": 32, "micro_batch": 4, "batch_tokens": 256, "tokens": 256 * 8, "lr": 3e-3,
            "log_every": 4, "eval_every": 0, "eval_tokens": 512, "eval_budget": 0.0, "precision": "fp32",
        },
        "checkpoint": {"every_steps": 8, "keep_last": 1},
    }  # fmt: skip
    return config_from_dict(raw)


@pytest.mark.slow
def test_router_figures_reach_metrics_tensorboard_and_the_report(tmp_path):
    tokens, tokenizer = write_token_data(tmp_path)
    out = tmp_path / "run"
    train(moe_config(moe_first_dense=1), tokens, tokenizer, out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    moe = [r for r in records if r["kind"] == "moe"]
    assert [r["step"] for r in moe] == [1, 4, 8]
    first = moe[0]
    assert first["moe_layers"] == [1]
    assert len(first["moe_load"][0]) == 4 and abs(sum(first["moe_load"][0]) - 1) < 1e-3
    assert first["moe_max_mean"][0] >= 1.0 and first["moe_dropped"] == [0]
    # Step 1 saw one batch of 256 tokens; the entropy of a 4-way router is at most ln 4.
    assert 0 < first["moe_entropy"][0] <= 1.3863
    assert ("moe/max_mean/layer_1", first["moe_max_mean"][0]) in scalars(first)

    html = write_run_report(out.parent if (out.parent / "metrics.jsonl").exists() else out).read_text()
    section = html.split('<section id="experts">')[1].split("</section>")[0]
    assert "share of token copies per expert, whole run" in section
    assert section.count("<rect") >= 2 * 4  # two heat maps of 1 layer x 4 experts
    assert "layer 1, expert 3:" in section


@pytest.mark.slow
def test_aux_loss_free_bias_is_updated_and_checkpointed(tmp_path):
    tokens, tokenizer = write_token_data(tmp_path)
    out = tmp_path / "run"
    train(moe_config(moe_aux_loss=0.0, moe_bias_rate=0.01), tokens, tokenizer, out)
    model, _ = load_model(latest_checkpoint(out / "checkpoints"))
    biases = [b.mlp.expert_bias for b in model.blocks if isinstance(b.mlp, MoE)]
    assert len(biases) == 2
    # 8 updates of +-0.01 each (0 for an expert at exactly the mean): multiples of the rate, not all 0.
    for bias in biases:
        steps = bias / 0.01
        assert torch.allclose(steps, steps.round(), atol=1e-4) and steps.abs().max() <= 8
    assert any(bias.abs().max() > 0 for bias in biases)
