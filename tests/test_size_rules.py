"""Defaults that follow the model's size (config/size_rules.py): unset lr, init std, batch and warmup
come from one rule each, the small presets keep their measured values, a far-off value is named."""

import subprocess
import sys

import pytest

from smelt.config import config_from_dict, hash_json
from smelt.config.size_rules import rule_batch_tokens, rule_init_std, rule_lr


def sized(cfg) -> dict:
    return {s.key: s for s in cfg.sized}


def test_the_small_presets_keep_their_measured_values():
    for preset in ("tiny-1m", "small-5m"):
        cfg = config_from_dict({"model": {"preset": preset}})
        assert cfg.train.lr == 3e-3 and cfg.model.init_std == 0.02
        assert cfg.train.batch_tokens == 0 and cfg.train.warmup_tokens == 0


def test_the_rules_follow_the_fields_reference_points():
    assert 1e-4 <= rule_lr(4096) <= 3e-4  # 7B: about 2e-4
    assert 6e-5 <= rule_lr(8192) <= 1e-4  # 70B: 0.6-1e-4
    assert rule_init_std(8192) == pytest.approx(0.01)
    assert rule_batch_tokens(1e9) == 2**19  # 0.5M at 1B
    assert 2**20 <= rule_batch_tokens(6.6e9) <= 2**21  # 1-2M at 7B
    assert 2**21 <= rule_batch_tokens(30e9) <= 2**22  # 2-4M at 13-34B
    assert rule_batch_tokens(70e9) == 2**22  # at least 4M at 70B


def test_unset_keys_follow_the_rule_and_set_ones_are_kept_with_a_warning_when_far():
    cfg = config_from_dict({"model": {"preset": "llama-7b"}, "train": {"tokens": 10**11}})
    rows = sized(cfg)
    assert rows["train.lr"].source == "rule" and 1e-4 <= cfg.train.lr <= 3e-4
    assert cfg.model.init_std == pytest.approx(0.02 * (2048 / 4096) ** 0.5)
    assert cfg.train.batch_tokens == rule_batch_tokens(12 * 32 * 4096**2)
    assert not any(s.far_from_rule for s in cfg.sized)
    mine = config_from_dict({"model": {"preset": "llama-7b"}, "train": {"lr": 3e-3, "tokens": 10**11}})
    lr = sized(mine)["train.lr"]
    assert mine.train.lr == 3e-3 and lr.source == "config" and lr.far_from_rule
    assert "train.lr = 0.003" in lr.warning() and "3e-3 x min(1, 256 / d_model)" in lr.warning()


def test_a_saved_config_loads_to_the_same_values_and_hash():
    cfg = config_from_dict({"model": {"preset": "llama-1b"}, "train": {"tokens": 10**10}})
    again = config_from_dict(cfg.to_dict())
    assert hash_json(again.to_dict()) == hash_json(cfg.to_dict())
    assert all(s.source == "config" for s in again.sized)


def test_plan_model_shows_each_value_and_where_it_came_from():
    out = subprocess.run([sys.executable, "-m", "smelt", "plan", "model", "llama-7b"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    line = next(row for row in out.splitlines() if row.startswith("train.lr"))
    value = float(line.split()[3])
    assert 1e-4 <= value <= 3e-4 and "rule: 3e-3 x min(1, 256 / d_model)" in line


def test_posttrain_lr_rules_give_the_fields_values_at_7b():
    from smelt.config.size_rules import rule_posttrain_lr

    assert 1e-5 <= rule_posttrain_lr("sft", 4096) <= 2e-5
    assert 5e-7 <= rule_posttrain_lr("dpo", 2048) <= 1e-6 and 4e-7 <= rule_posttrain_lr("dpo", 4096) <= 1e-6
    assert 5e-7 <= rule_posttrain_lr("grpo", 4096) <= 2e-6
    assert rule_posttrain_lr("sft", 256) > rule_posttrain_lr("sft", 1024)  # smaller models, larger steps


def test_a_posttrain_config_without_lr_takes_the_stage_rule(capsys, monkeypatch):
    from smelt.config.size_rules import rule_posttrain_lr
    from smelt.posttrain.config import config_from_dict
    from smelt.posttrain.stage import resolve_lr

    monkeypatch.delenv("SMELT_QUIET", raising=False)
    cfg = config_from_dict({"stage": "dpo"})
    assert cfg.optim.lr == 0.0 and cfg.dpo.beta == 0.1
    resolve_lr(cfg, "dpo", {"d_model": 4096})
    assert cfg.optim.lr == rule_posttrain_lr("dpo", 4096)
    assert "by the rule" in capsys.readouterr().err
    chosen = config_from_dict({"stage": "sft", "optim": {"lr": 3e-4}})
    resolve_lr(chosen, "sft", {"d_model": 4096})
    assert chosen.optim.lr == 3e-4  # a value the user set is kept
