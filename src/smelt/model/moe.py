"""A mixture-of-experts MLP: E routed SwiGLU experts, top-k token-choice routing, optional shared experts.

Routing. A linear router (in fp32) scores every expert for every token, by softmax or by sigmoid
(`moe_gate`); each token goes to the k best. With the auxiliary-loss-free balancing of DeepSeek-V3
(`moe_bias_rate` > 0) a per-expert bias is added to the scores for the *choice* only, never to the
gate weights, and after each optimizer step the bias of every expert that got more than the mean
load is lowered by the rate and the others raised (`update_expert_bias`). The gate weights of the
chosen experts are renormalized to sum to 1 when `moe_norm_topk` (Qwen3-MoE) or kept as they are
(OLMoE).

Computation. Token copies are sorted by expert (a stable sort, so that within an expert they stay
in token order), each expert's contiguous slice goes through one matmul per weight (one grouped
matmul for all experts where torch has it for the dtype and shapes, else one per expert), and the
weighted outputs are added back to their tokens. Nothing loops over tokens. Dropless by default;
with `moe_capacity_factor` c an expert takes at most ceil(c * tokens * k / E) token copies, the
earliest first, and the rest are dropped (the token keeps its residual and its other experts); the
drops are counted.

Balancing losses. The load-balancing loss E * sum_i f_i P_i (f_i: the share of token copies sent to
expert i, P_i: its mean router probability; Switch / OLMoE) and the router z-loss mean(logsumexp^2)
(ST-MoE), weighted by their coefficients, are left in the layer's `aux_loss` by each forward; the
transformer adds them to the training loss. Training forwards also add the layer's expert loads and
router entropy to a window that `router_metrics` reads (and restarts) for metrics.jsonl.

Expert parallelism (moe_parallel.py) splits the experts over a process group: this module then owns
experts [rank * E/P, (rank + 1) * E/P) and exchanges token copies with the others by all-to-all.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from smelt.config import ModelConfig
from smelt.model.flops import resolved_d_ff


def expert_d_ff(cfg: ModelConfig) -> int:
    """Hidden size of one expert: moe_d_ff, else the dense model's d_ff."""
    return cfg.moe_d_ff or resolved_d_ff(cfg)


