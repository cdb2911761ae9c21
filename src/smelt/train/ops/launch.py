"""`smelt launch CONFIG --nodes N --gpus-per-node G [--slurm]`: the torchrun (or sbatch) text that trains
CONFIG on a cluster of that shape, after checking its `[train]` mesh keys against N x G processes.

torchrun gives the ranks of one node consecutive numbers (node k runs ranks k G to k G + G - 1), and the
mesh is laid out row-major over MESH_DIMS with "tp" innermost (train/parallel/mesh.py). So a dimension's groups
stay inside a node exactly when its ranks fall into one block of G; the launch says, per dimension,
whether its traffic stays on the node's own links (NVLink) or crosses the network, and warns when
tensor parallelism (an exchange inside every layer) crosses it.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from smelt.config import Config
from smelt.errors import UserError
from smelt.train.batching import batch_plan
from smelt.train.parallel.mesh import MESH_DIMS, MeshLayout, layout_for

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class Cluster:
    """The shape of a launch: nodes x processes per node."""

    nodes: int
    gpus_per_node: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise UserError(
                f"--nodes ({self.nodes}) and --gpus-per-node ({self.gpus_per_node}) must both be at least 1."
            )

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.gpus_per_node


def nodes_spanned(layout: MeshLayout, cluster: Cluster) -> dict[str, int]:
    """For every mesh dimension of size > 1: the most nodes one of its groups spans (1: inside a node).

    A group of a dimension is the ranks whose coordinates differ only along it; counted rank by rank,
    since a group may straddle a node boundary even when it is smaller than a node (a size that does not
    divide the node's process count)."""
    spans: dict[str, int] = {}
    coordinates = [layout.coordinates(rank) for rank in range(layout.world_size)]
    for dim, size in zip(MESH_DIMS, layout.shape, strict=True):
        if size == 1:
            continue
        groups: dict[tuple[int, ...], set[int]] = {}
        for rank, at in enumerate(coordinates):
            key = tuple(at[other] for other in MESH_DIMS if other != dim)
            groups.setdefault(key, set()).add(cluster.node_of(rank))
        spans[dim] = max(len(nodes) for nodes in groups.values())
    return spans


def check_launch(cfg: Config, cluster: Cluster) -> tuple[MeshLayout, dict[str, int]]:
    """The mesh of `cluster`'s processes, and the nodes each of its dimensions spans. ConfigError when the
    `[train]` keys cannot be laid out on that many processes or the global batch does not split over its
    data-parallel ranks."""
    layout = layout_for(cfg, cluster.world_size)
    if cfg.train.batch_tokens:
        batch_plan(cfg.train, layout.dp)
    return layout, nodes_spanned(layout, cluster)


def placement_lines(layout: MeshLayout, spans: dict[str, int], cluster: Cluster) -> list[str]:
    """One line per mesh dimension: its size and whether its traffic stays inside a node."""
    lines = []
    for dim, size in zip(MESH_DIMS, layout.shape, strict=True):
        if size == 1:
            continue
        where = "inside a node" if spans[dim] == 1 else f"across {spans[dim]} nodes (over the network)"
        lines.append(f"{dim:<13} {size:>5}  {where}")
    if spans.get("tp", 1) > 1:
        lines.append(
            f"warning: tensor parallelism exchanges activations inside every layer; across nodes that traffic "
            f"crosses the network. Keep train.tensor_parallel <= {cluster.gpus_per_node} (one node)."
        )
    if not lines:
        lines.append("one process: no mesh to lay out")
    return lines


def torchrun_args(cluster: Cluster, endpoint: str, rdzv_id: str) -> list[str]:
    """torchrun's launch options: a standalone rendezvous on one node, c10d at `endpoint` across nodes."""
    if cluster.nodes == 1:
        return ["torchrun", "--standalone", "--nproc-per-node", str(cluster.gpus_per_node)]
    return [
        "torchrun", "--nnodes", str(cluster.nodes), "--nproc-per-node", str(cluster.gpus_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", rdzv_id,
    ]  # fmt: skip


def train_args(config_path: str, overrides: list[str]) -> list[str]:
    sets = [arg for override in overrides for arg in ("--set", override)]
    return ["-m", "smelt.cli", "train", config_path, *sets]


def _join(words: list[str]) -> str:
    # Words that name shell variables ("$MASTER_ADDR:29500") stay expandable; the rest are quoted.
    return " ".join(f'"{w}"' if w.startswith("$") else shlex.quote(w) for w in words)


def torchrun_text(
    cfg: Config, config_path: str, overrides: list[str], cluster: Cluster, endpoint: str, rdzv_id: str
) -> str:
    """The command to run on every node, from the same directory."""
    command = (
        _join(torchrun_args(cluster, endpoint, rdzv_id))
        + " \\\n    "
        + _join(train_args(config_path, overrides))
    )
    if cluster.nodes == 1:
        return f"# on the node ({cluster.gpus_per_node} processes):\n{command}\n"
    return (
        f"# on every node ({cluster.nodes} nodes x {cluster.gpus_per_node} processes), from the same directory;\n"
        f"# {endpoint.rsplit(':', 1)[0]} is one of the nodes (usually the first), its port open to the others,\n"
        f"# and {cfg.run_dir} on a filesystem every node sees:\n{command}\n"
    )


def slurm_text(
    cfg: Config,
    config_path: str,
    overrides: list[str],
    cluster: Cluster,
    port: int,
    notes: tuple[str, ...] | list[str] = (),
) -> str:
    """An sbatch script: one task per node, each running torchrun, meeting at the first node's address."""
    launch = [
        "srun", "torchrun", "--nnodes", "$SLURM_NNODES", "--nproc-per-node", str(cluster.gpus_per_node),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"$MASTER_ADDR:{port}", "--rdzv-id", "$SLURM_JOB_ID",
    ]  # fmt: skip
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name=smelt-{cfg.run.name}",
        f"#SBATCH --nodes={cluster.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={cluster.gpus_per_node}",
        "#SBATCH --output=slurm-%j.out",
        *notes,
        "# Run the data stages first (curate, tokenizer train, tokenize) into the same run directory.",
        "set -euo pipefail",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_ADDR",
        _join(launch) + " \\",
        "    " + _join(train_args(config_path, overrides)),
    ]) + "\n"  # fmt: skip


def launch_text(
    cfg: Config,
    config_path: str,
    overrides: list[str],
    cluster: Cluster,
    *,
    slurm: bool = False,
    endpoint: str | None = None,
    port: int = DEFAULT_PORT,
    rdzv_id: str | None = None,
) -> str:
    """The checked layout, where each mesh dimension runs, and the launch: torchrun lines or an sbatch script."""
    layout, spans = check_launch(cfg, cluster)
    head = [f"# {layout.describe()} = {layout.world_size} processes: {cluster.nodes} node(s) x "
            f"{cluster.gpus_per_node} processes"]  # fmt: skip
    head += [f"#   {line}" for line in placement_lines(layout, spans, cluster)]
    if slurm:
        return slurm_text(cfg, config_path, overrides, cluster, port, head)
    endpoint = endpoint or f"HOST:{port}"
    body = torchrun_text(cfg, config_path, overrides, cluster, endpoint, rdzv_id or f"smelt-{cfg.run.name}")
    return "\n".join(head) + "\n" + body
