"""The GPU training path, measured: bf16, torch.compile, document masks, FSDP2, async checkpoints.

Usage: python bench/gpu.py [--presets llama-124m,llama-1b] [--steps 20] [--warmup 3]
           [--micro-batch 4] [--seq-len 2048] [--doc-mean 512] [--loss-chunk-tokens 0]
           [--skip fsdp,checkpoint] [--name gpu]

For each preset, on one CUDA GPU, with smelt's model, fused AdamW (train/optim.py) and bf16 autocast:
1. `flex` vs `sdpa` (dense boolean mask) document-masked attention over packed rows of documents
   averaging --doc-mean tokens, the whole model under torch.compile: the first (compiling) step's
   seconds, then tokens/s and MFU over --steps steps;
2. FSDP2 on one GPU (fully_shard per block and at the root, in a one-process NCCL group, each block
   compiled before it is sharded, as torchtitan does): tokens/s against the unsharded run, the cost
   of FSDP2's hooks and copies without any communication;
3. the training stall of smelt's async checkpoint (checkpoint/saver.py: DCP async_save into pinned
   host buffers) with one forward+backward overlapping the copy, against a synchronous DCP save.
MFU is in both of smelt's conventions (model/flops.py) against the GPU's dense bf16 peak
(train/precision.py's table by device name, or $SMELT_PEAK_FLOPS). Writes bench/results/gpu.json.
On a machine without CUDA it exits with status 2 and says so.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from common import write_result

from smelt.config import config_from_dict
from smelt.model.flops import flops_per_token, model_flops_per_token
from smelt.model.sizing import DEFAULT_VOCAB, preset_config
from smelt.model.transformer import Transformer, position_ids_from_doc_ids
from smelt.train.optim import build_optimizer
from smelt.train.precision import Precision, peak_flops

NO_CUDA = (
    "error: bench/gpu.py measures smelt's CUDA training path (bf16, torch.compile, flex attention, FSDP2, "
    "async checkpoints into pinned memory) and this machine has no CUDA device "
    "(torch.cuda.is_available() is False; torch {version}). Run it on a machine with an NVIDIA GPU; for "
    "the CPU figures use bench/train_throughput.py and bench/model.py."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--presets", default="llama-124m,llama-1b", help="comma-separated model presets")
    p.add_argument("--steps", type=int, default=20, help="timed optimizer steps per measurement")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (the first one compiles)")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--doc-mean", type=int, default=512, help="mean document length in a packed row")
    p.add_argument("--vocab", type=int, default=DEFAULT_VOCAB)
    p.add_argument("--loss-chunk-tokens", type=int, default=0, help="train.loss_chunk_tokens (0: off)")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: fsdp, checkpoint")
    p.add_argument("--name", default="gpu", help="result file bench/results/NAME.json")
    return p.parse_args(argv)


def packed_rows(batch: int, seq: int, doc_mean: int, vocab: int, device: torch.device, seed: int) -> dict:
    """Inputs, targets, doc_ids and restarted positions of rows packed with documents of random length."""
    gen = torch.Generator().manual_seed(seed)
    uniform = torch.rand((batch, seq), generator=gen, dtype=torch.float64)
    lengths = (-doc_mean * torch.log1p(-uniform)).clamp(min=8)  # exponential, mean about doc_mean
    ends = lengths.cumsum(dim=1)
    doc_ids = torch.searchsorted(ends, torch.arange(seq, dtype=ends.dtype).expand(batch, seq).contiguous())
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    return {
        "inputs": tokens[:, :-1].to(device),
        "targets": tokens[:, 1:].to(device),
        "doc_ids": doc_ids.to(device),
        "position_ids": position_ids_from_doc_ids(doc_ids).to(device),
    }


def train_steps(forward: Any, optimizer: torch.optim.Optimizer, rows: list[dict], steps: int) -> float:
    """Seconds per optimizer step over `steps` steps (bf16 autocast), synchronised at both ends."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    for i in range(steps):
        batch = rows[i % len(rows)]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _, loss = forward(
                batch["inputs"],
                batch["targets"],
                doc_ids=batch["doc_ids"],
                position_ids=batch["position_ids"],
            )
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / steps


def build(preset: str, attention: str, args: argparse.Namespace, device: torch.device):
    torch.manual_seed(0)
    cfg = preset_config(preset, attention=attention, max_seq_len=max(args.seq_len, 2048))
    model = Transformer(cfg, args.vocab).to(device)
    model.loss_chunk_rows = args.loss_chunk_tokens
    train_cfg = config_from_dict({"train": {"lr": 3e-4}}).train
    return cfg, model, train_cfg


