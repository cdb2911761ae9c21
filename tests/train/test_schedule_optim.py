import math

import pytest
import torch

from smelt.config import ModelConfig, TrainConfig
from smelt.errors import ConfigError, UserError
from smelt.model.transformer import Transformer
from smelt.train.optim import build_optimizer, param_groups
from smelt.train.precision import resolve_precision
from smelt.train.schedule import lr_at, warmup_steps
from smelt.train.trainer import batch_plan


def test_warmup_then_cosine_to_floor():
    kw = dict(lr=1.0, warmup=10, total_steps=111, min_lr_ratio=0.1)
    assert lr_at(0, **kw) == pytest.approx(0.1)
    assert lr_at(4, **kw) == pytest.approx(0.5)
    assert lr_at(9, **kw) == pytest.approx(1.0)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)  # halfway down the cosine
    assert lr_at(110, **kw) == pytest.approx(0.1)
    values = [lr_at(s, **kw) for s in range(111)]
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))
    assert min(values) == pytest.approx(0.1)


def test_warmup_steps_from_tokens():
    assert warmup_steps(0, 1_000_000, 1000, 1000) == 20  # 2% of tokens
    assert warmup_steps(0, 1000, 1000, 1) == 1  # at least one step
    assert warmup_steps(5000, 1_000_000, 1000, 1000) == 5
    assert warmup_steps(10**9, 1_000_000, 1000, 1000) == 1000  # never past the end


def test_single_step_schedule_is_finite():
    assert lr_at(0, lr=0.5, warmup=1, total_steps=1, min_lr_ratio=0.1) == 0.5


@pytest.mark.parametrize("tie", [True, False])
def test_param_groups_decay_only_matmul_weights(tie):
    model = Transformer(ModelConfig(d_model=32, n_layers=2, n_heads=2, qk_norm=True, tie_embeddings=tie), 256)
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    decay_ids = {id(p) for p in decay["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert id(model.tok_emb.weight) not in decay_ids
    assert (id(model.lm_head.weight) in decay_ids) == (not tie)
    for p in no_decay["params"]:
        assert p.ndim == 1 or p is model.tok_emb.weight, names[id(p)]
    assert all("norm" not in names[i] for i in decay_ids)
    assert id(model.blocks[0].attn.wq.weight) in decay_ids
    total = len(decay["params"]) + len(no_decay["params"])
    assert total == len(list(model.parameters()))


def test_build_optimizer_uses_config():
    model = Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=2), 256)
    opt = build_optimizer(model, TrainConfig(lr=1e-3, beta1=0.8, beta2=0.9, eps=1e-6), torch.device("cpu"))
    assert opt.defaults["betas"] == (0.8, 0.9) and opt.defaults["eps"] == 1e-6


def test_batch_arithmetic():
    plan = batch_plan(TrainConfig(seq_len=128, micro_batch=4, batch_tokens=2048, tokens=10_000))
    assert plan.grad_accum == 4 and plan.steps == math.ceil(10_000 / 2048) and plan.tokens == 5 * 2048
    plan = batch_plan(TrainConfig(seq_len=128, micro_batch=4, batch_tokens=0, tokens=1024), world_size=2)
    assert plan.batch_tokens == 1024 and plan.grad_accum == 1 and plan.steps == 1


def test_batch_tokens_not_a_multiple_names_key_and_neighbours():
    with pytest.raises(ConfigError, match=r"train\.batch_tokens = 3000.*2560 or 3072"):
        batch_plan(TrainConfig(seq_len=128, micro_batch=4, batch_tokens=3000))
    with pytest.raises(UserError, match=r"Nearest valid values: 512 \(or 0"):
        batch_plan(TrainConfig(seq_len=128, micro_batch=4, batch_tokens=100))


def test_precision_resolution():
    cpu = torch.device("cpu")
    assert resolve_precision("fp32", cpu).name == "fp32"
    assert resolve_precision("bf16", cpu).name == "bf16"
    assert resolve_precision("auto", cpu).name in ("bf16", "fp32")
    with pytest.raises(UserError, match="train.precision = 'fp16' needs a CUDA device"):
        resolve_precision("fp16", cpu)
