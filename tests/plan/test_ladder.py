"""`smelt ladder`: rung shapes and budgets, cluster commands, rung directories, and a tiny ladder on CPU."""

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from smelt.config import load_config
from smelt.errors import UserError
from smelt.model.flops import count_params
from smelt.model.sizing import preset_config
from smelt.plan import ladder as L

SHAKESPEARE = "corpus/prose/tinyshakespeare/input.txt"


def base_config(tmp_path, corpus=None, **train):
    """A tiny pipeline: Shakespeare in ~10 kB documents, a 384-token BPE, a d=64 two-layer model."""
    corpus = corpus or tmp_path / "corpus"
    train_lines = "\n".join(f"{k} = {v}" for k, v in train.items())
    text = f"""
[run]
name = "base"
dir = "{tmp_path / "runs"}"
seed = 1

[data]
min_chars = 200
val_fraction = 0.1
workers = 1

[data.langid]
enabled = false

[[data.sources]]
name = "shakespeare"
format = "text"
root = "{corpus}"
include = ["*.txt"]
filters = []

[tokenizer]
vocab_size = 384
fim_tokens = false
chat_tokens = false
spare_tokens = 0
sample_bytes = 2_000_000

[tokens]
workers = 1
allow_repeat = true

[model]
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = 4
max_seq_len = 64

[train]
seq_len = 64
micro_batch = 16
batch_tokens = 1024
lr = 3e-3
eval_every = 0
eval_tokens = 16384
threads = 1
log_every = 50
precision = "fp32"
device = "cpu"
{train_lines}

[checkpoint]
every_steps = 0
"""
    path = tmp_path / "base.toml"
    path.write_text(text)
    return path


def test_chinchilla_ladder_spans_sizes_at_20_tokens_per_parameter():
    base = preset_config("llama-124m")
    rungs = L.chinchilla_ladder(base, 50_304, 2**19, sizes=5)
    params = [r.params for r in rungs]
    top = count_params(base, 50_304)["non_embedding"]
    assert len(rungs) == 5 and params == sorted(params)
    assert params[-1] == pytest.approx(top, rel=0.05) and params[0] == pytest.approx(top / 32, rel=0.3)
    steps = np.diff(np.log(params))
    assert np.all(steps > 0.5) and np.all(steps < 1.3)  # roughly log-spaced
    for r in rungs:
        assert r.tokens / r.params == pytest.approx(20, rel=0.05)
        assert r.tokens % 2**19 == 0
        assert r.d_model // r.n_heads == 64  # the base's head size
        assert 24 <= r.d_model / r.n_layers <= 128


def test_token_multipliers_and_isoflop_grid():
    base = preset_config("tiny-1m")
    rungs = L.chinchilla_ladder(base, 384, 1024, sizes=4, multipliers=(0.5, 2.0))
    assert len(rungs) == 8
    ratios = sorted({round(r.tokens / r.params) for r in rungs})
    assert ratios[0] <= 12 and ratios[-1] >= 38
    grid = L.isoflop_ladder(base, 384, 1024, computes=[1e12, 1e13], sizes=5)
    assert len(grid) == 10
    for r in grid:
        compute = 1e12 if r.name < grid[5].name else 1e13
        assert r.compute == pytest.approx(compute, rel=0.1)
    assert L.ladder_warnings(L.chinchilla_ladder(base, 384, 1024, sizes=4), None)[0].startswith("every rung")
    # At tiny computes the shapes round to the same few sizes: the grid says which profiles are too thin.
    thin = L.isoflop_ladder(base, 384, 1024, computes=[3e9, 3e12], sizes=5)
    (warning,) = L.ladder_warnings(thin, None, isoflop=True)
    assert warning.startswith("compute 3.04e+09 has fewer than 3 distinct sizes")
    assert L.ladder_warnings(thin, unique_tokens=10_000, isoflop=True)[0].startswith("rung r")  # epochs


