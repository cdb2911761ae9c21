"""model.mlp = "relu2" and model.value_embeddings: shapes, parameter and FLOP counts, a training step,
the default model unchanged, and the refusals (HF export, MoE, tensor and pipeline parallelism)."""

import pytest
import torch

from smelt.config import ModelConfig, load_config
from smelt.errors import ConfigError, UserError
from smelt.model.flops import count_params, flops_per_token, model_flops_per_token, value_embedding_layers
from smelt.model.hf import check_exportable
from smelt.model.transformer import Transformer
from smelt.plan.memory import Layout, ModelShape, memory

VOCAB = 300


def cfg(**overrides) -> ModelConfig:
    return ModelConfig(**{"d_model": 64, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 32,
                          **overrides})  # fmt: skip


def tokens(seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(seed))


def test_default_model_is_unchanged_bit_for_bit():
    # Figures of the model as it was before these options existed (same seed, shape and tokens).
    torch.manual_seed(0)
    model = Transformer(cfg(n_layers=2), VOCAB)
    logits, loss = model(tokens(), tokens())
    assert len(model.state_dict()) == 21 and model.value_embeds is None
    with torch.no_grad():
        assert sum(float(p.double().sum()) for p in model.parameters()) == pytest.approx(
            315.5421972930309, abs=1e-9
        )
        assert float(loss) == pytest.approx(4.557554244995117, abs=1e-6)
        assert float(logits.double().abs().sum()) == pytest.approx(1223.5861113940919, rel=1e-9)


@pytest.mark.parametrize(
    "overrides",
    [{"mlp": "relu2"}, {"value_embeddings": True}, {"mlp": "relu2", "value_embeddings": True}, {"n_layers": 3, "value_embeddings": True}],
)  # fmt: skip
def test_shapes_and_parameter_count(overrides):
    c = cfg(**overrides)
    model = Transformer(c, VOCAB)
    logits, _ = model(tokens())
    assert logits.shape == (2, 16, VOCAB)
    assert sum(p.numel() for p in model.parameters()) == count_params(c, VOCAB)["total"]


def test_relu2_mlp_has_two_matrices_of_4d():
    model = Transformer(cfg(mlp="relu2"), VOCAB)
    mlp = model.blocks[0].mlp
    assert not hasattr(mlp, "gate")
    assert mlp.up.weight.shape == (256, 64) and mlp.down.weight.shape == (64, 256)
    x = torch.randn(3, 64)
    assert torch.allclose(mlp(x), mlp.down(torch.relu(mlp.up(x)) ** 2))


def test_value_embeddings_every_other_layer_ending_with_the_last():
    assert value_embedding_layers(cfg(value_embeddings=True)) == [1, 3]
    assert value_embedding_layers(cfg(n_layers=3, value_embeddings=True)) == [0, 2]
    assert value_embedding_layers(cfg()) == []
    model = Transformer(cfg(value_embeddings=True), VOCAB)
    assert sorted(model.value_embeds) == ["1", "3"]
    assert model.value_embeds["1"].weight.shape == (VOCAB, 2 * 16)  # n_kv_heads x head_dim
    assert model.blocks[0].attn.ve_gate is None and model.blocks[1].attn.ve_gate.weight.shape == (2, 32)
    # The gate starts at 2 sigmoid(0) = 1: the value embedding is added whole.
    assert torch.all(model.blocks[1].attn.ve_gate.weight == 0)
    counts = count_params(cfg(value_embeddings=True), VOCAB)
    assert counts["value_embedding"] == 2 * VOCAB * 32
    assert counts["non_embedding"] == count_params(cfg(), VOCAB)["non_embedding"] + 2 * 32 * 2


def test_value_embedding_changes_the_values():
    torch.manual_seed(0)
    model = Transformer(cfg(value_embeddings=True), VOCAB)
    before, _ = model(tokens())
    with torch.no_grad():
        model.value_embeds["3"].weight.zero_()
    after, _ = model(tokens())
    assert not torch.allclose(before, after)


