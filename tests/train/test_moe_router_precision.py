"""Under bf16 autocast (how a bf16 run trains) the MoE router still scores the experts in fp32, as
model/moe.py says: autocast would otherwise run its matmul in bf16, where near-tied experts swap."""

from __future__ import annotations

import torch

from smelt.config import config_from_dict
from smelt.model.moe import MoE


def test_the_router_scores_in_fp32_under_bf16_autocast():
    torch.manual_seed(0)
    layer = MoE(config_from_dict({"model": {"preset": "tiny-moe"}}).model)
    torch.nn.init.normal_(layer.router.weight, std=0.02)
    x = torch.randn(512, 128)
    experts, weights, probs, logits = layer.route(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        experts_bf16, weights_bf16, probs_bf16, logits_bf16 = layer.route(x)
    assert logits_bf16.dtype == probs_bf16.dtype == weights_bf16.dtype == torch.float32
    assert torch.equal(logits_bf16, logits) and torch.equal(experts_bf16, experts)
    assert torch.equal(weights_bf16, weights)
