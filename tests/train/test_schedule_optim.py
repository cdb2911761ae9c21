import math

import pytest
import torch

from smelt.config import ModelConfig, TrainConfig
from smelt.errors import ConfigError, UserError
from smelt.model.transformer import Transformer
from smelt.train.batching import batch_plan
from smelt.train.optim import build_optimizer, param_groups
from smelt.train.precision import resolve_precision
from smelt.train.schedule import lr_at, warmup_steps


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


def test_batch_ramp_grows_in_whole_starting_batches_and_consumes_every_token():
    tc = TrainConfig(seq_len=32, micro_batch=2, batch_tokens=512, tokens=512 * 10, batch_ramp_tokens=2048)
    plan = batch_plan(tc)
    assert plan.unit_tokens == 64 and plan.grad_accum == 1  # start: seq_len x micro_batch
    # batch after T tokens: 64 + 448 * min(1, T / 2048), rounded down to whole 64-token units
    assert list(plan.units[:6]) == [1, 1, 1, 1, 1, 2] and max(plan.units) == 8 == plan.units[-2]
    assert plan.units[-1] == 7  # the last step takes what is left
    assert plan.loader_steps == 80 and plan.tokens == 512 * 10
    assert [plan.tokens_at(s) for s in (0, 1, 5, 6)] == [0, 64, 320, 448]
    assert [plan.step_of_loader_step(u) for u in (5, 6, 7, 8)] == [5, 6, 6, 7]
    assert plan.step_at_tokens(2048) == next(s for s in range(1, plan.steps + 1) if plan.tokens_at(s) >= 2048)
    with pytest.raises(ConfigError, match="train.batch_ramp_start = 96 .* multiple"):
        batch_plan(
            TrainConfig(seq_len=32, micro_batch=2, batch_tokens=512, batch_ramp_tokens=1, batch_ramp_start=96)
        )
    with pytest.raises(ConfigError, match="must be smaller than train.batch_tokens = 512 and divide it"):
        batch_plan(
            TrainConfig(
                seq_len=32, micro_batch=2, batch_tokens=512, batch_ramp_tokens=1, batch_ramp_start=192
            )
        )
