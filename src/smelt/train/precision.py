"""Mixed precision: which autocast dtype to use where, the GradScaler for fp16, and peak FLOP/s for MFU.

Master weights and optimizer state always stay fp32; autocast only lowers the matmuls.

The peak that MFU divides by is one figure per machine, with its source: $SMELT_PEAK_FLOPS ("env"); on
CUDA a table by device name ("table"); on CPU a matmul benchmark measured once on a quiet machine and
cached with its date in ~/.cache/smelt/peak_flops.json ($SMELT_CACHE_DIR, else $XDG_CACHE_HOME/smelt),
keyed by CPU model, precision and thread count ("cached DATE"). A measurement taken while other
processes used the CPUs is used for that run only and not cached ("measured-now, busy ..."), so two
runs of the same work on the same machine report the same MFU.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

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


@dataclass(frozen=True)
class Peak:
    flops: float | None
    source: (
        str | None
    )  # "env", "table", "cached YYYY-MM-DD", "measured-now" (cached), "measured-now, busy ..."


# Other processes may use at most this share of the machine's CPU time while the peak is measured for the
# figure to be cached: they only ever slow a measurement down.
QUIET_SHARE = 0.1
CACHE_FILE = "peak_flops.json"
_resolved: dict[tuple[str, str, int, str, str], Peak] = {}
_last: list[Peak] = []


def peak_flops(device: torch.device, precision: Precision) -> float | None:
    """The dense peak FLOP/s MFU is measured against, or None when unknown (resolve_peak says whence)."""
    return resolve_peak(device, precision).flops


def peak_source() -> str | None:
    """Where the last peak this process resolved came from (None before any, as on ranks other than 0,
    which use rank 0's figure)."""
    return _last[-1].source if _last else None


def resolve_peak(device: torch.device, precision: Precision) -> Peak:
    """The peak and its source, once per process for each device, precision and thread count."""
    env = os.environ.get("SMELT_PEAK_FLOPS", "")
    key = (str(device), precision.name, torch.get_num_threads(), env, str(cache_path()))
    if key not in _resolved:
        _resolved[key] = _resolve(device, precision.name, key[2], env)
    _last.append(_resolved[key])
    return _resolved[key]


def _resolve(device: torch.device, precision: str, threads: int, env: str) -> Peak:
    if env:
        try:
            return Peak(float(env), "env")
        except ValueError:
            raise ConfigError(
                f"SMELT_PEAK_FLOPS = {env!r} is not a number; set it to the peak FLOP/s of one device "
                f"(e.g. 989e12), or unset it to use the table (CUDA) or the cached measurement (CPU)."
            ) from None
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = next((peak for key, peak in CUDA_PEAK_FLOPS.items() if key in name), None)
        return Peak(found, "table" if found else None)
    if device.type == "cpu":
        return cpu_peak(precision, threads)
    return Peak(None, None)


def cache_path() -> Path:
    if os.environ.get("SMELT_CACHE_DIR"):
        return Path(os.environ["SMELT_CACHE_DIR"]) / CACHE_FILE
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smelt" / CACHE_FILE


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform reports."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown"


def cpu_peak(precision: str, threads: int) -> Peak:
    """The cached peak of this CPU model, precision and thread count; else measured now, and cached when
    other processes left the CPUs alone while it ran."""
    key = f"{cpu_model()} | {precision} | {threads} threads"
    path = cache_path()
    cache = _read_cache(path)
    entry = cache.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("flops"), (int, float)) and entry["flops"] > 0:
        return Peak(float(entry["flops"]), f"cached {entry.get('measured', '?')}")
    flops, others = measure_while_watching(precision, threads)
    if others is not None and others > QUIET_SHARE:
        return Peak(
            flops,
            f"measured-now, busy (other processes used {100 * others:.0f}% of the CPUs; not cached, so "
            f"the next run measures again; set SMELT_PEAK_FLOPS for a fixed figure)",
        )
    cache[key] = {
        "flops": flops,
        "measured": datetime.date.today().isoformat(),
        "others_cpu_share": None if others is None else round(others, 4),
        "torch": torch.__version__,
    }
    with contextlib.suppress(OSError):  # a read-only home: the figure is still this run's
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True) + "\n")
        tmp.replace(path)
    return Peak(flops, "measured-now")


def _read_cache(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _cpu_times() -> tuple[int, int, int] | None:
    """(machine busy ticks, machine total ticks, this process's ticks) from /proc, or None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total, int(own[11]) + int(own[12])  # utime + stime of every thread


def measure_while_watching(precision: str, threads: int) -> tuple[float, float | None]:
    """The matmul peak, and the share of the machine's CPU time other processes used meanwhile (None
    where /proc cannot say)."""
    before = _cpu_times()
    flops = measure_cpu_matmul_flops(precision, threads, seconds=1.0)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return flops, None
    others = (after[0] - before[0]) - (after[2] - before[2])
    return flops, max(0.0, others / (after[1] - before[1]))


def measure_cpu_matmul_flops(precision: str, threads: int, size: int = 1024, seconds: float = 0.5) -> float:
    """Peak FLOP/s of size x size matmuls in the given precision on `threads` threads (~`seconds`).

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