def _grouped_mm_usable(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """torch._grouped_mm takes this dtype and these shapes on this device (rows 16-byte aligned)."""
    if x.device.type == "cuda":
        if x.dtype != torch.bfloat16 or torch.cuda.get_device_capability(x.device) < (9, 0):
            return False
    elif x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
        return False
    if not hasattr(torch, "_grouped_mm"):
        return False
    size = x.element_size()
    return all(
        w.dtype == x.dtype and w.shape[1] * size % 16 == 0 and w.shape[2] * size % 16 == 0 for w in weights
    )


def grouped_swiglu(
    xs: torch.Tensor, counts: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor
) -> torch.Tensor:
    """SwiGLU of token rows sorted by expert: rows [offs[e-1], offs[e]) go through expert e.

    xs [N, d]; counts [E] rows per expert (sum N); w_gate, w_up [E, d, f]; w_down [E, f, d].
    """
    if torch.is_autocast_enabled(xs.device.type):
        # The grouped kernel is not on autocast's list: cast by hand, as autocast would for a matmul.
        dtype = torch.get_autocast_dtype(xs.device.type)
        xs, w_gate, w_up, w_down = (t.to(dtype) for t in (xs, w_gate, w_up, w_down))
    if _grouped_mm_usable(xs, w_gate, w_up, w_down):
        offs = torch.cumsum(counts, 0).to(torch.int32)
        h = F.silu(torch._grouped_mm(xs, w_gate, offs=offs)) * torch._grouped_mm(xs, w_up, offs=offs)
        return torch._grouped_mm(h, w_down, offs=offs)
    # One matmul per expert over its contiguous slice (a loop over experts, not tokens).
    outs = []
    for e, rows in enumerate(xs.split(counts.tolist())):
        if rows.shape[0]:
            outs.append((F.silu(rows @ w_gate[e]) * (rows @ w_up[e])) @ w_down[e])
    return torch.cat(outs) if outs else xs.new_zeros(0, w_down.shape[-1])


class SwiGLU(nn.Module):
    """The shared expert(s): a dense SwiGLU of hidden size d_ff (Linear layers, like the dense MLP)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    """Routed experts (+ shared ones) replacing one block's MLP. forward(x [B, T, d]) -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_experts, self.top_k = cfg.moe_experts, cfg.moe_top_k
        self.gate_kind, self.norm_topk = cfg.moe_gate, cfg.moe_norm_topk
        self.capacity_factor = cfg.moe_capacity_factor
        self.aux_coef, self.z_coef, self.bias_rate = cfg.moe_aux_loss, cfg.moe_z_loss, cfg.moe_bias_rate
        d, f = cfg.d_model, expert_d_ff(cfg)
        self.router = nn.Linear(d, self.n_experts, bias=False)
        # Experts as stacked [E, in, out] weights, the grouped matmul's layout (x @ W).
        self.w_gate = nn.Parameter(torch.empty(self.n_experts, d, f))
        self.w_up = nn.Parameter(torch.empty(self.n_experts, d, f))
        self.w_down = nn.Parameter(torch.empty(self.n_experts, f, d))
        self.shared = SwiGLU(d, f * cfg.moe_shared_experts) if cfg.moe_shared_experts else None
        # The balancing bias is state (checkpointed); the load since the last bias update is not.
        self.register_buffer("expert_bias", torch.zeros(self.n_experts))
        self.register_buffer(
            "pending_load", torch.zeros(self.n_experts, dtype=torch.float64), persistent=False
        )
        # The logging window: token copies per expert; router entropy sum, tokens, dropped copies.
        self.register_buffer(
            "window_load", torch.zeros(self.n_experts, dtype=torch.float64), persistent=False
        )
        self.register_buffer("window_stats", torch.zeros(3, dtype=torch.float64), persistent=False)
        # Set by moe_parallel.shard_experts: the process group the experts are split over.
        self.ep_group = None
        self.ep_rank, self.ep_size = 0, 1
        self.aux_loss: torch.Tensor | None = None  # the latest forward's balancing loss

    @torch.no_grad()
    def reset_counters(self) -> None:
        """Zero the bias update's pending load and the logging window (not the bias itself)."""
        for buffer in (self.pending_load, self.window_load, self.window_stats):
            buffer.zero_()

    @property
    def local_experts(self) -> int:
        return self.n_experts // self.ep_size

    def expert_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's expert weights as plain tensors (DTensor shards under expert parallelism)."""
        return tuple(
            w.to_local() if hasattr(w, "to_local") else w for w in (self.w_gate, self.w_up, self.w_down)
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(expert ids [N, k], gate weights [N, k], router probabilities [N, E], router logits [N, E]).
        In fp32 under autocast too, which would otherwise run the router's matmul in bf16 (8 bits of
        mantissa: near-tied experts swap places)."""
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.float(), self.router.weight.float())
        if self.gate_kind == "softmax":
            probs = torch.softmax(logits, dim=-1)
            scores = probs
        else:
            scores = torch.sigmoid(logits)
            probs = scores / scores.sum(dim=-1, keepdim=True)
        choice = scores + self.expert_bias.float() if self.bias_rate else scores
        experts = torch.topk(choice, self.top_k, dim=-1, sorted=True).indices
        weights = scores.gather(-1, experts)
        if self.norm_topk:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return experts, weights, probs, logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, d = x.shape
        flat = x.reshape(B * T, d)
        n = flat.shape[0]
        experts, weights, probs, logits = self.route(flat)
        load = torch.bincount(experts.flatten(), minlength=self.n_experts)

        # Sort the N*k token copies by expert; stable, so each expert sees its tokens in order.
        copy_expert = experts.flatten()
        order = torch.argsort(copy_expert, stable=True)
        copy_token = order // self.top_k
        copy_weight = weights.flatten()[order]
        counts = load
        dropped = 0
        if self.capacity_factor:
            capacity = math.ceil(self.capacity_factor * n * self.top_k / self.n_experts)
            starts = torch.cumsum(load, 0) - load
            rank_in_expert = torch.arange(order.numel(), device=x.device) - starts[copy_expert[order]]
            keep = rank_in_expert < capacity
            dropped = int((~keep).sum())
            order, copy_token, copy_weight = order[keep], copy_token[keep], copy_weight[keep]
            counts = load.clamp(max=capacity)

        rows = flat[copy_token]
        if self.ep_group is not None:
            from smelt.model.moe_parallel import expert_parallel_swiglu

            out_rows = expert_parallel_swiglu(self, rows, counts)
        else:
            out_rows = grouped_swiglu(rows, counts, *self.expert_weights())
        out_rows = out_rows * copy_weight.unsqueeze(-1).to(out_rows.dtype)
        out = torch.zeros(n, d, device=x.device, dtype=out_rows.dtype).index_add_(0, copy_token, out_rows)
        if self.shared is not None:
            shared = self.shared(flat)
            out = out.to(shared.dtype) + shared
        self.aux_loss = self._balancing_loss(load, probs, logits, n)
        self._count(load, probs, n, dropped)
        return out.view(B, T, d)

    def _balancing_loss(
        self, load: torch.Tensor, probs: torch.Tensor, logits: torch.Tensor, n: int
    ) -> torch.Tensor:
        """aux_coef * E * sum_i f_i P_i + z_coef * mean(logsumexp(logits)^2), a scalar with gradient."""
        loss = probs.new_zeros(())
        if self.aux_coef:
            share = load.float() / max(n * self.top_k, 1)
            loss = loss + self.aux_coef * self.n_experts * (share * probs.mean(0)).sum()
        if self.z_coef:
            loss = loss + self.z_coef * torch.logsumexp(logits, dim=-1).pow(2).mean()
        return loss

    @torch.no_grad()
    def _count(self, load: torch.Tensor, probs: torch.Tensor, n: int, dropped: int) -> None:
        """Add this forward's loads to the bias update and to the logging window (training only)."""
        # Activation checkpointing re-runs this forward inside the backward pass: count the real
        # forward only (the recompute would count every token twice).
        if not self.training or torch._C._current_graph_task_id() != -1:
            return
        load = load.to(self.window_load)
        if self.bias_rate:
            self.pending_load += load
        self.window_load += load
        entropy = -(probs * probs.clamp_min(1e-20).log()).sum()
        self.window_stats += torch.stack(
            [entropy.double(), torch.tensor(float(n)), torch.tensor(float(dropped))]
        ).to(self.window_stats)


def moe_layers_of(model: nn.Module) -> list[tuple[int, MoE]]:
    """(layer index, MoE module) of every sparse block of a Transformer (wrapped or not)."""
    blocks = getattr(model, "blocks", None) or getattr(getattr(model, "module", None), "blocks", [])
    return [(i, block.mlp) for i, block in enumerate(blocks) if isinstance(block.mlp, MoE)]


@torch.no_grad()
def update_expert_bias(model: nn.Module) -> None:
    """The auxiliary-loss-free balancing step (DeepSeek-V3), once per optimizer step.

    b_i += rate * sign(mean load - load_i), over the token copies each expert got since the last
    update (summed over every process, so that all ranks keep the same bias). No-op without
    moe_bias_rate.
    """
    layers = [m for _, m in moe_layers_of(model) if m.bias_rate]
    if not layers:
        return
    # Summed over ranks (the buffers live on the model's device, which is what the backend moves).
    loads = _reduce_over_ranks(torch.stack([m.pending_load for m in layers]))
    for m, load in zip(layers, loads, strict=True):
        if load.sum() > 0:
            m.expert_bias += m.bias_rate * torch.sign(load.mean() - load).to(m.expert_bias)
        m.pending_load.zero_()


def _reduce_over_ranks(t: torch.Tensor) -> torch.Tensor:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t


@torch.no_grad()
def router_metrics(model: nn.Module) -> dict[str, object]:
    """metrics.jsonl fields over the window since the last call, summed over every process (so every
    rank must call it at the same step), then the window restarts. {} for a dense model.

    moe_layers: the sparse layers' indices; moe_load: per layer, each expert's share of the token
    copies; moe_max_mean: per layer, the busiest expert's load over the mean load (1 is perfect
    balance); moe_entropy: per layer, the mean entropy of the router distribution (nats; ln E is
    uniform); moe_dropped: per layer, token copies the capacity limit dropped.
    """
    layers = moe_layers_of(model)
    if not layers:
        return {}
    both = torch.stack([torch.cat([m.window_load, m.window_stats]) for _, m in layers])
    both = _reduce_over_ranks(both).cpu()
    for _, m in layers:
        m.window_load.zero_()
        m.window_stats.zero_()
    n_experts = layers[0][1].n_experts
    loads, stats = both[:, :n_experts], both[:, n_experts:]
    if float(stats[:, 1].sum()) == 0:
        return {}
    shares = loads / loads.sum(dim=1, keepdim=True).clamp_min(1)
    ratio = loads.max(dim=1).values / loads.mean(dim=1).clamp_min(1e-12)
    return {
        "moe_layers": [i for i, _ in layers],
        "moe_load": [[round(float(s), 5) for s in row] for row in shares],
        "moe_max_mean": [round(float(r), 4) for r in ratio],
        "moe_entropy": [round(float(e / max(t, 1)), 4) for e, t, _ in stats.tolist()],
        "moe_dropped": [int(dr) for _, _, dr in stats.tolist()],
    }


def auxiliary_loss(model: nn.Module) -> torch.Tensor | None:
    """The sum of every MoE layer's balancing loss from the latest forward (None for a dense model)."""
    losses = [m.aux_loss for _, m in moe_layers_of(model) if m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None
