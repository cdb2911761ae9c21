"""`smelt plan budget`: from money, GPU-hours or FLOPs to a model size, a token count and a calendar.

The chain is the one every pretraining plan starts with: dollars / price = GPU-hours; GPU-hours x
peak x MFU = FLOPs C; C = 6 N D with D ~ 20 N (Chinchilla) or the split a fitted law prefers gives
N and D; GPU-hours / G is the wall time. Then the inference-aware question (Sardana et al. 2023):
a model that will serve many tokens is cheaper over its life if it is smaller and trained longer to
the same loss, so the plan lists those smaller models with their training and inference FLOPs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from smelt.errors import UserError
from smelt.plan.batch import critical_batch_tokens
from smelt.plan.laws import EPOCH, LossLaw

# Dense (no sparsity) BF16 tensor-core peak in FLOP/s and memory in GB (1e9 bytes) per device.
GPUS: dict[str, tuple[float, float]] = {
    "a100-40gb": (312e12, 40.0),
    "a100": (312e12, 80.0),
    "h100": (989e12, 80.0),
    "h200": (989e12, 141.0),
    "b200": (2250e12, 180.0),
    "mi300x": (1307e12, 192.0),
}
SECONDS_PER_HOUR = 3600.0
# Smaller models the inference-aware table considers, as fractions of the compute-optimal size.
SIZE_FRACTIONS = (1.0, 0.75, 0.5, 0.35, 0.25)
# Options whose training alone costs more than this multiple of the budget are left out of the table.
MAX_TRAIN_MULTIPLE = 10.0


@dataclass(frozen=True)
class Compute:
    """A training budget in FLOPs, with the GPU-hours and dollars it came from or corresponds to."""

    flops: float
    gpu_hours: float | None = None
    dollars: float | None = None
    peak_flops: float | None = None  # per GPU
    mfu: float | None = None

    @property
    def flops_per_gpu_second(self) -> float | None:
        return self.peak_flops * self.mfu if self.peak_flops and self.mfu else None


def resolve_compute(
    *,
    dollars: float | None = None,
    price_per_gpu_hour: float | None = None,
    gpu_hours: float | None = None,
    flops: float | None = None,
    peak_flops: float | None = None,
    mfu: float | None = None,
) -> Compute:
    """Exactly one of dollars (with a price), gpu_hours or flops; peak and MFU convert hours to FLOPs."""
    given = [
        name for name, v in (("--dollars", dollars), ("--gpu-hours", gpu_hours), ("--flops", flops)) if v
    ]
    if len(given) != 1:
        raise UserError(
            f"give exactly one budget: --dollars (with --price-per-gpu-hour), --gpu-hours or --flops; "
            f"got {', '.join(given) if given else 'none'}."
        )
    for flag, value in (
        ("--dollars", dollars),
        ("--price-per-gpu-hour", price_per_gpu_hour),
        ("--gpu-hours", gpu_hours),
        ("--flops", flops),
        ("--peak-tflops", peak_flops),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} must be a positive number, got {value}.")
    if mfu is not None and not 0 < mfu <= 1:
        raise UserError(f"--mfu must be a fraction in (0, 1], e.g. 0.35 for 35%; got {mfu}.")
    if dollars:
        if not price_per_gpu_hour:
            raise UserError("--dollars needs --price-per-gpu-hour (e.g. 3 for $3 per GPU-hour).")
        gpu_hours = dollars / price_per_gpu_hour
    throughput = peak_flops * mfu if peak_flops and mfu else None
    if gpu_hours:
        if throughput is None:
            raise UserError(
                "turning GPU-hours into FLOPs needs the device's peak and the expected MFU: pass --gpu NAME "
                f"({', '.join(GPUS)}) or --peak-tflops, and --mfu (0.35-0.45 is typical for dense models)."
            )
        flops = gpu_hours * SECONDS_PER_HOUR * throughput
    elif throughput is not None:
        gpu_hours = flops / throughput / SECONDS_PER_HOUR
    if dollars is None and gpu_hours is not None and price_per_gpu_hour:
        dollars = gpu_hours * price_per_gpu_hour
    return Compute(float(flops), gpu_hours, dollars, peak_flops, mfu)


@dataclass
class Option:
    """One way to spend the budget: a model size, its tokens, and what it costs to train and to serve."""

    params: float
    tokens: float
    train_flops: float
    inference_flops: float
    loss: float | None
    days: float | None

    @property
    def total_flops(self) -> float:
        return self.train_flops + self.inference_flops


@dataclass
class BudgetPlan:
    compute: Compute
    rule: str
    params: float
    tokens: float
    loss: float | None
    law: LossLaw
    gpus: int | None
    days: float | None
    inference_tokens: float
    options: list[Option] = field(default_factory=list)
    best: int = 0
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flops": self.compute.flops,
            "gpu_hours": self.compute.gpu_hours,
            "dollars": self.compute.dollars,
            "rule": self.rule,
            "params": self.params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens / self.params,
            "expected_loss": self.loss,
            "law": self.law.to_dict(),
            "gpus": self.gpus,
            "days": self.days,
            "inference_tokens": self.inference_tokens,
            "options": [
                {**o.__dict__, "total_flops": o.total_flops, "recommended": i == self.best}
                for i, o in enumerate(self.options)
            ],
            "warnings": self.warnings,
        }


def chinchilla_split(flops: float, tokens_per_param: float = 20.0) -> tuple[float, float]:
    """(N, D) with C = 6 N D and D = k N: N = sqrt(C / 6k)."""
    n = math.sqrt(flops / (6.0 * tokens_per_param))
    return n, tokens_per_param * n


def _option(
    n: float, d: float, law: LossLaw, compute: Compute, gpus: int | None, inference_tokens: float
) -> Option:
    train = 6.0 * n * d
    return Option(n, d, train, 2.0 * n * inference_tokens, law.loss(n, d), _days(train, compute, gpus))


def _cheapest_iso_loss_size(
    n_max: float, target: float, law: LossLaw, inference_tokens: float
) -> float | None:
    """The model size with the lowest training + inference FLOPs among those reaching `target` loss
    (a dense search in log N: the total is smooth and has one minimum, Sardana et al. 2023)."""
    if inference_tokens <= 0:
        return None
    floor = (law.A / (target - law.E)) ** (
        1.0 / law.alpha
    )  # the size whose parameter term alone is the target
    best, best_total = None, math.inf
    steps = 2000
    for i in range(1, steps + 1):
        size = floor * (n_max / floor) ** (i / steps)
        tokens = law.tokens_for_loss(size, target)
        if tokens is None:
            continue
        total = 6.0 * size * tokens + 2.0 * size * inference_tokens
        if total < best_total:
            best, best_total = size, total
    return best


def _days(flops: float, compute: Compute, gpus: int | None) -> float | None:
    throughput = compute.flops_per_gpu_second
    if not gpus or throughput is None:
        return None
    return flops / throughput / gpus / 86_400.0


def plan_budget(
    compute: Compute,
    *,
    tokens_per_param: float | None = 20.0,
    law: LossLaw | None = None,
    law_for_split: bool = False,
    gpus: int | None = None,
    inference_tokens: float = 0.0,
    unique_tokens: float | None = None,
    batch_tokens: float | None = None,
) -> BudgetPlan:
    """Size a run for `compute`: N and D by the k-tokens-per-parameter rule (default 20), or by
    `law`'s compute-optimal split when law_for_split. `law` (default: the Chinchilla refit) also gives
    the expected loss and the iso-loss smaller models of the inference-aware table."""
    law = law or EPOCH
    if gpus is not None and gpus < 1:
        raise UserError(f"--gpus must be at least 1, got {gpus}.")
    if inference_tokens < 0:
        raise UserError(f"--inference-tokens must be >= 0, got {inference_tokens}.")
    if law_for_split:
        n, d = law.optimal(compute.flops)
        rule = f"compute-optimal under {law.name}"
    else:
        k = 20.0 if tokens_per_param is None else tokens_per_param
        if k <= 0:
            raise UserError(f"--tokens-per-param must be positive, got {k}.")
        n, d = chinchilla_split(compute.flops, k)
        rule = f"C = 6 N D with D = {k:g} N"
    target = law.loss(n, d)
    options = [_option(n, d, law, compute, gpus, inference_tokens)]
    sizes = [n * f for f in SIZE_FRACTIONS[1:]]
    cheapest = _cheapest_iso_loss_size(n, target, law, inference_tokens)
    if cheapest is not None and cheapest < n * 0.99:
        sizes.append(cheapest)
    for size in sorted(sizes, reverse=True):
        tokens = law.tokens_for_loss(size, target)
        if tokens is None or 6.0 * size * tokens > MAX_TRAIN_MULTIPLE * compute.flops:
            continue
        options.append(_option(size, tokens, law, compute, gpus, inference_tokens))
    best = min(range(len(options)), key=lambda i: options[i].total_flops)
    plan = BudgetPlan(
        compute=compute,
        rule=rule,
        params=n,
        tokens=d,
        loss=target,
        law=law,
        gpus=gpus,
        days=_days(compute.flops, compute, gpus),
        inference_tokens=inference_tokens,
        options=options,
        best=best,
    )
    plan.warnings = budget_warnings(d, target, unique_tokens, batch_tokens)
    return plan


def budget_warnings(
    tokens: float, loss: float | None, unique_tokens: float | None, batch_tokens: float | None
) -> list[str]:
    """More than 4 epochs of the data, or a batch far above the critical batch: both waste compute."""
    out = []
    if unique_tokens:
        epochs = tokens / unique_tokens
        if epochs > 4:
            out.append(
                f"the plan trains on {tokens:.3g} tokens but the data has {unique_tokens:.3g} unique tokens: "
                f"{epochs:.1f} epochs. Beyond ~4 epochs repeated tokens are worth much less than fresh ones "
                f"(Muennighoff et al. 2023). Find more unique data, or plan fewer tokens and a larger model."
            )
    if batch_tokens and loss:
        critical = critical_batch_tokens(loss)
        if batch_tokens > 2 * critical:
            out.append(
                f"batch of {batch_tokens:.3g} tokens is {batch_tokens / critical:.1f}x the critical batch "
                f"(~{critical:.3g} tokens at loss {loss:.2f}); above it, doubling the batch no longer halves "
                f"the steps, so the extra tokens per step are mostly wasted compute."
            )
    return out


def _si(x: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{suffix}{unit}"
    return f"{x:.3g}{unit}"


def budget_rows(plan: BudgetPlan) -> list[tuple[str, str]]:
    """(label, value) rows for the summary table."""
    c = plan.compute
    rows: list[tuple[str, str]] = []
    if c.dollars is not None:
        rows.append(("budget", f"${c.dollars:,.0f}"))
    if c.gpu_hours is not None:
        rows.append(("GPU-hours", f"{c.gpu_hours:,.0f}"))
    if c.peak_flops and c.mfu:
        rows.append(
            ("throughput per GPU", f"{c.peak_flops / 1e12:,.0f} TFLOP/s peak x {100 * c.mfu:.0f}% MFU")
        )
    rows += [
        ("compute C", f"{c.flops:.3e} FLOPs"),
        ("sizing rule", plan.rule),
        ("parameters N", f"{plan.params:.3e} ({_si(plan.params)})"),
        (
            "tokens D",
            f"{plan.tokens:.3e} ({_si(plan.tokens)}, {plan.tokens / plan.params:.1f} per parameter)",
        ),
    ]
    if plan.loss is not None:
        rows.append(("expected loss", f"{plan.loss:.3f} ({plan.law.name})"))
    if plan.days is not None:
        rows.append((f"training time on {plan.gpus} GPUs", f"{plan.days:.1f} days"))
    elif plan.gpus:
        rows.append((f"training time on {plan.gpus} GPUs", "unknown: pass --gpu or --peak-tflops and --mfu"))
    return rows


def options_table(plan: BudgetPlan) -> str:
    """The inference-aware table: same expected loss, smaller models trained on more tokens."""
    header = (
        f"{'params':>9} {'tokens':>9} {'tok/param':>9} {'train FLOPs':>12} {'x plan':>9} "
        f"{'infer FLOPs':>12} {'total FLOPs':>12} {'days':>7}"
    )
    lines = [header, "-" * len(header)]
    base = plan.options[0].train_flops
    for i, o in enumerate(plan.options):
        days = f"{o.days:7.1f}" if o.days is not None else f"{'-':>7}"
        mark = "  <- lowest total" if i == plan.best and plan.inference_tokens > 0 else ""
        lines.append(
            f"{_si(o.params):>9} {_si(o.tokens):>9} {o.tokens / o.params:9.0f} {o.train_flops:12.3e} "
            f"{o.train_flops / base:9.2f} {o.inference_flops:12.3e} {o.total_flops:12.3e} {days}{mark}"
        )
    return "\n".join(lines)
