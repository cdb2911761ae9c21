"""Model forward+backward throughput: tokens/s, FLOP/s achieved, and that as a fraction of peak.

Usage: python bench/model.py [STEPS] [124m]
On CPU: tiny-1m and small-5m (and llama-124m with `124m`) in bf16 autocast and fp32, against the
matmul peak of the same precision measured on this machine (`measure_cpu_matmul_flops`): the CPU
analogue of MFU. With CUDA: llama-124m and llama-1b in bf16 autocast under torch.compile, against
$SMELT_PEAK_FLOPS (e.g. 989e12 for an H200's dense bf16) or a measured bf16 matmul peak.

FLOPs per token follow the design: 6 N (N non-embedding parameters) + 12 L d s. A tied LM head is a
real matmul that this convention leaves out, so `..._with_head` figures add its 6 V d.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from common import write_result

from smelt.model.flops import count_params, flops_per_token
from smelt.model.plan import preset_config
from smelt.model.transformer import Transformer
from smelt.train.precision import measure_cpu_matmul_flops

VOCAB = 8192


def cuda_matmul_flops(size: int = 8192) -> float:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 20 * 2 * size**3 / (time.perf_counter() - start)


def step_time(model, x, y, precision: str, device: str, steps: int) -> float:
    """Median seconds of one forward+backward after two warm-up steps."""
    dtype = torch.bfloat16 if precision == "bf16" else None
    times = []
    for i in range(steps + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device, dtype=dtype or torch.float32, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        if i >= 2:
            times.append(time.perf_counter() - start)
        model.zero_grad(set_to_none=True)
    return sorted(times)[len(times) // 2]


def bench(
    name: str, precision: str, device: str, batch: int, seq: int, steps: int, compiled: bool, peak: float
):
    cfg = preset_config(name)
    torch.manual_seed(0)
    model = Transformer(cfg, VOCAB).to(device).train()
    fn = torch.compile(model) if compiled else model
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(device)
    y = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(device)
    seconds = step_time(fn, x, y, precision, device, steps)
    tps = batch * seq / seconds
    per_token = flops_per_token(cfg, VOCAB, seq)
    head = 6 * VOCAB * cfg.d_model if cfg.tie_embeddings else 0
    key = f"{name}_{precision}"
    return {
        f"{key}_params_non_embedding": count_params(cfg, VOCAB)["non_embedding"],
        f"{key}_tokens_per_s": round(tps, 1),
        f"{key}_step_ms": round(1000 * seconds, 2),
        f"{key}_tflops_per_s": round(tps * per_token / 1e12, 4),
        f"{key}_fraction_of_peak": round(tps * per_token / peak, 4),
        f"{key}_fraction_of_peak_with_head": round(tps * (per_token + head) / peak, 4),
    }


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
    figures: dict[str, object] = {"steps": steps, "vocab": VOCAB}
    if torch.cuda.is_available():
        peak = float(os.environ.get("SMELT_PEAK_FLOPS") or cuda_matmul_flops())
        figures.update({"device": "cuda", "peak_bf16_tflops_per_s": round(peak / 1e12, 1), "compiled": True})
        for name, batch in (("llama-124m", 16), ("llama-1b", 8)):
            figures.update(bench(name, "bf16", "cuda", batch, 2048, steps, True, peak))
    else:
        threads = torch.get_num_threads()
        peaks = {p: measure_cpu_matmul_flops(p, threads, seconds=1.0) for p in ("bf16", "fp32")}
        figures.update({"device": "cpu", "threads": threads, "batch": 8, "seq_len": 256})
        figures.update({f"peak_{p}_tflops_per_s": round(v / 1e12, 4) for p, v in peaks.items()})
        names = ["tiny-1m", "small-5m"] + (["llama-124m"] if "124m" in sys.argv else [])
        for name in names:
            for precision in ("bf16", "fp32"):
                figures.update(bench(name, precision, "cpu", 8, 256, steps, False, peaks[precision]))
    write_result("model", figures)


if __name__ == "__main__":
    main()
