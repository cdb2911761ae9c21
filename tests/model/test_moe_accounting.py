"""Total vs active parameters and FLOPs of MoE shapes; the published presets' counts."""

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.model.flops import count_params, flops_per_token
from smelt.model.moe import MoE
from smelt.model.sizing import describe_preset, preset_config


@pytest.mark.parametrize(
    ("name", "vocab", "total", "active"),
    [
        # OLMoE-1B-7B (Muennighoff et al. 2024): 6.9B total, 1.3B active; Qwen3-30B-A3B: 30.5B, 3.3B.
        ("olmoe-1b-7b", 50_304, 6.92e9, 1.28e9),
        ("qwen3-30b-a3b", 151_936, 30.5e9, 3.35e9),
    ],
)
def test_published_moe_presets_match_their_counts(name, vocab, total, active):
    counts = count_params(preset_config(name), vocab)
    assert counts["total"] == pytest.approx(total, rel=0.005)
    assert counts["active"] == pytest.approx(active, rel=0.01)
    with torch.device("meta"):
        from smelt.model.transformer import Transformer

        model = Transformer(preset_config(name), vocab)
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_active_params_count_the_top_k_experts_of_a_real_model():
    cfg = tiny_model_config(
        n_layers=3, moe_experts=4, moe_top_k=2, moe_d_ff=32, moe_first_dense=1, moe_shared_experts=1
    )
    model = build_model(cfg)
    counts = count_params(cfg, 384)
    assert counts["total"] == sum(p.numel() for p in model.parameters())
    routed_unused = sum(
        (b.mlp.n_experts - b.mlp.top_k) * (b.mlp.w_gate[0].numel() * 3)
        for b in model.blocks
        if isinstance(b.mlp, MoE)
    )
    assert counts["active"] == counts["total"] - routed_unused


def test_flops_per_token_follow_active_params_only():
    dense = preset_config("tiny-1m")
    sparse = preset_config("tiny-moe")
    # Same active expert width (2 x 192 = 384 = tiny-1m's d_ff): FLOPs differ by the router alone.
    router = 6 * sparse.n_layers * sparse.d_model * sparse.moe_experts
    assert flops_per_token(sparse, 384, 256) - flops_per_token(dense, 384, 256) == router
    assert count_params(sparse, 384)["total"] > 3 * count_params(dense, 384)["total"]


def test_plan_model_shows_total_and_active():
    rows = dict(describe_preset("olmoe-1b-7b", vocab_size=50_304))
    assert rows["experts"] == "16 of 16 layers MoE: 64 experts of d_ff 1024, top-8 (softmax)"
    assert rows["parameters (total)"].endswith("(6.92 G)")
    assert rows["parameters (active per token)"].endswith("(1.28 G)")
    assert any(label.startswith("training FLOPs per token (6N active") for label in rows)


def test_head_dim_wider_than_d_model_over_heads():
    """Qwen3-30B-A3B's heads are 128 wide at d_model 2048 with 32 heads: model.head_dim says so."""
    cfg = tiny_model_config(d_model=64, n_heads=4, n_kv_heads=2, head_dim=32)
    model = build_model(cfg)
    assert model.blocks[0].attn.wq.weight.shape == (128, 64)
    assert count_params(cfg, 384)["total"] == sum(p.numel() for p in model.parameters())
    logits, _ = model(torch.randint(0, 384, (2, 8)))
    assert logits.shape == (2, 8, 384)


def test_plan_budget_with_a_preset_spends_compute_on_active_params(capsys):
    from smelt.cli import main

    assert main(["plan", "budget", "--flops", "1e21", "--preset", "qwen3-30b-a3b"]) == 0
    out = capsys.readouterr().out.split("with the shape of model preset qwen3-30b-a3b:")[1]
    cfg = preset_config("qwen3-30b-a3b")
    tokens = 1e21 / flops_per_token(cfg, 32_768, cfg.max_seq_len)
    assert f"tokens the budget trains       {tokens:.4g}" in out
    assert "parameters (active per token)" in out and "tokens per active parameter" in out
    assert main(["plan", "budget", "--flops", "1e21", "--preset", "nope"]) == 2
    assert "unknown model preset 'nope'" in capsys.readouterr().err
