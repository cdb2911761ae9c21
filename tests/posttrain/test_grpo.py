"""GRPO: group advantages, the loss, and a tiny model whose mean reward rises on a synthetic task."""

from __future__ import annotations

import json

import pytest
import torch

from smelt.errors import UserError
from smelt.posttrain.config import config_from_dict
from smelt.posttrain.grpo import group_advantages, grpo_loss, run_grpo
from smelt.posttrain.rewards import exact_number, register_reward, resolve_reward
from smelt.posttrain.sft import run_sft


def test_group_advantages_are_zero_mean_per_group_and_zero_for_uniform_groups():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, 4)
    assert adv[:4].sum().abs() < 1e-6 and adv[0] > 0 > adv[1]
    assert torch.equal(adv[4:], torch.zeros(4))


def test_grpo_loss_pushes_up_positive_replies_and_kl_is_zero_at_the_reference():
    logps = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]], requires_grad=True)
    mask = torch.tensor([[True, True], [True, False]])
    loss, kl = grpo_loss(logps, logps.detach().clone(), torch.tensor([1.0, -1.0]), mask, kl_coef=0.5)
    loss.backward()
    assert float(kl) == 0.0
    assert (logps.grad[0] < 0).all() and logps.grad[1, 0] > 0 and logps.grad[1, 1] == 0


def test_reward_plugins_resolve_by_name_or_path():
    @register_reward("always_half")
    def half(completion, item):
        return 0.5

    assert resolve_reward("always_half") is half
    assert resolve_reward("smelt.posttrain.rewards:exact_number") is exact_number
    assert exact_number("so #### 1,068", {"answer": "1068"}) == 1.0
    with pytest.raises(UserError, match=r"grpo.reward = 'nope' is not a registered reward"):
        resolve_reward("nope")


@register_reward("answers_seven")
def answers_seven(completion: str, item: dict) -> float:
    """A verifiable task a tiny model learns by RL within seconds: reply `7` to every question."""
    return 1.0 if completion.strip() == "7" else 0.0


@pytest.mark.slow
def test_grpo_raises_the_mean_reward_of_a_tiny_model(base_run, tmp_path):
    # A warm start that replies with numbers (as a base model has behaviours RL chooses between).
    run_sft(config_from_dict({
        "stage": "sft", "run": {"init_from": str(base_run), "out": str(tmp_path / "sft")},
        "data": {"format": "addition", "addition_items": 300, "addition_digits": 1, "heldout": 0},
        "optim": {"lr": 3e-3, "steps": 60, "batch_size": 16, "seq_len": 64, "log_every": 20},
    }))  # fmt: skip
    summary = run_grpo(config_from_dict({
        "stage": "grpo", "run": {"init_from": str(tmp_path / "sft"), "out": str(tmp_path / "grpo")},
        "data": {"format": "addition", "addition_items": 300, "addition_digits": 1, "heldout": 24},
        "optim": {"lr": 1e-3, "steps": 20, "batch_size": 8, "schedule": "constant", "log_every": 5},
        "grpo": {"group_size": 8, "max_new_tokens": 6, "kl_coef": 0.02, "reward": "answers_seven"},
        "eval": {"items": 24},
    }))  # fmt: skip
    assert summary["heldout_sampled_reward_after"] > summary["heldout_sampled_reward_before"] + 0.3
    assert summary["heldout_reward_after"] > summary["heldout_reward_before"]
    assert summary["train_reward_last_quarter"] > summary["train_reward_first_quarter"] + 0.3
    records = [
        json.loads(line) for line in (tmp_path / "grpo" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    train = [r for r in records if r["kind"] == "train"]
    assert {"reward", "reply_tokens", "kl", "groups_with_signal"} <= set(train[-1])
    assert train[-1]["kl"] > 0  # the policy moved away from the reference, and the KL says so
