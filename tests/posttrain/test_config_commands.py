"""Post-training configs (typed, validated, the example files load) and the command handlers."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from smelt.errors import ConfigError, UserError
from smelt.posttrain.config import load_posttrain_config

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "posttrain").glob("*.toml"))


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name != "base.toml"], ids=lambda p: p.name)
def test_example_configs_load(path):
    cfg = load_posttrain_config(path)
    assert cfg.stage in path.name and cfg.run.init_from and cfg.run.out


def test_unknown_key_and_out_of_range_value_name_the_key(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('stage = "dpo"\n[optim]\nlr = 1e-3\nstep = 5\n')
    with pytest.raises(ConfigError, match=r"unknown key optim.step \(did you mean 'steps'\?\)"):
        load_posttrain_config(path)
    with pytest.raises(
        ConfigError, match=r"grpo.group_size = 1 is out of range; it must lie in \[2, 4,096\]"
    ):
        load_posttrain_config(None, ["grpo.group_size=1"])
    with pytest.raises(ConfigError, match=r"dpo.loss = 'ipo' is not one of 'dpo', 'simpo'"):
        load_posttrain_config(None, ["dpo.loss=ipo"])


def test_building_the_parser_does_not_import_torch():
    code = (
        "import argparse, sys\n"
        "from smelt.cli.posttrain import add_parsers\n"
        "p = argparse.ArgumentParser(); add_parsers(p.add_subparsers(dest='command'))\n"
        "p.parse_args(['posttrain', 'run', 'x.toml'])\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _parse(argv):
    from smelt.cli.posttrain import add_parsers

    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


def test_run_without_a_parent_is_a_user_error(tmp_path):
    sft = CONFIGS[0].parent / "sft_gsm8k.toml"
    args = _parse(["posttrain", "run", str(sft), "--set", "run.init_from=''"])
    with pytest.raises(UserError, match=r"run.init_from is empty: name the checkpoint"):
        args.func(args)
    args = _parse(["posttrain", "run", str(CONFIGS[0].parent / "base.toml")])
    with pytest.raises(UserError, match=r"base.toml is a pipeline config .* run it with `smelt run`"):
        args.func(args)


@pytest.mark.slow
def test_run_sft_then_eval_through_the_handlers(base_run, tmp_path, capsys):
    config = tmp_path / "sft.toml"
    config.write_text(
        f'stage = "sft"\n[run]\ninit_from = "{base_run}"\nout = "{tmp_path / "sft"}"\n'
        '[data]\nformat = "addition"\naddition_items = 60\nheldout = 10\n'
        "[optim]\nsteps = 3\nbatch_size = 4\nseq_len = 64\n"
    )
    args = _parse(["posttrain", "run", str(config)])
    assert args.func(args) == 0
    assert "val_loss" in capsys.readouterr().out
    args = _parse(["posttrain", "eval", str(tmp_path / "sft"), "--addition", "4", "--max-new-tokens", "4"])
    assert args.func(args) == 0
    result = json.loads((tmp_path / "sft" / "posttrain_eval" / "step_0000003.json").read_text())
    assert result["stage"] == "sft" and result["addition_chat"]["items"] == 4
    assert len(result["gallery"]) == 5
    # The same command again finds the run complete: it resumes at the final checkpoint and trains nothing.
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    args = _parse(["posttrain", "run", str(config)])
    assert args.func(args) == 0
    again = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert again["resumed_from_step"] == 3 and again["val_loss"] == summary["val_loss"]
    assert again["train_loss"] == summary["train_loss"]
    # Another config on the same run.out is refused without --force.
    with pytest.raises(
        UserError, match=r"already holds committed sft checkpoints, and the latest cannot be resumed"
    ):
        args = _parse(["posttrain", "run", str(config), "--set", "optim.lr=1e-3"])
        args.func(args)