def test_emitted_commands_reproduce_each_rung(tmp_path):
    config = base_config(tmp_path)
    cfg = load_config(config)
    rungs = L.chinchilla_ladder(cfg.model, 384, 1024, sizes=3, tokens_per_param=10)
    commands = L.train_commands(cfg, str(config), ["train.lr=0.002"], rungs, gpus_per_run=8)
    for rung, command in zip(rungs, commands, strict=True):
        words = shlex.split(command)
        assert words[:6] == ["torchrun", "--standalone", "--nproc-per-node", "8", "-m", "smelt.cli"]
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        rebuilt = load_config(words[words.index("train") + 1], sets)
        expected = L.rung_config(cfg, rung)
        assert rebuilt.model == expected.model
        assert rebuilt.train.tokens == rung.tokens and rebuilt.train.lr == 0.002
        assert rebuilt.run_dir == expected.run_dir
        # the same global batch on 8 ranks: whole micro batches per rank, accumulation for the rest
        t = rebuilt.train
        assert (
            t.batch_tokens == expected.train.batch_tokens
            and t.batch_tokens % (t.seq_len * t.micro_batch * 8) == 0
        )
    assert L.train_commands(cfg, str(config), [], rungs, gpus_per_run=1)[0].count("micro_batch") == 0
    with pytest.raises(UserError, match="--gpus-per-run 32"):
        L.train_commands(cfg, str(config), [], rungs, gpus_per_run=32)
    script = L.slurm_script(cfg, str(config), [], rungs, 4)
    assert f"#SBATCH --array=0-{len(rungs) - 1}" in script and script.count("torchrun") == len(rungs)


def test_prepare_links_the_base_run_data(tmp_path, cli, capsys):
    config = base_config(tmp_path)
    assert cli(["ladder", str(config), "--sizes", "3", "--prepare", "--min-params", "5000"]) == 0
    plan = json.loads((tmp_path / "runs/base/ladder/ladder.json").read_text())
    assert len(plan["rungs"]) == 3
    rung_dir = tmp_path / "runs/base/ladder" / plan["rungs"][0]["name"]
    for name in ("documents", "tokenizer", "tokens"):
        link = rung_dir / name
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve() == (tmp_path / "runs/base" / name).resolve()
    saved = json.loads((rung_dir / "config.json").read_text())
    assert saved["model"]["d_model"] == plan["rungs"][0]["d_model"]
    # Emitting for a cluster writes the data-stage commands, one torchrun line per rung and the fit.
    assert cli(["ladder", str(config), "--sizes", "3", "--emit", "slurm", "--min-params", "5000"]) == 0
    commands = (tmp_path / "runs/base/ladder/commands.sh").read_text().splitlines()
    assert any(c.startswith("smelt curate") for c in commands) and commands[-1].startswith(
        "smelt scaling fit"
    )
    assert (tmp_path / "runs/base/ladder/slurm.sh").is_file()
    capsys.readouterr()


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--sizes", "1"], "--sizes must be between 2 and 12"),
        (["--isoflop"], "--isoflop needs --computes"),
        (["--min-params", "1e9"], "--min-params"),
        (["--token-multipliers", "0,1"], "--token-multipliers"),
    ],
)
def test_ladder_user_errors(tmp_path, cli, capsys, argv, needle):
    assert cli(["ladder", str(base_config(tmp_path)), *argv]) == 2
    assert needle in capsys.readouterr().err