def measure(
    label: str,
    forward: Any,
    model: torch.nn.Module,
    optimizer: Any,
    cfg: Any,
    args: argparse.Namespace,
    peak: Any,
) -> dict[str, Any]:
    device = next(model.parameters()).device
    rows = [
        packed_rows(args.micro_batch, args.seq_len, args.doc_mean, args.vocab, device, s) for s in range(4)
    ]
    torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    train_steps(forward, optimizer, rows, 1)
    first = time.perf_counter() - started
    if args.warmup > 1:
        train_steps(forward, optimizer, rows, args.warmup - 1)
    step_s = train_steps(forward, optimizer, rows, args.steps)
    tps = args.micro_batch * args.seq_len / step_s
    palm = flops_per_token(cfg, args.vocab, args.seq_len)
    matmul = model_flops_per_token(cfg, args.vocab, args.seq_len)
    return {
        f"{label}_first_step_s": round(first, 2),
        f"{label}_step_ms": round(1000 * step_s, 2),
        f"{label}_tokens_per_s": round(tps, 1),
        f"{label}_mfu_pct": round(100 * palm * tps / peak, 2) if peak else None,
        f"{label}_mfu_model_pct": round(100 * matmul * tps / peak, 2) if peak else None,
        f"{label}_peak_memory_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2),
    }


def attention_paths(preset: str, args: argparse.Namespace, device: torch.device, peak: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for attention in ("flex", "sdpa"):
        cfg, model, train_cfg = build(preset, attention, args, device)
        optimizer = build_optimizer(model, train_cfg, device)  # fused on CUDA
        figures.update(
            measure(f"{preset}_{attention}", torch.compile(model), model, optimizer, cfg, args, peak)
        )
        del model, optimizer
        torch.cuda.empty_cache()
    return figures


def fsdp_one_gpu(preset: str, args: argparse.Namespace, device: torch.device, peak: Any) -> dict[str, Any]:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        dist.init_process_group("nccl", rank=0, world_size=1, device_id=device)
    cfg, model, train_cfg = build(preset, "auto", args, device)
    for block in model.blocks:
        block.compile()
        fully_shard(block)
    fully_shard(model)
    optimizer = build_optimizer(model, train_cfg, device)
    figures = measure(f"{preset}_fsdp2_1gpu", model, model, optimizer, cfg, args, peak)
    del model, optimizer
    torch.cuda.empty_cache()
    return figures


def checkpoint_stall(preset: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    from smelt.checkpoint.saver import Checkpointer

    cfg, model, train_cfg = build(preset, "auto", args, device)
    optimizer = build_optimizer(model, train_cfg, device)
    rows = [packed_rows(args.micro_batch, args.seq_len, args.doc_mean, args.vocab, device, 0)]
    train_steps(model, optimizer, rows, 1)  # the optimizer state exists from here on
    meta = {"model_config": cfg.__dict__.copy(), "vocab_size": args.vocab, "tokens": 0}
    root = Path(tempfile.mkdtemp(prefix="smelt-bench-gpu-ckpt-"))
    try:
        saver = Checkpointer(root / "sync", keep_last=1, async_save=False)
        started = time.perf_counter()
        saver.save(1, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
        sync_s = time.perf_counter() - started
        saver.close()
        saver = Checkpointer(root / "async", keep_last=1, async_save=True)
        results = []
        for step in (2, 3):  # the first async save also allocates the pinned host buffers
            torch.cuda.synchronize()
            started = time.perf_counter()
            saver.save(step, model, optimizer, meta, {"rng": {}}, batch_tokens=1)
            blocked = time.perf_counter() - started
            batch = rows[0]
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _, loss = model(batch["inputs"], batch["targets"], doc_ids=batch["doc_ids"],
                                position_ids=batch["position_ids"])  # fmt: skip
            loss.backward()
            torch.cuda.synchronize()
            waited = time.perf_counter()
            saver.before_update()
            results.append((blocked + time.perf_counter() - waited, saver.wait()[0]["write_s"]))
            optimizer.zero_grad(set_to_none=True)
        saver.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        f"{preset}_checkpoint_sync_dcp_s": round(sync_s, 3),
        f"{preset}_checkpoint_async_first_stall_s": round(results[0][0], 3),
        f"{preset}_checkpoint_async_stall_s": round(results[1][0], 3),
        f"{preset}_checkpoint_async_write_s": round(results[1][1], 3),
    }


def guarded(figures: dict[str, Any], name: str, run: Any) -> None:
    """One measurement; its error goes into the result instead of losing the others' figures."""
    try:
        figures.update(run())
    except Exception as exc:  # noqa: BLE001 - a benchmark records every failure and goes on
        figures[f"{name}_error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print(NO_CUDA.format(version=torch.__version__), file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    peak = peak_flops(device, Precision("bf16", "cuda"))
    skip = set(filter(None, args.skip.split(",")))
    figures: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device),
        "peak_bf16_tflops": peak / 1e12 if peak else None,
        "micro_batch": args.micro_batch,
        "seq_len": args.seq_len,
        "doc_mean_tokens": args.doc_mean,
        "vocab": args.vocab,
        "steps": args.steps,
        "loss_chunk_tokens": args.loss_chunk_tokens,
    }
    presets = [p for p in args.presets.split(",") if p]
    for preset in presets:
        guarded(figures, f"{preset}_attention", lambda p=preset: attention_paths(p, args, device, peak))
        if "checkpoint" not in skip:
            guarded(figures, f"{preset}_checkpoint", lambda p=preset: checkpoint_stall(p, args, device))
    if "fsdp" not in skip:  # last: it leaves a process group behind
        for preset in presets:
            guarded(figures, f"{preset}_fsdp2", lambda p=preset: fsdp_one_gpu(p, args, device, peak))
    write_result(args.name, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
