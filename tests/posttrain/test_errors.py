"""Every user error of post-training names the key, file or record and the fix."""

from __future__ import annotations

import pytest

from smelt.errors import UserError
from smelt.posttrain.chat import read_chat, read_hh_rlhf
from smelt.posttrain.config import config_from_dict
from smelt.posttrain.data import conversation_split, split_heldout
from smelt.posttrain.evaluate import evaluate_run
from smelt.posttrain.rewards import exact_number, resolve_reward
from smelt.posttrain.sft import run_sft


def test_data_file_errors(tmp_path):
    with pytest.raises(
        UserError, match=r"data file .*missing.jsonl does not exist; check posttrain data.path"
    ):
        read_chat(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n{oops\n')
    with pytest.raises(UserError, match=r"bad.jsonl:1: \"messages\" must be a non-empty list"):
        read_chat(bad)
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{oops\n')
    with pytest.raises(UserError, match=r"bad.jsonl line 2 is not JSON"):
        read_chat(bad)
    bad.write_text('{"messages": [{"role": "user", "content": "x"}]}\n')
    with pytest.raises(UserError, match=r"no record is a hh-rlhf pair .*is this the right data.format"):
        read_hh_rlhf(bad)


def test_data_section_errors():
    cfg = config_from_dict({"data": {"format": "preferences", "path": "x.jsonl"}})
    with pytest.raises(
        UserError, match=r"data.format = 'preferences' holds preference pairs, not conversations"
    ):
        conversation_split(cfg.data, 0, "sft")
    cfg = config_from_dict({"data": {"format": "gsm8k"}})
    with pytest.raises(UserError, match=r"data.path is empty: data.format = 'gsm8k' reads a JSONL file"):
        conversation_split(cfg.data, 0, "sft")
    with pytest.raises(UserError, match=r"the stage has no training items"):
        split_heldout([], 4, 0)


def test_reward_errors():
    with pytest.raises(UserError, match=r"the exact_number reward needs an \"answer\" in every item"):
        exact_number("5", {"messages": []})
    with pytest.raises(UserError, match=r"grpo.reward = 'no_such_module:f' cannot be imported"):
        resolve_reward("no_such_module:f")


def test_stage_errors(base_run, tmp_path):
    base = {"run": {"init_from": str(base_run)}, "data": {"format": "addition"}}
    with pytest.raises(UserError, match=r"run.out is empty: name the run directory sft writes"):
        run_sft(config_from_dict(base))
    with pytest.raises(UserError, match=r"is the parent run itself; a sft stage writes a new run"):
        run_sft(config_from_dict({**base, "run": {"init_from": str(base_run), "out": str(base_run)}}))
    with pytest.raises(UserError, match=r"is not a run directory with committed checkpoints"):
        run_sft(config_from_dict({**base, "run": {"init_from": str(tmp_path), "out": str(tmp_path / "o")}}))


def test_eval_without_checkpoints_names_the_folder(tmp_path):
    with pytest.raises(UserError, match=r"no committed checkpoint 'latest' under .*train/checkpoints"):
        evaluate_run(tmp_path)
