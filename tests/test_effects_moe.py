"""The signs of bench/effects_moe.py's MoE, at test size, trained as the effect trains it (Muon for the
matrices in the blocks, the experts' included, AdamW for the rest; WSD): the MoE balanced as the effect
balances it (the aux-loss-free bias and the auxiliary loss together) ends with a lower worst-layer
max/mean expert load than the same MoE trained without any balancing, on the same tokens from the same
seed, and the bias alone balances too."""

from __future__ import annotations

import json

import pytest
from tests.model.test_moe_training import fixed_peak, moe_config  # noqa: F401 (fixed_peak: autouse fixture)

from helpers import write_token_data
from smelt.train.trainer import train

pytestmark = pytest.mark.slow


def worst_final_load(tmp_path, name: str, **balancing) -> float:
    """Train a 2-layer MoE of 8 experts (top-2) for 60 steps; the worst layer's max/mean load over the
    last 10 steps."""
    tokens = tmp_path / "data" / "tokens"
    if not tokens.is_dir():
        (tmp_path / "data").mkdir()
        write_token_data(tmp_path / "data")
    cfg = moe_config(moe_experts=8, moe_top_k=2, moe_d_ff=32, **balancing)
    # 60 steps of 256 tokens at the effect's optimizer and schedule, where an unbalanced router
    # concentrates its load.
    cfg.train.tokens, cfg.train.log_every, cfg.train.spike_triage = 256 * 60, 10, "off"
    cfg.train.optimizer, cfg.train.muon_lr, cfg.train.lr = "muon", 0.02, 3e-3
    cfg.train.warmup_tokens, cfg.train.schedule, cfg.train.decay_fraction = 256 * 5, "wsd", 0.5
    cfg.checkpoint.every_steps = 0
    out = tmp_path / name
    train(cfg, tokens, tmp_path / "data" / "tokenizer", out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (last,) = [r for r in records if r["kind"] == "moe"][-1:]
    assert last["step"] == 60
    return max(last["moe_max_mean"])


def test_balancing_lowers_the_worst_expert_load(tmp_path):
    none = worst_final_load(tmp_path, "none", moe_aux_loss=0.0, moe_z_loss=0.0, moe_bias_rate=0.0)
    both = worst_final_load(tmp_path, "both", moe_aux_loss=0.01, moe_z_loss=0.001, moe_bias_rate=0.01)
    bias = worst_final_load(tmp_path, "bias", moe_aux_loss=0.0, moe_z_loss=0.0, moe_bias_rate=0.01)
    assert both < none and bias < none, (none, both, bias)