def test_flops_count_the_new_matrices():
    base, relu2 = cfg(), cfg(mlp="relu2")
    # 2 x 64 x 256 per layer against 3 x 64 x 192 (8/3 x 64 rounded to 64).
    per_layer = 2 * 64 * 256 - 3 * 64 * 192
    assert flops_per_token(relu2, VOCAB, 32) - flops_per_token(base, VOCAB, 32) == 6 * 4 * per_layer
    assert (
        model_flops_per_token(relu2, VOCAB, 32) - model_flops_per_token(base, VOCAB, 32) == 6 * 4 * per_layer
    )
    # The tables are lookups (no FLOPs); the two layers' gates (32 -> 2) are matmuls.
    ve = cfg(value_embeddings=True)
    assert flops_per_token(ve, VOCAB, 32) - flops_per_token(base, VOCAB, 32) == 6 * 2 * 32 * 2
    assert model_flops_per_token(ve, VOCAB, 32) - model_flops_per_token(base, VOCAB, 32) == 6 * 2 * 32 * 2


def test_memory_plan_counts_the_value_embedding_tables():
    layout = Layout(micro_batch=1, seq_len=32)
    plain = memory(ModelShape.from_config(cfg(), VOCAB), layout).stages[0]
    shape = ModelShape.from_config(cfg(value_embeddings=True), VOCAB)
    assert shape.value_embedding_params == 2 * VOCAB * 32
    with_ve = memory(shape, layout).stages[0]
    assert with_ve.weights > plain.weights + 2 * VOCAB * 32  # tables + gates, 2 bytes each in mixed precision


@pytest.mark.parametrize("overrides", [{"mlp": "relu2"}, {"value_embeddings": True}])
def test_a_training_step_lowers_the_loss(overrides):
    torch.manual_seed(0)
    model = Transformer(cfg(**overrides), VOCAB)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x = tokens()
    losses = []
    for _ in range(3):
        _, loss = model(x, x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    if "value_embeddings" in overrides:  # the gates (zero at init) are trained too
        assert not torch.all(model.blocks[1].attn.ve_gate.weight == 0)


def test_muon_leaves_the_value_embedding_tables_to_adamw():
    from smelt.config import TrainConfig
    from smelt.train.optim import muon_groups

    model = Transformer(cfg(value_embeddings=True), VOCAB)
    groups = muon_groups(model, TrainConfig(optimizer="muon"))
    muon = {id(p) for g in groups if g.get("muon") for p in g["params"]}
    assert id(model.value_embeds["1"].weight) not in muon
    assert id(model.blocks[1].attn.ve_gate.weight) in muon


@pytest.mark.parametrize("overrides,key", [({"mlp": "relu2"}, "model.mlp"), ({"value_embeddings": True}, "model.value_embeddings")])  # fmt: skip
def test_hf_export_refuses_naming_the_key(overrides, key):
    with pytest.raises(UserError, match=key):
        check_exportable(cfg(**overrides))


def test_relu2_with_moe_is_a_config_error():
    with pytest.raises(ConfigError, match="model.mlp = 'relu2'"):
        load_config(None, ["model.mlp=relu2", "model.moe_experts=4"])


def test_parallel_plans_refuse_them():
    from smelt.train.parallel.mesh import check_pipeline_parallel

    c = load_config(None, ["model.value_embeddings=true", "model.tie_embeddings=false", "model.n_layers=4",
                           "train.pipeline_parallel=2", "train.pipeline_schedule=gpipe"])  # fmt: skip
    with pytest.raises(ConfigError, match="model.value_embeddings"):
        check_pipeline_parallel(c)


def test_value_embeddings_under_bf16_autocast():
    model = Transformer(cfg(value_embeddings=True, mlp="relu2"), VOCAB)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(tokens(), tokens())
    loss.backward()
    assert model.value_embeds["3"].weight.grad is not None
