"""`torchrun --nproc_per_node N sharded_init_worker.py CONFIG.json OUT [sharded|whole] [gather|memory]`:
build the training model as the trainer does (train/materialize.py; `whole` builds every rank's whole
model first, as smelt did before sharded initialisation), and rank 0 saves to OUT how it was built and
each rank's peak host memory (ru_maxrss) before and after the build; with `gather` (the default) also
every parameter, whole. Used by tests/train/test_sharded_init.py and bench/scale.py."""

import json
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from smelt.config import config_from_dict
from smelt.train import materialize
from smelt.train.parallel.distributed import init_distributed, shutdown
from smelt.train.parallel.mesh import mesh_for

if __name__ == "__main__":
    config_path, out = sys.argv[1:3]
    mode = sys.argv[3] if len(sys.argv) > 3 else "sharded"
    gather = (sys.argv[4] if len(sys.argv) > 4 else "gather") == "gather"
    raw = json.loads(Path(config_path).read_text())
    vocab = int(raw.pop("vocab", 384))  # the worker's own key: the vocabulary a tokenizer would give
    cfg = config_from_dict(raw)
    device = torch.device("cpu")
    ctx = init_distributed(device)
    mesh = mesh_for(cfg, ctx.rank, ctx.world_size, device)
    if mode == "whole":
        materialize.builds_sharded = lambda *args: False
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model, wrapped, built = materialize.build_training_model(cfg, vocab, ctx, device, mesh)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    whole = {}
    if gather:
        for name, param in model.named_parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param.detach()
            whole[name] = full.clone()
    gathered = [None] * ctx.world_size
    dist.all_gather_object(gathered, (whole, before, peak))
    if ctx.rank == 0:
        merged = {}
        for part, _, _ in gathered:  # pipeline ranks hold different blocks: their union is the model
            merged.update(part)
        params = sum(p.numel() for p in merged.values()) if gather else None
        torch.save({"params": merged, "built": built, "rss_before_kb": [b for _, b, _ in gathered],
                    "rss_peak_kb": [p for _, _, p in gathered], "param_count": params}, out)  # fmt: skip
    dist.barrier()  # both ranks done before gloo is torn down (a rank leaving first can abort the other)
    shutdown(ctx)
