"""MoE export to transformers (Qwen3-MoE, Mixtral) with logit parity, import round trip, refusals."""

import json

import pytest
import torch

from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.model.hf import export_model, import_hf
from smelt.model.moe import MoE
from smelt.model.transformer import Transformer

transformers = pytest.importorskip("transformers")

VOCAB = 384


def build(**overrides) -> Transformer:
    base = dict(
        d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=64, norm_eps=1e-6,
        moe_experts=4, moe_top_k=2, moe_d_ff=48,
    )  # fmt: skip
    base.update(overrides)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**base), VOCAB)
    with torch.no_grad():  # a router with real preferences, so mis-ordered experts change the logits
        for block in model.blocks:
            if isinstance(block.mlp, MoE):
                block.mlp.router.weight.normal_(std=0.5)
    return model.eval()


@pytest.mark.parametrize(
    ("overrides", "architecture"),
    [
        (dict(qk_norm=True, moe_first_dense=1, moe_norm_topk=False), "Qwen3MoeForCausalLM"),
        (dict(qk_norm=True, moe_every=2, tie_embeddings=False), "Qwen3MoeForCausalLM"),
        (dict(qk_norm=False, moe_norm_topk=True), "MixtralForCausalLM"),
    ],
)
@pytest.mark.slow
def test_export_logits_match_transformers_and_import_round_trips(tmp_path, overrides, architecture):
    model = build(**overrides)
    export_model(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [architecture]
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    idx = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours, _ = model(idx)
        theirs = hf(idx).logits
    assert (ours - theirs).abs().max() < 1e-4

    back = import_hf(tmp_path)
    assert back.cfg.moe_experts == 4 and back.cfg.moe_top_k == 2 and back.cfg.moe_d_ff == 48
    assert [isinstance(b.mlp, MoE) for b in back.blocks] == [isinstance(b.mlp, MoE) for b in model.blocks]
    with torch.no_grad():
        again, _ = back(idx)
    assert torch.equal(again, ours)


def test_qwen3_moe_head_dim_round_trips(tmp_path):
    model = build(qk_norm=True, head_dim=32)  # Qwen3-30B-A3B style: heads wider than d_model / n_heads
    export_model(model, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    idx = torch.randint(0, VOCAB, (1, 16))
    with torch.no_grad():
        assert (model(idx)[0] - hf(idx).logits).abs().max() < 1e-4
    assert import_hf(tmp_path).cfg.head_dim == 32


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(qk_norm=True, moe_gate="sigmoid"), "model.moe_gate = 'sigmoid'"),
        (dict(qk_norm=True, moe_shared_experts=1), "model.moe_shared_experts = 1"),
        (dict(qk_norm=False, moe_first_dense=1), "Mixtral is sparse everywhere"),
    ],
)
def test_refuses_what_transformers_does_not_compute(tmp_path, overrides, message):
    with pytest.raises(UserError, match=message):
        export_model(build(**overrides), tmp_path)


def test_refuses_a_trained_selection_bias(tmp_path):
    model = build(qk_norm=True, moe_bias_rate=0.001)
    with torch.no_grad():
        model.blocks[0].mlp.expert_bias[1] = 0.01
    with pytest.raises(UserError, match="layer 0's experts carry the selection bias of model.moe_bias_rate"):
        export_model(model, tmp_path)
