"""Muon takes the MoE's stacked expert matrices ([experts, in, out]) and orthogonalises each expert's
update on its own, as it does a 2-D hidden weight; before, they silently fell to AdamW at train.lr."""

import math

import pytest
import torch
from tests.model.test_moe_training import moe_config

from smelt.model.transformer import Transformer
from smelt.train.muon import Muon, newton_schulz, shape_scale
from smelt.train.optim import build_optimizer


def test_newton_schulz_of_a_stack_is_each_matrix_on_its_own():
    g = torch.randn(3, 16, 24, generator=torch.Generator().manual_seed(0))
    stacked = newton_schulz(g)
    for i in range(3):
        torch.testing.assert_close(stacked[i], newton_schulz(g[i]), rtol=1e-5, atol=1e-5)
    assert stacked.shape == g.shape
    # x @ W layout [n, in, out]: out/in as a 2-D [out, in] weight's rows/cols.
    assert shape_scale(torch.empty(4, 16, 24)) == pytest.approx(math.sqrt(1.5))
    assert shape_scale(torch.empty(4, 24, 16)) == 1.0 == shape_scale(torch.empty(16, 24))
    assert shape_scale(torch.empty(24, 16)) == pytest.approx(math.sqrt(1.5))


def test_muon_takes_the_expert_matrices_of_an_moe():
    cfg = moe_config()
    cfg.train.optimizer, cfg.train.muon_lr = "muon", 0.02
    model = Transformer(cfg.model, 256)
    opt = build_optimizer(model, cfg.train, torch.device("cpu"))
    assert isinstance(opt, Muon)
    muon = {id(p) for g in opt.param_groups if g["muon"] for p in g["params"]}
    moe = model.blocks[0].mlp
    assert {id(moe.w_gate), id(moe.w_up), id(moe.w_down), id(moe.router.weight)} <= muon
    assert id(model.tok_emb.weight) not in muon
    before = moe.w_up.detach().clone()
    model(torch.randint(0, 256, (2, 16)))[0].float().square().mean().backward()
    opt.step()
    assert "momentum_buffer" in opt.state[moe.w_up] and "exp_avg" not in opt.state[moe.w_up]
    assert not torch.equal(before, moe.w_up.detach())
