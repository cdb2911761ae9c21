"""Checkpoint costs for a 124M-class model with its AdamW state (about 1.5 GB of fp32 tensors).

Usage: python bench/checkpoint.py [PRESET] [--repeats N]

1. Blocking stall of smelt's async save (`Checkpointer`: DCP async_save, the copy to host memory on a
   background thread, then the write on another) against a synchronous `torch.save` of the same state
   dict, and against smelt's synchronous DCP save. The stall is `save` plus the wait in `before_update`
   (the trainer's call before the optimizer changes weights), measured twice: with nothing in between
   (the whole host copy counts as stall) and with one forward+backward pass of a 2 x 512-token micro
   batch in between, as in training. Also the total time until the async checkpoint is committed
   (write, checksums, fsync, rename, marker).
2. Load time: `load_training_state` (checksums verified) into a fresh model and optimizer.
3. Reshard-load time: the same checkpoint loaded by 2 processes with FSDP2 (torchrun, gloo), each
   reading only its shards of the weights and optimizer state.

On CUDA the async stall is a device-to-host copy; on CPU it is a host memory copy, so the CPU ratio is
the conservative one. Everything is written under a temporary directory on the same disk as /tmp.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import write_result

from smelt.checkpoint.saver import Checkpointer
from smelt.checkpoint.store import load_training_state, model_optim_state
from smelt.model.sizing import preset_config as resolve_preset
from smelt.model.transformer import Transformer
from smelt.train.optim import param_groups

VOCAB = 50_304

RESHARD_WORKER = """
import sys, time, torch, warnings
warnings.filterwarnings("ignore")
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from smelt.checkpoint.store import load_training_state
from smelt.model.sizing import preset_config as resolve_preset
from smelt.model.transformer import Transformer
from smelt.train.optim import param_groups
dist.init_process_group("gloo")
cfg = resolve_preset(sys.argv[2])
model = Transformer(cfg, int(sys.argv[3]))
for block in model.blocks:
    fully_shard(block)
fully_shard(model)
opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4)
dist.barrier()
t = time.perf_counter()
load_training_state(sys.argv[1], model, opt)
dist.barrier()
if dist.get_rank() == 0:
    print(f"RESHARD_LOAD_S {time.perf_counter() - t:.3f}")
dist.destroy_process_group()
"""


def trained_state(preset: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = Transformer(resolve_preset(preset), VOCAB)
    optimizer = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4)
    for p in model.parameters():  # populate Adam moments without a costly forward pass
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("preset", nargs="?", default="llama-124m")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model, optimizer = trained_state(args.preset)
    tensor_bytes = sum(
        t.numel() * t.element_size()
        for t in torch.utils._pytree.tree_leaves(model_optim_state(model, optimizer))
        if isinstance(t, torch.Tensor)
    )
    meta = {"model_config": resolve_preset(args.preset), "vocab_size": VOCAB, "tokens": 0}
    root = Path(tempfile.mkdtemp(prefix="smelt-bench-ckpt-"))
    try:
        sync_torch, sync_dcp, stalls, overlapped, step_s, commits = [], [], [], [], [], []
        batch = torch.randint(0, VOCAB, (2, 512))
        for i in range(args.repeats):
            t = time.perf_counter()
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, root / f"plain{i}.pt"
            )
            sync_torch.append(time.perf_counter() - t)
            (root / f"plain{i}.pt").unlink()

            saver = Checkpointer(root / f"sync{i}", keep_last=1, async_save=False)
            t = time.perf_counter()
            saver.save(1, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
            sync_dcp.append(time.perf_counter() - t)
            saver.close()
            shutil.rmtree(root / f"sync{i}")

            saver = Checkpointer(root / "async", keep_last=1, async_save=True)
            t = time.perf_counter()
            saver.save(2 * i + 1, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
            saver.before_update()
            stalls.append(time.perf_counter() - t)
            (event,) = saver.wait()
            commits.append(event["write_s"])

            t = time.perf_counter()
            saver.save(2 * i + 2, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
            blocked = time.perf_counter() - t
            t = time.perf_counter()
            model(batch, batch)[1].backward()  # the next step's forward and backward: reads weights only
            step_s.append(time.perf_counter() - t)
            t = time.perf_counter()
            saver.before_update()
            overlapped.append(blocked + time.perf_counter() - t)
            saver.close()
            model.zero_grad(set_to_none=True)

        checkpoint = root / "async" / f"step_{2 * args.repeats:07d}"
        fresh_model, fresh_opt = trained_state(args.preset)
        t = time.perf_counter()
        load_training_state(checkpoint, fresh_model, fresh_opt)
        load_s = time.perf_counter() - t

        worker = root / "reshard.py"
        worker.write_text(RESHARD_WORKER)
        torchrun = Path(sys.executable).with_name("torchrun")
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(
            [str(torchrun), "--standalone", "--nproc_per_node", "2", str(worker), str(checkpoint), args.preset,
             str(VOCAB)],
            env=env, capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        reshard = [line for line in done.stdout.splitlines() if line.startswith("RESHARD_LOAD_S")]
        reshard_s = float(reshard[0].split()[1]) if reshard else None
        if reshard_s is None:
            print(done.stderr[-2000:], file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    best_stall, best_torch = min(stalls), min(sync_torch)
    write_result(
        "checkpoint",
        {
            "preset": args.preset,
            "state_gb": round(tensor_bytes / 1e9, 3),
            "sync_torch_save_s": round(best_torch, 3),
            "sync_dcp_save_s": round(min(sync_dcp), 3),
            "async_stall_no_overlap_s": round(best_stall, 3),
            "async_stall_overlapped_s": round(min(overlapped), 3),
            "forward_backward_s": round(min(step_s), 3),
            "async_commit_s": round(min(commits), 3),
            "stall_reduction_vs_torch_save_no_overlap": round(best_torch / best_stall, 1),
            "stall_reduction_vs_torch_save_overlapped": round(best_torch / max(min(overlapped), 1e-6), 1),
            "load_s": round(load_s, 3),
            "reshard_load_2proc_fsdp_s": reshard_s,
            "repeats": args.repeats,
        },
    )


if __name__ == "__main__":
    main()
