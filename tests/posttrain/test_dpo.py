"""DPO and SimPO: ln 2 at step 0, cached reference log-probs, held-out preference accuracy."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from smelt.errors import UserError
from smelt.posttrain import dpo
from smelt.posttrain.chat import write_jsonl
from smelt.posttrain.config import DPOSection, config_from_dict


def _pairs(path, n=120, seed=0):
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        a, b = rng.randrange(50), rng.randrange(50)
        records.append({
            "prompt": [{"role": "user", "content": f"{a}+{b}"}],
            "chosen": [{"role": "assistant", "content": f"{a + b}"}],
            "rejected": [{"role": "assistant", "content": f"{a + b + rng.randrange(1, 9)} no"}],
        })  # fmt: skip
    write_jsonl(path, records)
    return path


def _config(base_run, out, data, loss="dpo", steps=20):
    return config_from_dict({
        "stage": "dpo",
        "run": {"init_from": str(base_run), "out": str(out)},
        "data": {"format": "preferences", "path": str(data), "heldout": 24},
        "optim": {"lr": 2e-3, "steps": steps, "batch_size": 8, "log_every": 5},
        "dpo": {"loss": loss, "beta": 0.5},
    })  # fmt: skip


def test_dpo_loss_is_ln2_when_the_reference_is_the_policy():
    policy = {"chosen": torch.tensor([-3.0, -7.5]), "rejected": torch.tensor([-2.0, -9.0]),
              "chosen_len": torch.tensor([2.0, 3.0]), "rejected_len": torch.tensor([2.0, 4.0])}  # fmt: skip
    out = dpo.preference_loss(policy, policy, DPOSection())
    assert float(out["loss"]) == pytest.approx(math.log(2), abs=1e-7)


@pytest.mark.slow
def test_dpo_stage_starts_at_ln2_caches_the_reference_and_learns_the_preference(
    base_run, tmp_path, monkeypatch
):
    data = _pairs(tmp_path / "pairs.jsonl")
    out = tmp_path / "dpo"
    summary = dpo.run_dpo(_config(base_run, out, data, steps=30))
    assert summary["first_loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert summary["heldout_before"]["reward_accuracy"] == 0.5  # every margin is 0: ties count half
    assert summary["heldout_after"]["reward_accuracy"] > 0.8
    assert summary["heldout_after"]["reward_margin"] > 0
    records = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert {"logp_chosen", "logp_rejected", "reward_margin", "reward_accuracy"} <= set(train[-1])
    assert (out / "train" / dpo.REFERENCE_FILE).is_file()
    report = (out / "posttrain_report.html").read_text()
    assert "logp_chosen" in report and "logp_rejected" in report and "heldout_reward_accuracy" in report

    # A rerun over the same parent and pairs reads the cached reference instead of computing it.
    def no_recompute(*args, **kwargs):
        raise AssertionError("reference log-probs recomputed")

    monkeypatch.setattr(dpo, "reference_logps", no_recompute)
    cfg = _config(base_run, tmp_path / "dpo2", data, steps=1)
    stage = dpo.open_stage(cfg, "dpo")
    stage.train_dir.mkdir(parents=True)
    (stage.train_dir / dpo.REFERENCE_FILE).write_text((out / "train" / dpo.REFERENCE_FILE).read_text())
    again = dpo.run_dpo(cfg, stage=stage)
    assert again["first_loss"] == pytest.approx(math.log(2), abs=1e-4)


@pytest.mark.slow
def test_simpo_needs_no_reference_and_raises_logp_accuracy(base_run, tmp_path):
    data = _pairs(tmp_path / "pairs.jsonl")
    summary = dpo.run_dpo(_config(base_run, tmp_path / "simpo", data, loss="simpo", steps=30))
    assert not (tmp_path / "simpo" / "train" / dpo.REFERENCE_FILE).exists()
    assert summary["heldout_after"]["logp_accuracy"] > summary["heldout_before"]["logp_accuracy"]


def test_dpo_on_conversations_is_a_user_error(base_run, tmp_path):
    cfg = _config(base_run, tmp_path / "x", tmp_path / "none.jsonl")
    cfg.data.format = "gsm8k"
    with pytest.raises(UserError, match=r"data.format = 'gsm8k' has no preference pairs; DPO reads"):
        dpo.run_dpo(cfg)
