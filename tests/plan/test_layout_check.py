"""Acceptance (issue 23): a layout `smelt plan memory` recommends for a cluster, written into a config as
the `[train]` keys it prints, is accepted by the check `smelt train --check` runs on the layout
(train/parallel/mesh.py's check_layout_keys) for exactly the cluster's GPUs, and `smelt launch` lays it out on the
cluster's nodes with tensor parallelism inside a node.

Models of billions of parameters are too big for the pilot checks that follow in `--check` (they build
the model on the CPU), so for them the layout check, the part that reads these keys, runs alone; the
whole `smelt train --check` runs on a tiny model's recommendation for 4 GPUs."""

import json
import re

import pytest

from smelt.cli import main
from smelt.config import load_config
from smelt.train.parallel.mesh import check_layout_keys

LLAMA_30B = (
    '[model]\npreset = "llama-7b"\nd_model = 6656\nn_layers = 60\nn_heads = 52\nn_kv_heads = 52\n'
    "max_seq_len = 4096\n"
)  # the shape of LLaMA 33B: 32.5B parameters at a 32,768 vocabulary


def recommend(tmp_path, model: str, gpus: int, per_node: int, gpu_memory: float, capsys) -> dict:
    """`smelt plan memory --config` for the cluster; its --json (train_keys, not_built, layout)."""
    path = tmp_path / "model.toml"
    path.write_text(model)
    out = tmp_path / "plan.json"
    args = ["plan", "memory", "--config", path, "--gpus", gpus, "--gpus-per-node", per_node]
    code = main([str(a) for a in [*args, "--gpu-memory", gpu_memory, "--json", out]])
    capsys.readouterr()
    assert code == 0
    return json.loads(out.read_text())


def config_with(tmp_path, model: str, keys: dict) -> str:
    lines = [model, "[train]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in keys.items()]
    path = tmp_path / "run.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def processes(described: str) -> int:
    return int(re.search(r"= (\d+) processes", described).group(1))


@pytest.mark.parametrize(
    ("model", "gpus", "per_node", "gpu_memory", "expected"),
    [
        ('[model]\npreset = "llama-7b"\n', 64, 4, 24, {"tensor_parallel": 4, "data_parallel": 16}),
        ('[model]\npreset = "llama-7b"\n', 64, 8, 80, {"tensor_parallel": 1, "data_parallel": 64}),
    ],
    ids=["7b-64x24GB-tp4", "7b-64x80GB-fsdp64"],
)
def test_recommended_layout_passes_the_check_on_the_clusters_gpus(
    tmp_path, capsys, model, gpus, per_node, gpu_memory, expected
):
    plan = recommend(tmp_path, model, gpus, per_node, gpu_memory, capsys)
    assert plan["not_built"] == []
    keys = plan["train_keys"]
    assert {k: keys[k] for k in expected} == expected and keys["parallel"] == "fsdp"
    path = config_with(tmp_path, model, keys)
    assert processes(check_layout_keys(load_config(path))) == gpus

    code = main(["launch", path, "--nodes", str(gpus // per_node), "--gpus-per-node", str(per_node)])
    out = capsys.readouterr().out
    assert code == 0 and f"= {gpus} processes: {gpus // per_node} node(s)" in out
    if keys["tensor_parallel"] > 1:
        assert re.search(r"tp +4  inside a node", out)


def test_30b_on_256_gpus_with_pipeline_stages(tmp_path, capsys):
    """The plan's TP 4 x PP 2 x DP 32: once plan/layout_keys.py emits train.pipeline_parallel (pipeline
    parallelism built), the check accepts all 256 GPUs; until then the plan says PP is not built, and
    its keys without PP are refused by `smelt launch` on the 256 GPUs, naming the key to change."""
    plan = recommend(tmp_path, LLAMA_30B, 256, 8, 80, capsys)
    keys = plan["train_keys"]
    assert keys["tensor_parallel"] == 4 and keys["data_parallel"] == 32
    path = config_with(tmp_path, LLAMA_30B, keys)
    if keys.get("pipeline_parallel", 1) == 2:
        assert plan["not_built"] == []
        assert processes(check_layout_keys(load_config(path))) == 256
        assert main(["launch", path, "--nodes", "32", "--gpus-per-node", "8"]) == 0
        return
    assert plan["not_built"] and plan["not_built"][0].startswith("PP 2: pipeline parallelism is not built")
    assert processes(check_layout_keys(load_config(path))) == 128  # TP x DP: half the cluster
    assert main(["launch", path, "--nodes", "32", "--gpus-per-node", "8"]) == 2
    assert "train.data_parallel (32) x train.tensor_parallel (4) = 128 processes" in capsys.readouterr().err


def test_plan_memory_json_keys_in_a_config_file_pass_the_layout_check(tmp_path, capsys):
    """plan memory's keys for 4 GPUs, written into a config file and loaded as a user would, pass the
    layout check `smelt train --check` runs (its pilot checks on recommended keys are covered by
    tests/train/test_tensor_parallel_plan.py)."""
    model = (
        f'[run]\nname = "tiny"\ndir = "{tmp_path / "runs"}"\n[model]\nd_model = 64\nn_layers = 2\n'
        "n_heads = 4\nn_kv_heads = 2\nmax_seq_len = 64\n[tokenizer]\nvocab_size = 384\n"
    )
    path = tmp_path / "model.toml"
    path.write_text(model + "[train]\nseq_len = 64\n")
    out = tmp_path / "plan.json"
    args = ["plan", "memory", "--config", path, "--gpus", 4, "--gpus-per-node", 2]
    args += ["--global-batch-tokens", 1024]
    assert main([str(a) for a in [*args, "--json", out]]) == 0
    keys = json.loads(out.read_text())["train_keys"]
    assert keys["data_parallel"] == 4 and keys["parallel"] == "fsdp"
    capsys.readouterr()
    config = config_with(tmp_path, model, {**keys, "tokens": 1024 * 4, "eval_every": 0, "precision": "fp32"})
    assert processes(check_layout_keys(load_config(config))) == 4
