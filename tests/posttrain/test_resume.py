"""Post-training survives a kill: SFT, DPO and GRPO killed mid-run (as SIGKILL would) resume from their
last full checkpoint (weights, optimizer, data cursor, RNG) and write the records an uninterrupted run
writes, bit for bit; a stop by SIGTERM saves and exits 75; SFT on 2 processes under FSDP2 matches 1."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smelt.posttrain.config import config_from_dict
from smelt.posttrain.dpo import run_dpo
from smelt.posttrain.grpo import run_grpo
from smelt.posttrain.sft import run_sft

from .test_dpo import _pairs

KILLED = Path(__file__).with_name("killed_posttrain.py")
TIMING = {"tokens_per_s", "wall_time_s", "path"}


def raw_config(stage: str, base: Path, out: Path, data: Path | None = None, steps: int = 8) -> dict:
    optim = {"lr": 2e-3, "steps": steps, "batch_size": 4, "seq_len": 64, "log_every": 1, "eval_every": 4,
             "checkpoint_every": 3, "keep_last": 1}  # fmt: skip
    raw = {"stage": stage, "run": {"init_from": str(base), "out": str(out), "seed": 5}, "optim": optim}
    if stage == "sft":
        raw["data"] = {"format": "addition", "addition_items": 80, "addition_digits": 1, "heldout": 8}
    elif stage == "dpo":
        raw["data"] = {"format": "preferences", "path": str(data), "heldout": 8}
    else:
        raw["data"] = {"format": "addition", "addition_items": 40, "addition_digits": 1, "heldout": 4}
        raw["grpo"] = {
            "group_size": 4,
            "max_new_tokens": 4,
            "kl_coef": 0.05,
            "reward": f"{__name__}:digit_share",
        }
        raw["eval"] = {"items": 4}
        optim["batch_size"] = 2
    return raw


def digit_share(completion: str, item: dict) -> float:
    """A reward a random tiny model already earns sometimes (so GRPO's groups carry signal): the share
    of the reply's characters that are digits."""
    return sum(c.isdigit() for c in completion) / max(len(completion), 1)


def toml_text(raw: dict) -> str:
    """The few shapes these configs use: a top-level string and tables of scalars."""
    lines = [f"stage = {json.dumps(raw['stage'])}"]
    for section, values in raw.items():
        if isinstance(values, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def records(out: Path) -> list[dict]:
    lines = (out / "train" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def progress_records(out: Path) -> list[dict]:
    return [r for r in records(out) if r["kind"] in ("train", "eval")]


def smelt_env() -> dict:
    root = str(Path(__file__).parents[2])  # the GRPO reward is this module's function
    return {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1",
            "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}  # fmt: skip


RUNNERS = {"sft": run_sft, "dpo": run_dpo, "grpo": run_grpo}


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["sft", "dpo", "grpo"])
def test_a_killed_stage_resumes_bit_exactly(stage, base_run, tmp_path):
    data = _pairs(tmp_path / "pairs.jsonl", n=40) if stage == "dpo" else None
    whole = tmp_path / "whole"
    expected = RUNNERS[stage](config_from_dict(raw_config(stage, base_run, whole, data)))
    out = tmp_path / "killed"
    config = tmp_path / "config.toml"
    config.write_text(toml_text(raw_config(stage, base_run, out, data)))
    killed = subprocess.run([sys.executable, str(KILLED), "5", "posttrain", "run", str(config)],
                            env=smelt_env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert killed.returncode == 137, killed.stderr[-3000:]
    assert not (out / "summary.json").exists()
    assert [r["step"] for r in progress_records(out) if r["kind"] == "train"][-1] == 5  # died after step 5
    resumed = RUNNERS[stage](config_from_dict(raw_config(stage, base_run, out, data)))
    assert resumed["resumed_from_step"] == 3
    assert resumed["wall_time_s"] >= resumed["train_time_s"]  # both count the killed attempt's kept steps
    assert progress_records(out) == progress_records(whole)  # every loss, reward and eval, bit for bit
    if stage == "grpo":  # the comparison is not between runs that learned nothing
        assert any(
            r.get("grad_norm", 0) > 0 and r["reward"] > 0
            for r in progress_records(out)
            if r["kind"] == "train"
        )
    superseded = (out / "train" / "metrics.superseded.jsonl").read_text()
    assert '"step": 5' in superseded  # the records after the checkpoint were moved aside, not lost
    figures = {k: v for k, v in expected.items() if k not in ("run_dir", "checkpoint", "report", "resumed_from_step")
               and "time" not in k and "per_s" not in k}  # fmt: skip
    assert {k: resumed[k] for k in figures} == figures


@pytest.mark.slow
def test_sigterm_saves_and_exits_75_then_the_run_resumes(base_run, tmp_path):
    out = tmp_path / "sft"
    raw = raw_config("sft", base_run, out, steps=400)
    raw["optim"].update(checkpoint_every=0, eval_every=0, log_every=1)
    config = tmp_path / "sft.toml"
    config.write_text(toml_text(raw))
    run = subprocess.Popen([sys.executable, "-m", "smelt", "posttrain", "run", str(config)], env=smelt_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    metrics = out / "train" / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.is_file() and '"step": 3,' in metrics.read_text()):
        time.sleep(0.05)
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=300)
    assert run.returncode == 75, err[-3000:]
    assert "Run the same command again to resume" in err
    saved = sorted(p.name for p in (out / "train" / "checkpoints").glob("step_*"))
    assert len(saved) == 1 and int(saved[0].split("_")[1]) >= 3
    raw["optim"]["steps"] = 400
    summary = run_sft(config_from_dict(raw))
    assert summary["resumed_from_step"] == int(saved[0].split("_")[1])
    steps = [r["step"] for r in progress_records(out) if r["kind"] == "train"]
    assert steps == list(range(1, 401))  # no step lost, none twice


def one_and_two_processes(stage: str, raw: dict, tmp_path: Path) -> tuple[list[dict], list[dict]]:
    """The train records of `raw` run here, and of the same config on 2 FSDP2 processes (torchrun)."""
    one, two = tmp_path / "one", tmp_path / "two"
    raw["run"]["out"] = str(one)
    RUNNERS[stage](config_from_dict(raw))
    raw["run"]["out"] = str(two)
    config = tmp_path / f"{stage}.toml"
    config.write_text(toml_text(raw))
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "smelt", "posttrain",
                             "run", str(config), "--set", "run.parallel=fsdp"],
                            env=smelt_env(), capture_output=True, text=True, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return tuple([r for r in progress_records(out) if r["kind"] == "train"] for out in (one, two))  # type: ignore[return-value]


@pytest.mark.slow
def test_sft_on_two_fsdp2_processes_matches_one(base_run, tmp_path):
    raw = raw_config("sft", base_run, tmp_path / "one", steps=20)
    raw["optim"].update(checkpoint_every=10, eval_every=0)
    a, b = one_and_two_processes("sft", raw, tmp_path)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 21))
    for x, y in zip(a, b, strict=True):
        assert abs(x["loss"] - y["loss"]) < 1e-5 and abs(x["grad_norm"] - y["grad_norm"]) < 1e-5
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert (
        abs(summary["val_loss"] - json.loads((tmp_path / "one" / "summary.json").read_text())["val_loss"])
        < 1e-5
    )


@pytest.mark.slow
def test_grpo_on_two_fsdp2_processes_matches_one(base_run, tmp_path):
    """Every rank samples every group (the ranks stay in step through the sharded forwards) and trains
    on its share of the replies; the losses are normalised over all of them."""
    raw = raw_config("grpo", base_run, tmp_path / "one", steps=4)
    raw["optim"].update(checkpoint_every=0, eval_every=0)
    a, b = one_and_two_processes("grpo", raw, tmp_path)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2, 3, 4]
    assert any(r["grad_norm"] > 0 for r in a)  # the comparison is between runs that moved
    for x, y in zip(a, b, strict=True):
        assert x["reward"] == y["reward"]  # the same samples on every rank
        for key in ("loss", "kl", "grad_norm"):
            assert abs(x[key] - y[key]) < 1e-5, (key, x[key], y[key])
