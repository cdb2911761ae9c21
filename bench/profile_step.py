"""Where one training step's time goes, by kind of op: the profile the "Training throughput" tables of
docs/benchmarks.md come from.

Usage: python bench/profile_step.py [--preset small-5m] [--vocab 8192] [--micro-batch 16] [--seq-len 256]
           [--precision bf16] [--doc-every 60] [--steps 3] [--keep-host-memory | --no-keep-host-memory] [--name profile_step]

One micro batch per step (forward, backward, fused AdamW) of the model as the trainer builds it, with
document masking (an EOS every --doc-every tokens). The step time is the median of 8 steps without the
profiler; the breakdown is torch.profiler's self CPU time over --steps steps (the profiler adds its
own overhead), per step, grouped by op. Writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from common import write_result

from smelt.config import config_from_dict
from smelt.model.transformer import Transformer, doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.train.ops.host_memory import keep_freed_host_memory
from smelt.train.optim import build_optimizer

# Op name (substring of the profiler's key) -> group; the first match wins.
GROUPS = (
    ("scaled_dot_product", "attention (SDPA)"),
    ("flash_attention", "attention (SDPA)"),
    ("aten::mm", "matmuls"),
    ("aten::bmm", "matmuls"),
    ("aten::addmm", "matmuls"),
    ("log_softmax", "loss (log-softmax, NLL)"),
    ("nll_loss", "loss (log-softmax, NLL)"),
    ("aten::fill_", "zero fills"),
    ("aten::zero_", "zero fills"),
    ("aten::copy_", "dtype casts and copies"),
    ("adamw", "optimizer"),
    ("aten::mul", "element-wise"),
    ("aten::add", "element-wise"),
    ("aten::silu", "element-wise"),
    ("aten::pow", "element-wise"),
    ("aten::rsqrt", "element-wise"),
    ("aten::div", "element-wise"),
    ("aten::sum", "element-wise"),
    ("aten::mean", "element-wise"),
    ("aten::where", "element-wise"),
    ("aten::sub", "element-wise"),
)


def group_of(name: str) -> str:
    low = name.lower()
    return next((group for key, group in GROUPS if key.lower() in low), "other")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small-5m")
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    p.add_argument("--doc-every", type=int, default=60, help="an EOS every N tokens (0: no document masking)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--keep-host-memory", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--name", default="profile_step", help="result file name")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    kept = keep_freed_host_memory() if args.keep_host_memory else False
    cfg = config_from_dict({"model": {"preset": args.preset}, "train": {"seq_len": args.seq_len}})
    torch.manual_seed(0)
    model = Transformer(cfg.model, args.vocab)
    optimizer = build_optimizer(model, cfg.train, torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(2, args.vocab, (args.micro_batch, args.seq_len + 1), generator=gen)
    docs = {}
    if args.doc_every:
        rows[:, :: args.doc_every] = 1
        doc_ids = doc_ids_from_tokens(rows[:, :-1], 1)
        docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}
    inputs, targets = rows[:, :-1], rows[:, 1:]
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32

    def step() -> None:
        with torch.autocast("cpu", dtype=dtype, enabled=args.precision == "bf16"):
            _, loss = model(inputs, targets, **docs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    times = []
    for _ in range(8):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    step_ms = 1e3 * statistics.median(times)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            step()
    by_group: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        by_group[group_of(event.key)] += event.self_cpu_time_total / 1e3 / args.steps
    total = sum(by_group.values())
    tokens = args.micro_batch * args.seq_len
    print(
        f"step {step_ms:.0f} ms median of 8 ({tokens / step_ms * 1e3:,.0f} tokens/s); profiled {total:.0f} ms"
    )
    for group, ms in sorted(by_group.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<28} {ms:8.1f} ms  {100 * ms / total:5.1f}%")
    write_result(
        args.name,
        {
            "preset": args.preset,
            "vocab": args.vocab,
            "batch": [args.micro_batch, args.seq_len],
            "precision": args.precision,
            "doc_every": args.doc_every,
            "keep_host_memory": kept,
            "step_ms_median": round(step_ms, 1),
            "step_ms_min_max": [round(1e3 * min(times), 1), round(1e3 * max(times), 1)],
            "profiled_ms_per_step": {
                g: round(ms, 1) for g, ms in sorted(by_group.items(), key=lambda kv: -kv[1])
            },
        },
    )


if __name__ == "__main__":
    main()
