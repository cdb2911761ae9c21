"""Where tiny-moe's training step spends the time tiny-1m's does not: the MoE layer against the dense MLP it
replaces (same FLOPs per token), split into the experts' matmuls and the routing, dispatch and combine
around them, and the whole training step of both models.

Usage: python bench/moe_step.py [--precision fp32 bf16] [--repeats 20] [--name moe_step]

Times are this thread's CPU time (time.thread_time), the minimum over interleaved repeats, so that other
processes on a shared machine slow the figures as little as they can (a busy sibling hyperthread still
does); wall-clock minima are given beside the whole steps. One micro batch of 8 x 256 tokens, a 4,096-token
vocabulary, document masking (an EOS every 60 tokens), AdamW as the trainer builds it. Parts, each forward
and backward of one layer on the same [2048, 128] input:
- dense MLP: SwiGLU of d_ff 384 (tiny-1m's);
- MoE layer: 8 experts of d_ff 192, top-2 (tiny-moe's), router, balancing losses and counters included;
- experts only: the grouped SwiGLU on rows already sorted by expert (the same loads);
- routing, dispatch and combine: the MoE layer with the experts replaced by an identity.
Writes bench/results/NAME.json.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from common import write_result

from smelt.config import config_from_dict
from smelt.model import moe as moe_module
from smelt.model.moe import MoE, grouped_swiglu
from smelt.model.transformer import Transformer, doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.train.ops.host_memory import keep_freed_host_memory
from smelt.train.optim import build_optimizer

VOCAB, BATCH, SEQ = 4096, 8, 256


def cpu_ms(fn: Callable[[], None]) -> tuple[float, float]:
    """(thread CPU ms, wall ms) of one call."""
    cpu, wall = time.thread_time(), time.perf_counter()
    fn()
    return 1e3 * (time.thread_time() - cpu), 1e3 * (time.perf_counter() - wall)


def autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def layer_parts(precision: str, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    cfg = config_from_dict({"model": {"preset": "tiny-moe"}}).model
    moe = MoE(cfg).train()
    for weight in (moe.w_gate, moe.w_up, moe.w_down, moe.router.weight):
        torch.nn.init.normal_(weight, std=0.02)
    d = cfg.d_model
    dense = torch.nn.ModuleList([torch.nn.Linear(d, 384, bias=False) for _ in range(2)])
    down = torch.nn.Linear(384, d, bias=False)
    x = torch.randn(BATCH, SEQ, d, requires_grad=True)
    grad = torch.randn(BATCH, SEQ, d)
    with torch.no_grad():
        experts = moe.route(x.reshape(-1, d))[0].flatten()
    counts = torch.bincount(experts, minlength=cfg.moe_experts)
    rows = (
        x.detach().reshape(-1, d)[torch.argsort(experts, stable=True) // cfg.moe_top_k].requires_grad_(True)
    )
    row_grad = torch.randn(rows.shape)

    def dense_mlp() -> None:
        with autocast(precision):
            y = down(F.silu(dense[0](x)) * dense[1](x))
        y.backward(grad.to(y.dtype))

    def moe_layer() -> None:
        with autocast(precision):
            y = moe(x)
        (y.float() * grad).sum().add(moe.aux_loss).backward()

    def experts_only() -> None:
        with autocast(precision):
            y = grouped_swiglu(rows, counts, moe.w_gate, moe.w_up, moe.w_down)
        y.backward(row_grad.to(y.dtype))

    real = moe_module.grouped_swiglu

    def routing_only() -> None:
        moe_module.grouped_swiglu = lambda rows, counts, *weights: rows.clone()
        try:
            moe_layer()
        finally:
            moe_module.grouped_swiglu = real

    parts = {"dense MLP": dense_mlp, "MoE layer": moe_layer, "experts only": experts_only,
             "routing, dispatch, combine": routing_only}  # fmt: skip
    best = {name: float("inf") for name in parts}
    for repeat in range(repeats + 2):
        for name, fn in parts.items():
            spent, _ = cpu_ms(fn)
            if repeat >= 2:
                best[name] = min(best[name], spent)
    return best


def whole_steps(precision: str, repeats: int) -> dict[str, dict[str, float]]:
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, VOCAB, (BATCH, SEQ + 1), generator=gen)
    tokens[:, ::60] = 1
    doc_ids = doc_ids_from_tokens(tokens[:, :-1], 1)
    docs = {"doc_ids": doc_ids, "position_ids": position_ids_from_doc_ids(doc_ids)}
    models = {}
    for preset in ("tiny-1m", "tiny-moe"):
        cfg = config_from_dict({"model": {"preset": preset, "max_seq_len": SEQ}, "train": {"seq_len": SEQ}})
        torch.manual_seed(0)
        model = Transformer(cfg.model, VOCAB)
        models[preset] = (model, build_optimizer(model, cfg.train, torch.device("cpu")))

    def step(model: Transformer, optimizer: torch.optim.Optimizer) -> None:
        with autocast(precision):
            _, loss = model(tokens[:, :-1], tokens[:, 1:], **docs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    best = {preset: {"cpu_ms": float("inf"), "wall_ms": float("inf")} for preset in models}
    for repeat in range(repeats + 2):
        for preset, (model, optimizer) in models.items():
            spent, wall = cpu_ms(lambda m=model, o=optimizer: step(m, o))
            if repeat >= 2:
                best[preset] = {"cpu_ms": min(best[preset]["cpu_ms"], spent),
                                "wall_ms": min(best[preset]["wall_ms"], wall)}  # fmt: skip
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--name", default="moe_step")
    args = p.parse_args()
    keep_freed_host_memory()
    figures: dict[str, object] = {"threads": torch.get_num_threads(), "batch": [BATCH, SEQ], "vocab": VOCAB}
    for precision in args.precision:
        parts = layer_parts(precision, args.repeats)
        steps = whole_steps(precision, args.repeats)
        ratio = steps["tiny-moe"]["cpu_ms"] / steps["tiny-1m"]["cpu_ms"]
        print(f"{precision}: one layer, forward and backward (thread CPU ms, min of {args.repeats})")
        for name, ms in parts.items():
            print(f"  {name:<28} {ms:7.2f}")
        print(f"{precision}: whole training step (forward, backward, AdamW)")
        for preset, times in steps.items():
            print(f"  {preset:<28} {times['cpu_ms']:7.1f} CPU ms, {times['wall_ms']:7.1f} wall ms")
        print(f"  MoE / dense                  {ratio:7.2f}x")
        figures[precision] = {
            "layer_ms": {k: round(v, 2) for k, v in parts.items()},
            "step_ms": steps,
            "moe_over_dense": round(ratio, 3),
        }
    write_result(args.name, figures)


if __name__ == "__main__":
    main()
