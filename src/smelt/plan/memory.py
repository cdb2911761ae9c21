"""`smelt plan memory`: bytes per GPU of a training layout, and a layout for a cluster.

The model (per GPU, decimal GB):
- model state, mixed precision with Adam: bf16 weights 2 N, bf16 gradients 2 N, fp32 master weights and
  two moments 12 N (16 N in all); each divided by TP x PP for the layers a GPU holds, then by DP for the
  parts ZeRO shards (stage 1: optimizer state, 2: + gradients, 3 / FSDP: + weights);
- gradients that ZeRO 2 and 3 shard are whole while micro batches accumulate: smelt's FSDP2 synchronises
  on the last micro batch of a step only (train/parallel/distributed.py's grad_sync), so the others add into the
  unsharded gradients, which are reduce-scattered at the end; with one micro batch they stay sharded;
- under ZeRO 3, what FSDP2 gathers: the root unit of the stage (embedding, final norm, head: gathered
  for the forward and kept until the backward is done) and three blocks' weights (the block computing,
  the prefetched next one, and the reduce-scatter's copy of a block's gradients);
- activations per layer and micro batch (Korthikanti et al. 2022, with sequence parallelism when TP > 1):
  s b h (34 + 5 a s / h) / t bytes without recompute, s b h 34 / t with selective recompute (the
  attention scores are recomputed, as FlashAttention does anyway), 2 s b h / t with full recompute (the
  layer input only, plus one layer's full set while it is recomputed);
- under the 1F1B pipeline schedule the first stage keeps min(PP, microbatches) micro batches in flight
  over its L / PP layers, i.e. about L layers' worth whatever PP is: pipelining splits the model state,
  not the activations. The last stage holds one micro batch plus the fp32 logits (4 s b V / t);
- a fixed overhead for the CUDA context, NCCL buffers, workspaces and allocator slack.

The recommender then follows the usual order: data parallelism alone (with ZeRO-1) when the model fits;
otherwise tensor parallelism within a node, as wide as the heads allow while each GPU keeps at least
1,024 columns of the hidden size (thinner GEMMs spend more time in TP's all-reduces than they save), and
pipeline stages to fill the node with one replica, so that all model-parallel traffic stays on NVLink;
more stages (across nodes) only while the replica still does not fit; data parallelism for the rest.
Then the largest micro batch that fits with the requested headroom, and gradient accumulation for the
target global batch, with at least 4 and preferably 8 micro batches per pipeline stage (the bubble is
(p-1)/(m+p-1)).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from smelt.config import ModelConfig
from smelt.errors import UserError
from smelt.model.flops import count_params, resolved_d_ff

GB = 1e9
RECOMPUTE = ("none", "selective", "full")
# bytes per parameter: (weights, gradients, optimizer state incl. fp32 master weights)
PRECISIONS = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}
MIN_HIDDEN_PER_TP = 1024
MICROBATCHES_PER_STAGE = 4  # at least (field guide: m >= 4p) ...
PREFERRED_MICROBATCHES_PER_STAGE = 8  # ... and preferably m >= 8p


@dataclass(frozen=True)
class ModelShape:
    """What the memory model needs to know about a transformer."""

    name: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    vocab_size: int
    tied: bool
    params_total: int
    params_per_layer: int
    value_embedding_params: int = 0  # model.value_embeddings' tables, beside the token embedding

    @classmethod
    def from_config(cls, cfg: ModelConfig, vocab_size: int, name: str = "") -> ModelShape:
        counts = count_params(cfg, vocab_size)
        head = 0 if cfg.tie_embeddings else vocab_size * cfg.d_model
        per_layer = (counts["non_embedding"] - head - cfg.d_model) // cfg.n_layers
        return cls(
            name=name or cfg.preset or "model",
            n_layers=cfg.n_layers,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads or cfg.n_heads,
            d_ff=resolved_d_ff(cfg),
            vocab_size=vocab_size,
            tied=cfg.tie_embeddings,
            params_total=counts["total"],
            params_per_layer=per_layer,
            value_embedding_params=counts["value_embedding"],
        )

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.d_model


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    recompute: str = "selective"
    micro_batch: int = 1
    seq_len: int = 2048
    microbatches: int = 1  # micro batches per optimizer step per replica (gradient accumulation)
    precision: str = "mixed"
    sequence_parallel: bool = True

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    def describe(self) -> str:
        zero = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3/FSDP"}[self.zero]
        return (
            f"TP {self.tp} x PP {self.pp} x DP {self.dp} ({zero}), {self.recompute} recompute, "
            f"micro batch {self.micro_batch} x {self.seq_len} tokens"
        )


@dataclass
class StageMemory:
    """Bytes on one GPU of one pipeline stage."""

    stage: str
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    overhead: float
    zero3_buffers: float = 0.0

    @property
    def model_state(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.zero3_buffers

    @property
    def total(self) -> float:
        return self.model_state + self.activations + self.logits + self.overhead


@dataclass
class Memory:
    layout: Layout
    stages: list[StageMemory]

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total)

    def to_dict(self) -> dict[str, Any]:
        peak = self.peak
        return {
            "layout": self.layout.__dict__,
            "peak_stage": peak.stage,
            "per_gpu_gb": {
                "weights": peak.weights / GB,
                "gradients": peak.gradients / GB,
                "optimizer": peak.optimizer / GB,
                "zero3_buffers": peak.zero3_buffers / GB,
                "activations": peak.activations / GB,
                "logits": peak.logits / GB,
                "overhead": peak.overhead / GB,
                "total": peak.total / GB,
            },
        }


def model_state_bytes(params: float, precision: str = "mixed") -> float:
    """Weights + gradients + optimizer state of the whole model, unsharded: 16 bytes per parameter."""
    return params * sum(PRECISIONS[precision])


def activation_bytes_per_layer(shape: ModelShape, layout: Layout, recompute: str | None = None) -> float:
    """Korthikanti et al. (2022): bytes one layer keeps for the backward pass, one micro batch."""
    s, b, h, a, t = layout.seq_len, layout.micro_batch, shape.d_model, shape.n_heads, layout.tp
    mode = recompute or layout.recompute
    if mode == "full":
        return 2.0 * s * b * h / (t if layout.sequence_parallel else 1)
    attention = 5.0 * a * s / h if mode == "none" else 0.0
    if layout.sequence_parallel or t == 1:
        return s * b * h * (34.0 + attention) / t
    return s * b * h * (10.0 + 24.0 / t + attention / t)


def memory(shape: ModelShape, layout: Layout, overhead_gb: float = 2.0) -> Memory:
    """Per-GPU memory of the first and the last pipeline stage (the two extremes under 1F1B)."""
    _check_layout(shape, layout)
    w_bytes, g_bytes, o_bytes = PRECISIONS[layout.precision]
    t, p, dp = layout.tp, layout.pp, layout.dp
    layers = shape.n_layers / p
    per_layer_act = activation_bytes_per_layer(shape, layout)
    in_flight = min(p, layout.microbatches) if p > 1 else 1
    logits = 4.0 * layout.seq_len * layout.micro_batch * shape.vocab_size / t
    recompute_working = 0.0
    if layout.recompute == "full":  # one layer's full activations while it is being recomputed
        recompute_working = activation_bytes_per_layer(shape, layout, "none")
    head = shape.embedding_params if (not shape.tied or p > 1) else 0
    # ZeRO 2/3 gradients stay whole while micro batches accumulate (see the module docstring).
    sharded_grads = layout.zero >= 2 and layout.microbatches == 1
    stages = []
    names = ["first", "last"] if p > 1 else ["only"]
    for name in names:
        root = 0.0  # the stage's parameters outside its blocks
        if name in ("first", "only"):
            root += shape.embedding_params + shape.value_embedding_params
        if name in ("last", "only"):
            root += head + shape.d_model
        params = (layers * shape.params_per_layer + root) / t
        weights = params * w_bytes / (dp if layout.zero >= 3 else 1)
        gradients = params * g_bytes / (dp if sharded_grads else 1)
        optimizer = params * o_bytes / (dp if layout.zero >= 1 else 1)
        zero3 = 0.0
        if layout.zero >= 3 and dp > 1:  # the gathered root unit and three blocks (module docstring)
            zero3 = (3.0 * shape.params_per_layer + root) / t * w_bytes
        micro = in_flight if name in ("first", "only") else 1
        activations = micro * layers * per_layer_act + recompute_working
        stage_logits = logits if name in ("last", "only") else 0.0
        stages.append(
            StageMemory(
                name, weights, gradients, optimizer, activations, stage_logits, overhead_gb * GB, zero3
            )
        )
    return Memory(layout, stages)


def _check_layout(shape: ModelShape, layout: Layout) -> None:
    if layout.recompute not in RECOMPUTE:
        raise UserError(f"--recompute must be one of {', '.join(RECOMPUTE)}; got {layout.recompute!r}.")
    if layout.precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}; got {layout.precision!r}.")
    if layout.zero not in (0, 1, 2, 3):
        raise UserError(f"--zero must be 0 (DDP), 1, 2 or 3 (FSDP); got {layout.zero}.")
    for flag, value in (
        ("--tp", layout.tp),
        ("--pp", layout.pp),
        ("--dp", layout.dp),
        ("--micro-batch", layout.micro_batch),
        ("--seq-len", layout.seq_len),
    ):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}.")
    if shape.n_heads % layout.tp or shape.n_kv_heads % layout.tp and layout.tp % shape.n_kv_heads:
        raise UserError(
            f"--tp {layout.tp} must divide the {shape.n_heads} attention heads (and the {shape.n_kv_heads} "
            f"key/value heads, or be a multiple of them); try one of {_divisors(shape.n_heads)}."
        )
    if shape.n_layers % layout.pp:
        raise UserError(
            f"--pp {layout.pp} must divide the {shape.n_layers} layers so every stage gets the same number; "
            f"try {', '.join(map(str, _divisors(shape.n_layers)))}."
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0 and d <= 64]


@dataclass(frozen=True)
class Cluster:
    gpus: int
    gpus_per_node: int = 8
    memory_gb: float = 80.0


@dataclass
class Recommendation:
    layout: Layout
    memory: Memory
    memory_at_micro_batch_1: Memory
    cluster: Cluster
    budget_gb: float
    global_batch_tokens: int
    reasons: list[str] = field(default_factory=list)
    alternatives: list[tuple[Layout, Memory, bool]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "layout": self.layout.__dict__,
            "memory": self.memory.to_dict(),
            "memory_at_micro_batch_1_gb": self.memory_at_micro_batch_1.peak.total / GB,
            "budget_gb": self.budget_gb,
            "global_batch_tokens": self.global_batch_tokens,
            "reasons": self.reasons,
            "warnings": self.warnings,
        }


def _powers_of_two(limit: int) -> list[int]:
    out, x = [], 1
    while x <= limit:
        out.append(x)
        x *= 2
    return out


def _tp_ok(shape: ModelShape, tp: int) -> bool:
    # smelt's TP gives each rank whole key/value heads, never replicated: TP must divide both counts.
    return shape.n_heads % tp == 0 and shape.n_kv_heads % tp == 0


class _Search:
    """Layouts of one cluster for one model and global batch: which exist, and which fit."""

    def __init__(
        self,
        shape: ModelShape,
        cluster: Cluster,
        base: Layout,
        sequences: int,
        budget: float,
        overhead_gb: float,
    ):
        self.shape, self.cluster, self.base = shape, cluster, base
        self.sequences, self.budget, self.overhead_gb = sequences, budget, overhead_gb

    def layout(self, tp: int, pp: int, micro: int = 1, recompute: str | None = None) -> Layout | None:
        """The layout, or None when it cannot exist: TP x PP must divide the GPUs, PP the layers, DP x micro
        batch the global batch, and a pipeline needs >= 4 micro batches per stage."""
        g, shape = self.cluster.gpus, self.shape
        if g % (tp * pp) or shape.n_layers % pp or not _tp_ok(shape, tp):
            return None
        dp = g // (tp * pp)
        if self.sequences % (dp * micro):
            return None
        m = self.sequences // (dp * micro)
        if pp > 1 and m < MICROBATCHES_PER_STAGE * pp:
            return None
        zero = self.base.zero if dp > 1 else 0
        mode = recompute or self.base.recompute
        return replace(
            self.base, tp=tp, pp=pp, dp=dp, micro_batch=micro, microbatches=m, recompute=mode, zero=zero
        )

    def memory(self, layout: Layout) -> Memory:
        return memory(self.shape, layout, self.overhead_gb)

    def fits(self, layout: Layout | None) -> bool:
        return layout is not None and self.memory(layout).peak.total <= self.budget

    def tp_cap(self) -> int:
        """The widest TP within a node that divides the heads and leaves >= 1,024 hidden columns per GPU."""
        limit = min(self.cluster.gpus_per_node, self.cluster.gpus)
        return max(
            t
            for t in _powers_of_two(limit)
            if _tp_ok(self.shape, t) and (t == 1 or self.shape.d_model // t >= MIN_HIDDEN_PER_TP)
        )

    def model_parallel(self, recompute: str) -> tuple[int, int] | None:
        """(TP, PP): TP at its cap; PP first fills the node with one replica, then grows until it fits."""
        node = min(self.cluster.gpus_per_node, self.cluster.gpus)
        tp, pp = self.tp_cap(), 1
        while tp * pp * 2 <= node and self.layout(tp, pp * 2, 1, recompute) is not None:
            pp *= 2
        while pp <= self.shape.n_layers and tp * pp <= self.cluster.gpus:
            if self.fits(self.layout(tp, pp, 1, recompute)):
                return tp, pp
            pp *= 2
        return None


def recommend(
    shape: ModelShape,
    cluster: Cluster,
    *,
    seq_len: int,
    global_batch_tokens: int,
    recompute: str = "selective",
    zero: int = 1,
    precision: str = "mixed",
    headroom: float = 0.10,
    overhead_gb: float = 2.0,
    max_micro_batch: int = 64,
) -> Recommendation:
    """A TP x PP x DP layout, micro batch and accumulation for `cluster` (see the module docstring)."""
    g = cluster.gpus
    if g < 1 or cluster.gpus_per_node < 1 or cluster.memory_gb <= 0:
        raise UserError("--gpus, --gpus-per-node and --gpu-memory must be positive.")
    if g > cluster.gpus_per_node and g % cluster.gpus_per_node:
        raise UserError(
            f"--gpus {g} is not a whole number of nodes of {cluster.gpus_per_node}; use a multiple of "
            f"{cluster.gpus_per_node} or set --gpus-per-node."
        )
    if not 0 <= headroom < 1:
        raise UserError(f"--headroom must be a fraction in [0, 1), e.g. 0.1; got {headroom}.")
    if global_batch_tokens % seq_len:
        lower = global_batch_tokens // seq_len * seq_len
        raise UserError(
            f"--global-batch-tokens {global_batch_tokens} is not a multiple of the sequence length "
            f"{seq_len}; use {lower or seq_len} or {lower + seq_len}."
        )
    sequences = global_batch_tokens // seq_len
    budget = cluster.memory_gb * (1.0 - headroom) * GB
    base = Layout(zero=zero, recompute=recompute, seq_len=seq_len, precision=precision)
    search = _Search(shape, cluster, base, sequences, budget, overhead_gb)
    _check_layout(shape, base)
    reasons: list[str] = []
    chosen: tuple[int, int, str] | None = None
    for mode in RECOMPUTE[RECOMPUTE.index(recompute) :]:  # escalate recompute only when nothing fits
        if search.fits(search.layout(1, 1, 1, mode)):
            chosen = (1, 1, mode)
            reasons.append("the model fits with data parallelism alone" + (f" (ZeRO-{zero})" if zero else ""))
            break
        found = search.model_parallel(mode)
        if found is not None:
            chosen = (*found, mode)
            tp, pp = found
            reasons.append(
                f"TP {tp}: the widest within a node that divides the {shape.n_heads} heads and keeps >= "
                f"{MIN_HIDDEN_PER_TP} hidden columns per GPU ({shape.d_model} / {tp} = {shape.d_model // tp})"
            )
            if pp > 1:
                why = (
                    "one replica per node keeps model-parallel traffic on NVLink"
                    if tp * pp <= cluster.gpus_per_node
                    else "more stages until a replica fits"
                )
                least = MICROBATCHES_PER_STAGE * pp
                reasons.append(f"PP {pp}: {why}; >= {least} micro batches per step keep the bubble small")
            break
        reasons.append(f"nothing fits with {mode} recompute")
    if chosen is None:
        raise UserError(
            f"no layout of {g} GPUs with {cluster.memory_gb:g} GB each fits {shape.name} at sequence length "
            f"{seq_len} (even with full recompute, TP {search.tp_cap()} and every pipeline depth). Add GPUs, "
            f"use --zero 3, a shorter --seq-len, or a smaller --global-batch-tokens."
        )
    tp, pp, mode = chosen
    smallest = search.layout(tp, pp, 1, mode)
    assert smallest is not None
    fitting: list[Layout] = [smallest]
    for micro in _powers_of_two(max_micro_batch)[1:]:
        candidate = search.layout(tp, pp, micro, mode)
        if candidate is not None and search.fits(candidate):
            fitting.append(candidate)
    # The largest micro batch that fits, preferring >= 8 micro batches per pipeline stage (bubble <= ~6%).
    enough = PREFERRED_MICROBATCHES_PER_STAGE * pp
    preferred = [c for c in fitting if pp == 1 or c.microbatches >= enough]
    best = (preferred or fitting)[-1]
    keeps = f" and keeps >= {enough} micro batches per step" if preferred and pp > 1 else ""
    reasons.append(
        f"micro batch {best.micro_batch}: the largest power of two that fits in {budget / GB:.0f} GB "
        f"({100 * (1 - headroom):.0f}% of {cluster.memory_gb:g} GB){keeps}; {best.microbatches} micro "
        f"batches per step per replica for the global batch of {sequences} sequences"
    )
    rec = Recommendation(
        layout=best,
        memory=search.memory(best),
        memory_at_micro_batch_1=search.memory(smallest),
        cluster=cluster,
        budget_gb=budget / GB,
        global_batch_tokens=global_batch_tokens,
        reasons=reasons,
    )
    for t in _powers_of_two(min(cluster.gpus_per_node, g)):
        for p in _powers_of_two(min(shape.n_layers, g)):
            alt = search.layout(t, p, 1, mode)
            if alt is not None:
                rec.alternatives.append((alt, search.memory(alt), search.fits(alt)))
    if sequences % g == 0:
        fsdp = replace(base, dp=g, zero=3, recompute=mode, microbatches=sequences // g)
        rec.alternatives.append((fsdp, search.memory(fsdp), search.fits(fsdp)))
    if pp > 1:
        bubble = (pp - 1) / (best.microbatches + pp - 1)
        if bubble > 0.1:
            rec.warnings.append(f"pipeline bubble {100 * bubble:.0f}%: raise the global batch or lower PP.")
    return rec


def given_layout(
    tp: int | None,
    pp: int | None,
    dp: int | None,
    gpus: int | None,
    zero: int | None,
    recompute: str,
    micro_batch: int,
    seq_len: int,
    precision: str,
    sequence_parallel: bool = True,
) -> Layout:
    """The layout of degrees a user names (`smelt plan memory --tp --pp --dp`): DP fills --gpus when not
    given, ZeRO-1 under data parallelism unless set, 4 micro batches per pipeline stage."""
    tp, pp = tp or 1, pp or 1
    if not dp and gpus:
        if gpus % (tp * pp):
            raise UserError(f"--gpus {gpus} is not divisible by --tp x --pp = {tp * pp}.")
        dp = gpus // (tp * pp)
    dp = dp or 1
    return Layout(tp=tp, pp=pp, dp=dp, zero=(1 if dp > 1 else 0) if zero is None else zero, recompute=recompute,
                  micro_batch=micro_batch, seq_len=seq_len, microbatches=4 * pp if pp > 1 else 1,
                  precision=precision, sequence_parallel=sequence_parallel)  # fmt: skip
