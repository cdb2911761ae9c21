"""`smelt plan rehearse`: the recommended layout of a big plan, in miniature on gloo processes: trained,
killed past a checkpoint, resumed under another layout (rehearse.py)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from smelt.rehearse import resharded_layout, scaled_layout


def recommendation(tp: int, pp: int, dp: int) -> SimpleNamespace:
    return SimpleNamespace(layout=SimpleNamespace(tp=tp, pp=pp, dp=dp, zero=1, micro_batch=1))


def test_the_plans_degrees_are_kept_where_the_machine_allows():
    assert scaled_layout(recommendation(4, 2, 32), 8) == {
        "tensor_parallel": 2,
        "pipeline_parallel": 2,
        "data_parallel": 2,
    }
    assert scaled_layout(recommendation(8, 1, 32), 8) == {
        "tensor_parallel": 2,
        "pipeline_parallel": 1,
        "data_parallel": 2,
    }
    assert scaled_layout(recommendation(4, 2, 32), 4) == {
        "tensor_parallel": 2,
        "pipeline_parallel": 2,
        "data_parallel": 1,
    }
    assert scaled_layout(recommendation(1, 1, 64), 8) == {
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "data_parallel": 2,
    }


def test_the_second_launch_uses_another_layout_of_as_many_processes_or_fewer():
    for tp, pp, dp in [(2, 2, 2), (2, 1, 1), (1, 2, 2), (1, 2, 1), (1, 1, 2), (1, 1, 1)]:
        first = {"tensor_parallel": tp, "pipeline_parallel": pp, "data_parallel": dp}
        second = resharded_layout(first)
        assert second != first
        assert second["tensor_parallel"] * second["pipeline_parallel"] * second["data_parallel"] <= max(
            2, tp * pp * dp
        )


CONFIG = """
[run]
name = "big"
dir = "{runs}"
seed = 3

[data]
min_chars = 200
val_fraction = 0.05

[[data.sources]]
name = "speeches"
format = "text"
root = "{corpus}"
include = ["*.txt"]

[tokenizer]
vocab_size = 512

[tokens]
workers = 1

[model]
d_model = 6656
n_layers = 60
n_heads = 52
n_kv_heads = 52
max_seq_len = 2048
tie_embeddings = false

[train]
seq_len = 2048
"""


@pytest.mark.slow
def test_a_30b_plan_rehearses_at_8_processes_and_resumes_under_another_layout(tmp_path, shared_data):
    """A LLaMA-33B shape on 256 GPUs: TP 4 x PP 2 x DP 32 planned, TP 2 x PP 2 x DP 2 rehearsed, resumed
    as TP 1 x PP 2 x DP 4; the steps both launches trained agree."""
    config = tmp_path / "big.toml"
    corpus = shared_data / "corpus" / "prose" / "nltk_inaugural"
    config.write_text(CONFIG.format(runs=tmp_path / "runs", corpus=corpus))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SMELT_QUIET": "1"}
    smelt = [sys.executable, "-m", "smelt"]
    for stage in (["curate"], ["tokenizer", "train"], ["tokenize"]):
        subprocess.run([*smelt, *stage, str(config)], env=env, check=True, capture_output=True, timeout=600)
    out = tmp_path / "rehearsal.json"
    proc = subprocess.run(
        [*smelt, "plan", "rehearse", str(config), "--gpus", "256", "--global-batch-tokens", "4194304",
         "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["plan"]["planned"] == {"tensor_parallel": 4, "pipeline_parallel": 2, "data_parallel": 32}
    assert result["plan"]["rehearsed"] == {"tensor_parallel": 2, "pipeline_parallel": 2, "data_parallel": 2}
    assert result["first_processes"] == result["resharded_processes"] == 8
    assert result["resumed_from_step"] == 3 and result["finished_steps"] == 6
    assert result["steps_compared"] >= 1 and result["agree"]
    assert "TP 2 x PP 2 x DP 2" in proc.stdout
