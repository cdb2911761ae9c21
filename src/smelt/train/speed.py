"""The training forward as fast as the config lets it be: torch.compile when asked, or with
train.compile = "auto" when the run is long enough to win back the compile time; the compiled
artifacts cached across runs under the user cache; the chunked LM head + loss (model/chunked_loss.py);
freed host memory kept for reuse on CPU (host_memory.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from smelt.train.ops.host_memory import host_memory_note

# What one compile of a model costs and buys, by device type: the first compiled step's extra
# seconds with an empty inductor cache, and the compiled step's speed over the eager one, by precision.
# CPU: small-5m (d 256, 6 layers, vocabulary 8,192, batch 16 x 256) on the idle 2-core AVX-512 BF16
# machine, 3 runs each (`bench/train_throughput.py 30 [compile] --cold-cache`): compiling cost 36 s
# with an empty cache (3 s with the one the first run left); the compiled bf16 step ran 1.19x the eager
# one (10,085 against 8,505 tokens/s), the fp32 step 1.02x (docs/benchmarks.md, "Training speed").
# CUDA: not measured here; 90 s and 1.3x are guesses to replace with bench/gpu.py's figures.
COMPILE_SECONDS = {"cpu": 40.0, "cuda": 90.0}
COMPILE_SPEEDUP = {"cpu": {"bf16": 1.19, "fp32": 1.02}, "cuda": {}}
DEFAULT_SPEEDUP = 1.3
# The MFU (against the peak of the run's own precision) the eager step is assumed to reach when its
# time is estimated from FLOPs: small-5m's eager step reached 0.39 of the measured bf16 peak and 0.75
# of the fp32 one. A higher guess makes steps look shorter and compile less worth it.
ASSUMED_EAGER_MFU = 0.4


def compile_speedup(device_type: str, precision: str) -> float:
    """The compiled step's speed over the eager one on this device type in this precision."""
    return COMPILE_SPEEDUP.get(device_type, {}).get(precision, DEFAULT_SPEEDUP)


def compile_pays_off(steps: int, step_s: float, compile_s: float, speedup: float) -> bool:
    """True when compiling saves more time over the run than it costs: steps x step_s x (1 - 1/speedup)
    (the time the faster step saves) exceeds compile_s (the one-off compile)."""
    if steps <= 0 or step_s <= 0 or speedup <= 1.0:
        return False
    return steps * step_s * (1.0 - 1.0 / speedup) > compile_s


def estimated_step_s(flops_per_token: float, tokens_per_step: int, peak_flops: float | None) -> float | None:
    """Seconds per eager step from the FLOPs it needs at ASSUMED_EAGER_MFU of the peak; None when the
    peak is unknown."""
    if not peak_flops:
        return None
    return flops_per_token * tokens_per_step / (peak_flops * ASSUMED_EAGER_MFU)


def auto_compile_excluded(cfg: Any, world_size: int) -> str | None:
    """Why train.compile = "auto" leaves this run eager whatever its length, or None. Auto compiles
    what is tested compiled, a dense model on one process; `true` still compiles the rest where it
    can (and pipeline and context parallelism refuse it by name: mesh.py)."""
    if cfg.model.moe_experts:
        return "MoE layers (model.moe_experts) are not tested compiled"
    if world_size > 1:
        return f"{world_size} processes: only single-process runs are compiled automatically"
    return None


def should_compile(
    setting: bool | str,
    device_type: str,
    steps: int,
    step_s: float | None,
    excluded: str | None = None,
    precision: str = "bf16",
) -> tuple[bool, str]:
    """(compile or not, why) for train.compile = true, false or "auto"; `excluded`: why auto must not
    compile this run (auto_compile_excluded)."""
    if setting != "auto":
        return bool(setting), f"train.compile = {str(bool(setting)).lower()}"
    if excluded:
        return False, f"train.compile = auto: off, {excluded} (set train.compile = true to compile it)"
    if step_s is None:
        return False, "train.compile = auto: off, the device's peak FLOP/s (and so the step time) is unknown"
    compile_s = COMPILE_SECONDS.get(device_type, COMPILE_SECONDS["cuda"])
    speedup = compile_speedup(device_type, precision)
    saved = steps * step_s * (1.0 - 1.0 / speedup)
    verdict = "on" if compile_pays_off(steps, step_s, compile_s, speedup) else "off"
    return verdict == "on", (
        f"train.compile = auto: {verdict}, {steps} steps of ~{step_s:.3g} s would save ~{saved:.0f} s "
        f"at {speedup}x against ~{compile_s:.0f} s of compiling"
    )


def compile_cache_dir() -> Path:
    """Where inductor keeps compiled kernels and FX graphs between runs: $TORCHINDUCTOR_CACHE_DIR when
    set, else smelt's user cache ($XDG_CACHE_HOME or ~/.cache)/smelt/inductor."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "smelt" / "inductor"


def enable_compile_cache() -> Path:
    """Point inductor at compile_cache_dir() with its FX graph and autograd caches on, so a second run
    of the same model loads its compiled step instead of compiling it again."""
    path = compile_cache_dir()
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    inductor_config.fx_graph_cache = True
    if hasattr(functorch_config, "enable_autograd_cache"):
        functorch_config.enable_autograd_cache = True
    return path


@dataclass(frozen=True)
class TrainingForward:
    """What the Trainer's steps call, and why: the start record says both notes."""

    call: Callable[..., Any]  # the model under its layout, compiled or not (train.compile)
    compile_note: str
    host_memory_note: str  # what train.keep_host_memory did


def training_forward(t: Any) -> TrainingForward:
    """The forward a Trainer's steps call (compiled or not); sets the model's chunk of loss rows from
    train.loss_chunk_tokens and applies train.keep_host_memory. Reads the trainer's config, model, plan,
    FLOPs per token and peak."""
    tc = t.tc
    memory_note = host_memory_note(tc.keep_host_memory, t.device.type)
    t.model.loss_chunk_rows = tc.loss_chunk_tokens
    step_s = estimated_step_s(t.flops_tok, t.plan.batch_tokens, t.peak_total)
    excluded = auto_compile_excluded(t.cfg, t.world_size)
    compiled, compile_note = should_compile(
        tc.compile, t.device.type, t.plan.steps, step_s, excluded, t.precision.name
    )
    if not compiled:
        return TrainingForward(t.wrapped, compile_note, memory_note)
    enable_compile_cache()
    return TrainingForward(torch.compile(t.wrapped), compile_note, memory_note)