@pytest.mark.slow
def test_tiny_ladder_trains_on_cpu_and_fits(tmp_path, shared_data, cli, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = (shared_data / SHAKESPEARE).read_text()
    paragraphs, chunk, parts = text.split("\n\n"), [], 0
    for paragraph in paragraphs:
        chunk.append(paragraph)
        if sum(map(len, chunk)) > 10_000:
            (corpus / f"part{parts:03d}.txt").write_text("\n\n".join(chunk))
            chunk, parts = [], parts + 1
    config = base_config(tmp_path, corpus)
    argv = ["ladder", str(config), "--sizes", "4", "--min-params", "4000", "--max-params", "25000",
            "--tokens-per-param", "8", "--token-multipliers", "0.5,2", "--run", "--bootstrap", "20"]  # fmt: skip
    assert cli(argv) == 0
    out = capsys.readouterr().out
    assert "L(N, D) = E + A / N^alpha" in out
    ladder_dir = tmp_path / "runs/base/ladder"
    plan = json.loads((ladder_dir / "ladder.json").read_text())
    results = plan["results"]
    assert len(results) == 8 and all(r["final_val_loss"] is not None for r in results)
    # The largest model (on its longest budget) has the lowest loss.
    best = min(results, key=lambda r: r["final_val_loss"])
    assert best["params"] == max(r["params"] for r in results)
    fit = json.loads((ladder_dir / "scaling_fit/fit.json").read_text())
    assert fit["n_points"] == 8
    assert fit["law"]["alpha"] > 0 and fit["law"]["beta"] > 0
    assert math.isfinite(fit["objective"]) and (ladder_dir / "scaling_fit/fit.svg").is_file()
    # Rerunning finds every rung up to date; `smelt scaling fit` on the directory reads the same runs.
    assert cli([*argv[:-3], "--run", "--bootstrap", "0"]) == 0
    assert "cached" in capsys.readouterr().out
    assert cli(["scaling", "fit", str(ladder_dir), "--bootstrap", "0", "--out", str(tmp_path / "fit2")]) == 0
    again = json.loads((tmp_path / "fit2/fit.json").read_text())
    for key in ("E", "A", "B", "alpha", "beta"):
        assert again["law"][key] == pytest.approx(fit["law"][key], rel=1e-9)

    # The emitted cluster command of the smallest rung runs as written under torchrun (2 CPU processes).
    assert cli([*argv[:-3], "--emit", "torchrun", "--gpus-per-run", "2"]) == 0
    lines = (ladder_dir / "commands.sh").read_text().splitlines()
    words = shlex.split(next(line for line in lines if line.startswith("torchrun")))
    words[0] = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1", "SMELT_PEAK_FLOPS": "1e12"}
    done = subprocess.run([*words, "--force"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rung = ladder_dir / plan["rungs"][0]["name"] / "train"
    final = sorted(p for p in (rung / "checkpoints").iterdir() if (p / "COMMITTED").is_file())[-1]
    assert json.loads((final / "meta.json").read_text())["world_size"] == 2
    assert json.loads((rung / "summary.json").read_text())["final_val_loss"] > 0


def test_rungs_on_more_gpus_than_a_node_are_multi_node_launches(tmp_path):
    config = base_config(tmp_path, tensor_parallel=2)
    cfg = load_config(config)
    rungs = L.chinchilla_ladder(cfg.model, 384, 1024, sizes=3, tokens_per_param=10)
    for rung, command in zip(rungs, L.train_commands(cfg, str(config), [], rungs, 16, 8), strict=True):
        words = shlex.split(command)
        assert words[:11] == [
            "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "${MASTER_ADDR:?the first node}:29500", "--rdzv-id", f"smelt-{rung.name}",
        ]  # fmt: skip
        sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
        # 16 GPUs in replicas of tensor_parallel 2: 8 data-parallel ranks share the 16 sequences a step.
        assert sets[-2:] == ["train.batch_tokens=1024", "train.micro_batch=2"]
    script = L.slurm_script(cfg, str(config), [], rungs, 16, 8)
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=8\n" in script
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in script
    assert script.count('srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8') == len(rungs)
    assert '--rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID"' in script
    with pytest.raises(UserError, match=r"--gpus-per-run 12 spans nodes of --gpus-per-node 8 .* \(8 or 16\)"):
        L.train_commands(cfg, str(config), [], rungs, 12, 8)
