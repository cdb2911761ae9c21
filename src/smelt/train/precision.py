"""Mixed precision: which autocast dtype to use where, the GradScaler for fp16, and peak FLOP/s for MFU.

Master weights and optimizer state always stay fp32; autocast only lowers the matmuls.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from dataclasses import dataclass

import torch

from smelt.errors import ConfigError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

# Dense (no sparsity) bf16 tensor-core peaks, matched by substring of the CUDA device name.
CUDA_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


@dataclass
class Precision:
    name: str  # "bf16", "fp16" or "fp32": what actually runs
    device_type: str

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.name]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def grad_scaler(self) -> torch.amp.GradScaler | None:
        # bf16 has fp32's exponent range; only fp16 gradients underflow without loss scaling.
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16" else None


def cpu_has_fast_bf16() -> bool:
    """True when this CPU has native bf16 matmul instructions (AVX-512 BF16 or AMX), where oneDNN's
    bf16 GEMM is several times faster than fp32; elsewhere bf16 is emulated and slower than fp32."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    for name in checks:
        check = getattr(torch.cpu, name, None)
        if check is not None and check():
            return True
    return False


def resolve_precision(requested: str, device: torch.device) -> Precision:
    if requested == "auto":
        if device.type == "cuda":
            name = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        elif device.type == "cpu":
            name = "bf16" if cpu_has_fast_bf16() else "fp32"
        else:
            name = "fp32"
        return Precision(name, device.type)
    if requested == "fp16" and device.type != "cuda":
        raise ConfigError(
            f"train.precision = 'fp16' needs a CUDA device (loss scaling with fp16 autocast is a GPU "
            f"feature), but the device is {device.type!r}. Use train.precision = 'bf16' or 'auto' on CPU."
        )
    if requested not in DTYPES:
        raise ConfigError(f"train.precision = {requested!r} is not one of auto, bf16, fp16, fp32.")
    return Precision(requested, device.type)


def peak_flops(device: torch.device, precision: Precision) -> float | None:
    """The dense peak FLOP/s MFU is measured against, or None when unknown.

    CUDA: a table by device name. CPU: $SMELT_PEAK_FLOPS if set, else a short matmul measurement.
    """
    env = os.environ.get("SMELT_PEAK_FLOPS")
    if env:
        return float(env)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((peak for key, peak in CUDA_PEAK_FLOPS.items() if key in name), None)
    if device.type == "cpu":
        return measure_cpu_matmul_flops(precision.name, torch.get_num_threads())
    return None


@functools.cache
def measure_cpu_matmul_flops(precision: str, threads: int, size: int = 1024, seconds: float = 0.5) -> float:
    """Peak FLOP/s of size x size matmuls in the given precision on `threads` threads (~0.5 s).

    The best of many short bursts, not the mean: other processes on the machine only ever slow a
    burst down, so the fastest one is the closest to what the hardware can do.
    """
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    for _ in range(3):  # warm up oneDNN kernels and caches
        torch.mm(a, b)
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        best = max(best, 4 * 2 * size**3 / (time.perf_counter() - start))
    return best
