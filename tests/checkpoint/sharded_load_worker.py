"""`torchrun --nproc_per_node N sharded_load_worker.py CONFIG.json CHECKPOINT OUT`: build the training
model as the trainer does (train/materialize.py: on the meta device, then this rank's shards), then load
CHECKPOINT into it as a fork does (`--from`, weights only: checkpoint/lineage.py's load_parent) and then
as a resume does (weights and optimizer: checkpoint/store.py's load_training_state). Rank 0 saves to OUT
each rank's resident size (kB) before each load and its high-water mark during it (reset before each,
through /proc/self/clear_refs), with the loaded weights gathered whole and the sum of squares of the
Adam moments. Used by tests/checkpoint/test_sharded_loading.py; run it with MALLOC_MMAP_THRESHOLD_ set
so that the resident size follows the live tensors."""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from smelt.checkpoint.lineage import Parent, load_parent
from smelt.checkpoint.store import load_training_state
from smelt.config import config_from_dict
from smelt.train import materialize
from smelt.train.optim import build_optimizer
from smelt.train.parallel.distributed import init_distributed, shutdown
from smelt.train.parallel.mesh import mesh_for


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor.detach()).clone()


if __name__ == "__main__":
    config_path, checkpoint, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    raw = json.loads(Path(config_path).read_text())
    vocab = int(raw.pop("vocab"))
    cfg = config_from_dict(raw)
    device = torch.device("cpu")
    ctx = init_distributed(device)
    mesh = mesh_for(cfg, ctx.rank, ctx.world_size, device)
    model, wrapped, built = materialize.build_training_model(cfg, vocab, ctx, device, mesh)
    optimizer = build_optimizer(model, cfg.train, device)
    rss = {}
    parent = Parent(checkpoint.parent.parent.parent, checkpoint, 3, 0, None, 0)
    loads = {
        "fork": lambda: load_parent(parent, model, optimizer, with_optimizer=False),
        "resume": lambda: load_training_state(checkpoint, model, optimizer),
    }
    params = {}
    for name, load in loads.items():
        Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from here
        rss[f"before_{name}"] = status_kb("VmRSS")
        load()
        rss[f"peak_{name}"] = status_kb("VmHWM")
        params[name] = {n: whole(p) for n, p in model.named_parameters()}
    moments = sum(
        float(whole(s[k]).double().pow(2).sum())
        for s in optimizer.state.values()
        for k in ("exp_avg", "exp_avg_sq")
    )
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, rss)
    if ctx.rank == 0:
        torch.save({"built": built, "rss_kb": gathered, "params": params, "moments": moments}, out)
    dist.barrier()  # both ranks done before gloo is torn down
    shutdown(ctx)
