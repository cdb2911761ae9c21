"""`smelt train --check`: the pilot checks pass on a healthy setup and catch a broken one."""

import pytest
import torch

from smelt.model.transformer import Transformer
from smelt.train.check import pilot_checks

from .test_trainer import data, tiny_config  # noqa: F401 - the data fixture


@pytest.mark.slow
def test_pilot_checks_pass_on_a_healthy_tiny_model(data, monkeypatch):  # noqa: F811
    tokens, tokenizer = data
    monkeypatch.setattr("smelt.train.check.OVERFIT_LR", 3e-3)  # a tiny model overfits faster
    rows = pilot_checks(tiny_config(), tokens, tokenizer)
    # The values that follow the model's size come first, each with where it came from.
    assert [name for name, _, _ in rows[:4]] == [
        "train.lr",
        "model.init_std",
        "train.batch_tokens",
        "train.warmup_tokens",
    ]
    assert "rule: 3e-3 x min(1, 256 / d_model)" in rows[0][2] or "set in the config" in rows[0][2]
    assert [name for name, _, _ in rows[4:]] == [
        "step-0 loss ~ ln V",
        "every parameter gets a gradient",
        "overfit 8 sequences",
        "same seed, bitwise identical (20 steps)",
    ]
    assert all(passed for _, passed, _ in rows), rows


def test_pilot_checks_catch_a_dead_parameter_and_a_wrong_loss(data, monkeypatch):  # noqa: F811
    tokens, tokenizer = data
    real_init = Transformer.__init__

    def with_dead_param(self, *args, **kw):
        real_init(self, *args, **kw)
        self.unused = torch.nn.Parameter(torch.ones(3))  # never used in forward: gets no gradient

    real_forward = Transformer.forward

    def doubled(self, *args, **kw):
        logits, loss = real_forward(self, *args, **kw)
        return logits, loss * 2 if isinstance(loss, torch.Tensor) else loss

    monkeypatch.setattr(Transformer, "__init__", with_dead_param)
    monkeypatch.setattr(Transformer, "forward", doubled)
    monkeypatch.setattr("smelt.train.check.OVERFIT_STEPS", 2)
    monkeypatch.setattr("smelt.train.check._reproducibility", lambda *a: ("repro", True, "not run"))
    results = {
        name: (passed, detail) for name, passed, detail in pilot_checks(tiny_config(), tokens, tokenizer)
    }
    assert results["step-0 loss ~ ln V"][0] is False
    assert results["every parameter gets a gradient"] == (False, "no gradient: unused")
    assert results["overfit 8 sequences"][0] is False
