"""Model forward+backward throughput: tokens/s, FLOP/s achieved, and that as a fraction of peak.

Usage: python bench/model.py [STEPS] [124m]
On CPU: tiny-1m and small-5m (and llama-124m with `124m`) in bf16 autocast and fp32, against the
matmul peak of the same precision measured on this machine (`measure_cpu_matmul_flops`): the CPU
analogue of MFU. With CUDA: llama-124m and llama-1b in bf16 autocast under torch.compile, against
$SMELT_PEAK_FLOPS (e.g. 989e12 for an H200's dense bf16) or a measured bf16 matmul peak.

FLOPs per token (smelt/model/flops.py): PaLM's 6 N + 12 L d s with N the non-embedding parameters
plus the LM head, tied or not; `..._model_flops` figures count the matmuls alone, causal attention at
(s + 1) / 2 keys per query. Results written before the head was counted have `..._with_head` keys.

Document masking (`..._docmask_...`): packed rows of documents averaging DOC_MEAN_TOKENS tokens, in
tokens/s for each attention path: `causal` (no mask: the ceiling), `sdpa` (dense boolean mask) and
`flex` (BlockMask), forward+backward and forward alone (inference). On CPU small-5m in fp32 at
sequence 1024; flex there is forward-only (torch 2.13 has no CPU backward) and runs its compiled
kernel. With CUDA the same presets as above, compiled, in bf16.
"""

from __future__ import annotations

import os
import sys
import time

import torch
from common import write_result

from smelt.model.attention import flex_backward_supported
from smelt.model.flops import count_params, flops_per_token, model_flops_per_token
from smelt.model.sizing import preset_config
from smelt.model.transformer import Transformer, position_ids_from_doc_ids
from smelt.train.precision import measure_cpu_matmul_flops

VOCAB = 8192
DOC_MEAN_TOKENS = 256


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
    model_flops = model_flops_per_token(cfg, VOCAB, seq)
    key = f"{name}_{precision}"
    return {
        f"{key}_params_non_embedding": count_params(cfg, VOCAB)["non_embedding"],
        f"{key}_tokens_per_s": round(tps, 1),
        f"{key}_step_ms": round(1000 * seconds, 2),
        f"{key}_tflops_per_s": round(tps * per_token / 1e12, 4),
        f"{key}_fraction_of_peak": round(tps * per_token / peak, 4),
        f"{key}_fraction_of_peak_model_flops": round(tps * model_flops / peak, 4),
    }


def packed_documents(batch: int, seq: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """doc_ids and position_ids [batch, seq] of rows packed with documents of DOC_MEAN_TOKENS on average
    (each position opens a new document with probability 1 / DOC_MEAN_TOKENS), seeded."""
    gen = torch.Generator().manual_seed(1)
    starts = torch.rand(batch, seq, generator=gen) < 1 / DOC_MEAN_TOKENS
    starts[:, 0] = False
    doc = torch.cumsum(starts.long(), dim=1)
    return doc.to(device), position_ids_from_doc_ids(doc).to(device)


def bench_doc_masking(
    name: str, precision: str, device: str, batch: int, seq: int, steps: int, compiled: bool
) -> dict[str, object]:
    """Median tokens/s of each attention path on the same document-packed batch.

    The paths take turns inside every timing round, so a shared machine's load drifts into all of them
    alike rather than into whichever ran last.
    """
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(device)
    y = torch.randint(0, VOCAB, (batch, seq), generator=gen).to(device)
    doc, pos = packed_documents(batch, seq, device)
    paths = {"causal": "sdpa", "sdpa": "sdpa", "flex": "flex"}
    models = {}
    for path, attention in paths.items():
        torch.manual_seed(0)
        model = Transformer(preset_config(name, attention=attention, max_seq_len=seq), VOCAB).to(device)
        models[path] = torch.compile(model) if compiled else model

    def run(path: str, backward: bool) -> float:
        kwargs = {} if path == "causal" else {"doc_ids": doc, "position_ids": pos}
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        with (
            torch.set_grad_enabled(backward),
            torch.autocast(device, dtype=dtype, enabled=dtype != torch.float32),
        ):
            _, loss = models[path](x, y, **kwargs)
        if backward:
            loss.backward()
            models[path].zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    key = f"{name}_{precision}_docmask_seq{seq}"
    figures: dict[str, object] = {
        f"{key}_docs_per_row": round(float(doc[:, -1].float().mean()) + 1, 2),
        f"{key}_batch": batch,
    }
    flex_trains = flex_backward_supported(torch.device(device))
    for backward, label in ((True, "fwd_bwd"), (False, "fwd")):
        timed = [p for p in paths if p != "flex" or flex_trains or not backward]
        times: dict[str, list[float]] = {p: [] for p in timed}
        for i in range(steps + 2):  # two warm-up rounds: compilation, allocator, caches
            for path in timed:
                seconds = run(path, backward)
                if i >= 2:
                    times[path].append(seconds)
        for path in timed:
            median = sorted(times[path])[len(times[path]) // 2]
            figures[f"{key}_{path}_{label}_tokens_per_s"] = round(batch * seq / median, 1)
        if "flex" in timed:
            figures[f"{key}_flex_vs_sdpa_{label}_speedup"] = round(
                figures[f"{key}_flex_{label}_tokens_per_s"] / figures[f"{key}_sdpa_{label}_tokens_per_s"], 3
            )
        else:
            figures[f"{key}_flex_{label}"] = f"unsupported on {device} in torch {torch.__version__}"
    if device == "cuda":
        for path in paths:
            torch.cuda.reset_peak_memory_stats()
            run(path, True)
            figures[f"{key}_{path}_fwd_bwd_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return figures


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 5
    figures: dict[str, object] = {"steps": steps, "vocab": VOCAB}
    if torch.cuda.is_available():
        peak = float(os.environ.get("SMELT_PEAK_FLOPS") or cuda_matmul_flops())
        figures.update({"device": "cuda", "peak_bf16_tflops_per_s": round(peak / 1e12, 1), "compiled": True})
        for name, batch in (("llama-124m", 16), ("llama-1b", 8)):
            figures.update(bench(name, "bf16", "cuda", batch, 2048, steps, True, peak))
            figures.update(bench_doc_masking(name, "bf16", "cuda", batch, 2048, steps, True))
    else:
        threads = torch.get_num_threads()
        peaks = {p: measure_cpu_matmul_flops(p, threads, seconds=1.0) for p in ("bf16", "fp32")}
        figures.update({"device": "cpu", "threads": threads, "batch": 8, "seq_len": 256})
        figures.update({f"peak_{p}_tflops_per_s": round(v / 1e12, 4) for p, v in peaks.items()})
        names = ["tiny-1m", "small-5m"] + (["llama-124m"] if "124m" in sys.argv else [])
        for name in names:
            for precision in ("bf16", "fp32"):
                figures.update(bench(name, precision, "cpu", 8, 256, steps, False, peaks[precision]))
        figures.update(bench_doc_masking("small-5m", "fp32", "cpu", 4, 1024, steps, False))
    write_result("model", figures)


if __name__ == "__main__":
    main()
