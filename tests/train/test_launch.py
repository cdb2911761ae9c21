"""`smelt launch`: the mesh keys checked against nodes x GPUs, where each mesh dimension runs, and the
torchrun / sbatch text, whose words parse back to the config and overrides given."""

import shlex

import pytest

from smelt.cli import main
from smelt.errors import UserError
from smelt.train.ops.launch import Cluster, nodes_spanned, placement_lines
from smelt.train.parallel.mesh import MeshLayout

CONFIG = """
[run]
name = "big"
[model]
d_model = 64
n_layers = 2
n_heads = 8
n_kv_heads = 8
max_seq_len = 64
[train]
seq_len = 64
micro_batch = 1
batch_tokens = 1024
parallel = "fsdp"
tensor_parallel = 4
"""


def run_cli(args: list, capsys) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text(CONFIG)
    return path


def test_tensor_parallel_inside_a_node_and_data_parallel_across_nodes():
    spans = nodes_spanned(MeshLayout(dp_shard=4, tp=4), Cluster(nodes=2, gpus_per_node=8))
    assert spans == {"dp_shard": 2, "tp": 1}


def test_a_group_smaller_than_a_node_can_still_straddle_two():
    # tp 3 on nodes of 2: ranks {0, 1, 2} sit on nodes 0 and 1, {3, 4, 5} on nodes 1 and 2.
    layout = MeshLayout(dp_replicate=2, tp=3)
    cluster = Cluster(nodes=3, gpus_per_node=2)
    assert nodes_spanned(layout, cluster) == {"dp_replicate": 2, "tp": 2}
    assert any(
        "Keep train.tensor_parallel <= 2" in line
        for line in placement_lines(layout, {"tp": 2, "dp_replicate": 2}, cluster)
    )


def test_emitted_torchrun_command_parses_back_to_the_config_and_overrides(config, capsys):
    override = 'run.name="big run"'
    code, out, _ = run_cli(
        ["launch", config, "--nodes", 2, "--gpus-per-node", 8, "--set", override, "--endpoint", "n0:29400"],
        capsys,
    )
    assert code == 0
    assert "dp_shard          4  across 2 nodes" in out and "tp                4  inside a node" in out
    command = "\n".join(line for line in out.splitlines() if not line.startswith("#"))
    words = shlex.split(command.replace("\\\n", " "))
    assert words[:11] == [
        "torchrun", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "n0:29400", "--rdzv-id", "smelt-big run",
    ]  # fmt: skip
    assert words[11:] == ["-m", "smelt.cli", "train", str(config), "--set", override]


def test_one_node_uses_a_standalone_rendezvous(config, capsys):
    code, out, _ = run_cli(["launch", config, "--nodes", 1, "--gpus-per-node", 4], capsys)
    assert code == 0 and "torchrun --standalone --nproc-per-node 4 \\" in out and "rdzv" not in out


def test_slurm_script_meets_at_the_first_node(config, capsys):
    code, out, _ = run_cli(["launch", config, "--nodes", 4, "--gpus-per-node", 8, "--slurm"], capsys)
    assert code == 0
    assert (
        out.startswith("#!/bin/bash\n")
        and "#SBATCH --nodes=4\n" in out
        and "#SBATCH --gpus-per-node=8" in out
    )
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)' in out
    assert (
        'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --rdzv-backend c10d '
        '--rdzv-endpoint "$MASTER_ADDR:29500" --rdzv-id "$SLURM_JOB_ID"'
    ) in out
    assert "dp_shard          8  across 4 nodes" in out


def test_keys_that_do_not_fit_the_cluster_name_the_key(config, capsys):
    code, _, err = run_cli(
        ["launch", config, "--nodes", 2, "--gpus-per-node", 8, "--set", "train.data_parallel=2"], capsys
    )
    assert code == 2
    assert "train.data_parallel (2) x train.tensor_parallel (4) = 8 processes, but this launch has 16" in err


def test_batch_that_does_not_split_over_the_data_parallel_ranks(config, capsys):
    # 8 data-parallel ranks x micro batches of 4 sequences of 64 = 2,048 tokens a step at the least.
    code, _, err = run_cli(
        ["launch", config, "--nodes", 4, "--gpus-per-node", 8, "--set", "train.micro_batch=4"], capsys
    )
    assert code == 2 and "train.batch_tokens = 1024 is not a multiple of" in err


def test_a_cluster_of_no_nodes_is_refused():
    with pytest.raises(UserError, match=r"--nodes \(0\) and --gpus-per-node \(8\) must both be at least 1"):
        Cluster(nodes=0, gpus_per_node=8)
