"""The learning rate of a decay to zero (an anneal fork's schedule): no step trains at lr 0."""

from __future__ import annotations

import math

import pytest

from smelt.config import load_config
from smelt.run.anneal import anneal_overrides
from smelt.train.batching import batch_plan
from smelt.train.schedule import Schedule, lr_at
from smelt.train.setup import build_schedule


def test_an_anneal_trains_its_last_step_at_a_positive_lr(tmp_path):
    """`smelt anneal`'s keys (one warmup step, then WSD decaying linearly from the first step to zero):
    the peak for two steps, then down by peak / 3 a step, so the last of 4 steps trains at peak / 3."""
    overrides = [
        *anneal_overrides(str(tmp_path / "parent:10"), decay_tokens=8192, batch_tokens=2048),
        "train.lr=0.003", "train.batch_tokens=2048", "train.seq_len=128", "train.micro_batch=16",
    ]  # fmt: skip
    tc = load_config(None, overrides).train
    plan = batch_plan(tc, 1)
    schedule = build_schedule(tc, plan, [1])
    assert [schedule(k) for k in range(plan.steps)] == pytest.approx([0.003, 0.003, 0.002, 0.001])


@pytest.mark.parametrize("shape", ["linear", "cosine", "1-sqrt"])
def test_a_zero_floor_is_reached_one_step_after_the_last(shape):
    s = Schedule("wsd", lr=1.0, warmup=10, total_steps=100, min_lr_ratio=0.0, decay_shape=shape)
    decay = [s(k) for k in range(s.wsd_decay_start, 100)]
    assert decay[0] == 1.0 and all(a > b > 0 for a, b in zip(decay[:-1], decay[1:], strict=False))
    if shape == "linear":
        assert s(99) == pytest.approx(1 / 20)  # 20 decay steps: the 20th would be at 0
    # A positive floor is still reached at the last step, as before.
    floored = Schedule("wsd", lr=1.0, warmup=10, total_steps=100, min_lr_ratio=0.1, decay_shape=shape)
    assert floored(99) == pytest.approx(0.1) and floored(80) == 1.0


def test_cosine_to_zero_keeps_the_last_step_training():
    values = [lr_at(k, lr=1.0, warmup=5, total_steps=50, min_lr_ratio=0.0) for k in range(50)]
    assert values[5] == 1.0 and min(values) == values[-1] > 0
    assert values[-1] == pytest.approx(0.5 * (1 + math.cos(math.pi * 44 / 45)))  # 45 decay steps, 44 run
    assert lr_at(49, lr=1.0, warmup=5, total_steps=50, min_lr_ratio=0.1) == pytest.approx(0.1)
