"""The mixture-of-experts MLP: routing, grouped computation, balancing, and its place in the transformer."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import build_model, tiny_model_config
from smelt.config import load_config
from smelt.config.moe import moe_layers
from smelt.errors import ConfigError
from smelt.model import moe as moe_module
from smelt.model.moe import MoE, router_metrics, update_expert_bias
from smelt.model.transformer import MLP


def moe_config(**overrides):
    base = dict(moe_experts=4, moe_top_k=2, moe_d_ff=32, moe_aux_loss=0.0, moe_z_loss=0.0)
    return tiny_model_config(**{**base, **overrides})


def build_moe(seed: int = 0, **overrides) -> MoE:
    torch.manual_seed(seed)
    layer = MoE(moe_config(**overrides))
    for w in (layer.w_gate, layer.w_up, layer.w_down):
        torch.nn.init.normal_(w, std=0.1)
    return layer


def per_token_reference(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """Each token through each of its experts one at a time: what the grouped computation must equal."""
    flat = x.reshape(-1, x.shape[-1])
    experts, weights, _, _ = layer.route(flat)
    rows = []
    for t in range(flat.shape[0]):
        y = 0
        for j in range(layer.top_k):
            e = int(experts[t, j])
            h = F.silu(flat[t] @ layer.w_gate[e]) * (flat[t] @ layer.w_up[e])
            y = y + weights[t, j] * (h @ layer.w_down[e])
        rows.append(y)
    return torch.stack(rows).view_as(x)


@pytest.mark.parametrize("gate", ["softmax", "sigmoid"])
def test_routing_picks_the_top_k(gate):
    layer = build_moe(moe_experts=8, moe_top_k=3, moe_gate=gate, moe_norm_topk=False)
    x = torch.randn(50, 64)
    experts, weights, probs, logits = layer.route(x)
    # The chosen experts are exactly the k highest-scoring ones, best first; their weights are the scores.
    scores = torch.softmax(logits, -1) if gate == "softmax" else torch.sigmoid(logits)
    best = scores.argsort(dim=-1, descending=True)[:, :3]
    assert torch.equal(experts, best)
    assert torch.allclose(weights, scores.gather(-1, best))
    assert torch.allclose(probs.sum(-1), torch.ones(50))


def test_norm_topk_weights_sum_to_one():
    layer = build_moe(moe_experts=8, moe_top_k=3, moe_gate="sigmoid", moe_norm_topk=True)
    _, weights, _, _ = layer.route(torch.randn(20, 64))
    assert torch.allclose(weights.sum(-1), torch.ones(20))


def test_identical_experts_equal_the_dense_mlp():
    """Dropless, renormalized top-k over E copies of one SwiGLU is that SwiGLU, whatever the routing."""
    cfg = moe_config(moe_experts=4, moe_top_k=2, moe_d_ff=0)
    torch.manual_seed(0)
    dense, layer = MLP(cfg), MoE(cfg)
    torch.nn.init.normal_(layer.router.weight, std=1.0)
    with torch.no_grad():
        layer.w_gate.copy_(dense.gate.weight.T.expand_as(layer.w_gate))
        layer.w_up.copy_(dense.up.weight.T.expand_as(layer.w_up))
        layer.w_down.copy_(dense.down.weight.T.expand_as(layer.w_down))
    x = torch.randn(3, 10, 64)
    assert torch.allclose(layer(x), dense(x), atol=1e-6)


@pytest.mark.parametrize("grouped_mm", [True, False])
def test_grouped_gradients_equal_the_per_token_reference(grouped_mm, monkeypatch):
    if not grouped_mm:
        monkeypatch.setattr(moe_module, "_grouped_mm_usable", lambda *a: False)
    elif not moe_module._grouped_mm_usable(torch.zeros(1, 64), torch.zeros(4, 64, 32)):
        pytest.skip("torch._grouped_mm is not available for float32 on this CPU build")
    layer = build_moe(moe_experts=4, moe_top_k=2, moe_shared_experts=0)
    x = torch.randn(2, 12, 64, requires_grad=True)
    out = layer(x)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    got = [x.grad.clone()] + [
        p.grad.clone() for p in (layer.w_gate, layer.w_up, layer.w_down, layer.router.weight)
    ]
    x.grad = None
    layer.zero_grad()
    ref = per_token_reference(layer, x)
    assert torch.allclose(out, ref, atol=1e-5)
    (ref * weights).sum().backward()
    want = [x.grad] + [p.grad for p in (layer.w_gate, layer.w_up, layer.w_down, layer.router.weight)]
    for g, w in zip(got, want, strict=True):
        assert torch.allclose(g, w, atol=1e-5), (g - w).abs().max()


def test_shared_expert_is_added_to_every_token():
    layer = build_moe(moe_shared_experts=1)
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        full = layer(x)
        shared = layer.shared(x.reshape(-1, 64)).view_as(x)
        layer.shared = None
        assert torch.allclose(full, layer(x) + shared, atol=1e-6)


def test_capacity_factor_drops_and_counts():
    layer = build_moe(moe_experts=4, moe_top_k=1, moe_capacity_factor=1.0)
    with torch.no_grad():
        layer.router.weight.zero_()
        layer.router.weight[0, 0] = 10.0  # every token with x[0] > 0 prefers expert 0
    x = torch.randn(1, 64, 64)
    x[..., 0] = x[..., 0].abs() + 1
    layer.train()
    out = layer(x)
    stats = torch.cat([layer.window_load, layer.window_stats])
    capacity = math.ceil(1.0 * 64 * 1 / 4)
    assert int(layer.window_stats[2]) == 64 - capacity, stats
    # The first `capacity` tokens got expert 0's output; the dropped ones got nothing from the MLP.
    assert out[0, :capacity].abs().sum(-1).min() > 0
    assert torch.equal(out[0, capacity:], torch.zeros_like(out[0, capacity:]))


@pytest.mark.slow
def test_aux_loss_free_bias_balances_a_skewed_router():
    layer = build_moe(moe_experts=4, moe_top_k=1, moe_bias_rate=0.01)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 64, generator=gen)
    x[:, 0] = 1.0
    with torch.no_grad():
        layer.router.weight.copy_(torch.randn(4, 64, generator=gen) * 0.1)
        layer.router.weight[:, 0] = 0.0
        layer.router.weight[0, 0] = 2.0  # expert 0 wins most tokens
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Module()])
    model.blocks[0].mlp = layer
    layer.train()

    def max_over_mean() -> float:
        layer(x.view(1, 512, 64))
        return router_metrics(model)["moe_max_mean"][0]

    before = max_over_mean()
    for _ in range(300):
        layer(x.view(1, 512, 64))
        update_expert_bias(model)
    after = max_over_mean()
    assert before > 2.5
    assert after < 1.3, (before, after, layer.expert_bias)
    # The bias moves the choice only: the gate weights stay the router's own scores.
    experts, weights, _, logits = layer.route(x)
    assert torch.allclose(weights, torch.ones_like(weights))  # top-1, renormalized


def test_balancing_losses_reach_the_training_loss():
    cfg = moe_config(moe_aux_loss=0.01, moe_z_loss=0.001)
    model = build_model(cfg)
    x = torch.randint(0, 384, (2, 16))
    _, parts = model(x, x, loss_parts=True)
    assert parts["moe_aux"] > 0
    assert torch.allclose(parts["loss"], parts["ce"] + parts["moe_aux"])
    # Per-token form: the mean over scored positions includes the term once.
    _, per_token = model(x, x, loss_parts=True, reduction="none")
    assert torch.allclose(per_token["loss"].mean(), parts["loss"], atol=1e-6)
    parts["moe_aux"].backward()
    assert model.blocks[0].mlp.router.weight.grad.abs().sum() > 0


def test_layer_choice_every_k_and_first_dense():
    cfg = moe_config(n_layers=6, moe_every=2, moe_first_dense=1)
    assert moe_layers(cfg) == [1, 3, 5]
    model = build_model(cfg)
    assert [isinstance(b.mlp, MoE) for b in model.blocks] == [False, True, False, True, False, True]


def test_metrics_count_each_forward_once_under_activation_checkpointing():
    counts = []
    for ckpt in (False, True):
        model = build_model(moe_config(activation_checkpointing=ckpt))
        model.train()
        x = torch.randint(0, 384, (2, 16))
        model(x, x)[1].backward()
        counts.append(router_metrics(model))
    assert counts[0] == counts[1]
    assert counts[0]["moe_layers"] == [0, 1]
    assert len(counts[0]["moe_load"][0]) == 4
    assert abs(sum(counts[0]["moe_load"][0]) - 1) < 1e-4
    assert 0 < counts[0]["moe_entropy"][0] <= math.log(4) + 1e-6


def test_config_errors_name_the_key(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("[model]\nmoe_experts = 4\nmoe_top_k = 8\n")
    with pytest.raises(ConfigError, match=r"model.moe_top_k \(8\) exceeds model.moe_experts \(4\)"):
        load_config(path)
    path.write_text("[model]\nmoe_experts = 4\nmoe_capacity_factor = 0.5\n")
    with pytest.raises(ConfigError, match="model.moe_capacity_factor = 0.5 would drop tokens"):
        load_config(path)
    path.write_text("[model]\nn_layers = 2\nmoe_experts = 4\nmoe_first_dense = 2\n")
    with pytest.raises(ConfigError, match="leaves no MoE layer"):
        load_config(path)


def test_kv_cache_generation_equals_full_recompute():
    """Routing is per token, so decoding one token at a time picks the experts a full forward picks."""
    from smelt.model.generate import generate

    model = build_model(moe_config(moe_shared_experts=1)).eval()
    prompt = [5, 17, 42, 7, 99]
    cached = generate(model, prompt, 12, temperature=0.0, use_cache=True)
    full = generate(model, prompt, 12, temperature=0.0, use_cache=False)
    assert cached == full and len(cached) == len(prompt) + 12
