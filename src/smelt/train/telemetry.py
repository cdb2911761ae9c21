"""Telemetry: what the field watches inside a run to catch trouble before the loss shows it.

Every `train.telemetry_every` steps the trainer calls `Telemetry.begin(step, ...)` before the step's
forward and backward (its one call in the loop); when `due(step)`:

- a forward without gradients of a sample of the step's first micro batch (its first rows, at most
  SAMPLE_TOKENS tokens and LOGIT_VALUES logits), through the eager model in eval mode, with forward
  hooks on the blocks and a probe on each attention, gives per layer the RMS of the residual stream
  after the block, the excess kurtosis of its values (outlier features make it grow) and the largest
  pre-softmax attention logit q.k / sqrt(head_dim) over the positions the mask lets attend (the usual
  trigger for QK-norm at about 50); and the largest output logit. One `kind: telemetry` record;
- around the optimizer's step (its step hooks, so a skipped or rolled-back update measures nothing),
  per parameter the update ratio ||dW|| / ||W|| and weight norm (monitors.UpdateRatioMonitor, at
  `train.monitor_every`, by default the same cadence) and the RMS of Adam's first and second moments,
  with the same figures pooled per layer. One `kind: layers` record.

Nothing runs and nothing is hooked on the other steps: the hooks and probes are set for the sampled
forward and taken off after it. The sampled forward changes no state (no gradients, eval mode, so MoE
routers count nothing, no random numbers), so a run's trajectory is the same with telemetry on or off.

Under torchrun every rank runs the same calls at the same steps. Sums (of the moments, of squares)
are added over every rank and maxima taken over every rank, as the gradient norm is: an element
that several ranks hold (tensor parallelism's replicated norms, DDP's whole copies) is counted once
for the optimizer figures; the activation figures are ratios of sums, which copies of the same
values do not change. Pipeline parallelism (each rank holds some layers) has none of it; context
parallelism (each rank attends over keys gathered from the others) has the optimizer figures only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from smelt.train.monitors import UpdateRatioMonitor
from smelt.train.parallel.collectives import all_reduce_sum
from smelt.train.parallel.distributed import element_copies

# The sampled forward's size: at most this many tokens, and at most this many logits ([rows, T, V]).
SAMPLE_TOKENS = 8192
LOGIT_VALUES = 1 << 27
# Attention scores computed at a time when looking for the largest logit ([B, H, rows, T] floats).
SCORE_BLOCK = 1 << 24
_LAYER = re.compile(r"(?:^|\.)blocks\.(\d+)\.")


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    """Max over every rank in place (identity for one process); returns it."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def layer_of(name: str) -> int | None:
    """The block index of a parameter name (blocks.3.attn.wq.weight -> 3), None outside the blocks."""
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def moments_to_figures(sums: torch.Tensor) -> tuple[list[float], list[float]]:
    """Per row [sum x, sum x^2, sum x^3, sum x^4, n]: (RMS, excess kurtosis) of the values; 0 for a
    normal distribution, large when a few values (outlier features) dwarf the rest."""
    rms, kurtosis = [], []
    for s1, s2, s3, s4, n in sums.tolist():
        if n <= 0:
            rms.append(float("nan"))
            kurtosis.append(float("nan"))
            continue
        m1, m2, m3, m4 = s1 / n, s2 / n, s3 / n, s4 / n
        var = m2 - m1 * m1
        central4 = m4 - 4 * m1 * m3 + 6 * m1 * m1 * m2 - 3 * m1**4
        rms.append(math.sqrt(max(m2, 0.0)))
        kurtosis.append(central4 / (var * var) - 3.0 if var > 0 else float("nan"))
    return rms, kurtosis


def max_attention_logit(q: torch.Tensor, k: torch.Tensor, doc_ids: torch.Tensor | None) -> torch.Tensor:
    """The largest q.k / sqrt(head_dim) of q [B, H, T, hd] against k [B, H_kv, T, hd] over the pairs
    causal attention within one document allows; computed a block of query rows at a time."""
    B, H, T, hd = q.shape
    keys = k.float()
    if keys.shape[1] != H:  # grouped-query attention: each key head serves H / H_kv query heads
        keys = keys.repeat_interleave(H // keys.shape[1], dim=1)
    keys_t = keys.transpose(-1, -2) * hd**-0.5
    position = torch.arange(T, device=q.device)
    block = max(1, SCORE_BLOCK // max(B * H * T, 1))
    best = torch.full((), -math.inf, device=q.device)
    for first in range(0, T, block):
        last = min(T, first + block)
        scores = torch.matmul(q[:, :, first:last].float(), keys_t)  # [B, H, rows, T]
        allowed = position[None, :] <= position[first:last, None]  # [rows, T]
        if doc_ids is not None:
            allowed = allowed & (doc_ids[:, first:last, None] == doc_ids[:, None, :])  # [B, rows, T]
            allowed = allowed[:, None]
        best = torch.maximum(best, scores.masked_fill(~allowed, -math.inf).amax())
    return best


class Telemetry:
    """The trainer's telemetry (module docstring). `write` takes a metrics record (rank 0 writes it)."""

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        write: Callable[[dict[str, Any]], None],
        *,
        every: int,
        ratio_every: int,
        sharded: bool,
        precision: Any,
        doc_masking: bool,
        vocab_size: int,
        activations_off: str | None = None,
        off: str | None = None,
    ) -> None:
        self.model, self.optimizer, self.write = model, optimizer, write
        self.every = 0 if off else every
        self.ratio_every = 0 if off else (every if ratio_every < 0 else ratio_every)
        self.activations_off = off or activations_off
        self.sharded, self.precision, self.doc_masking = sharded, precision, doc_masking
        self.vocab_size = vocab_size
        self.named = [(n.removeprefix("module."), p) for n, p in model.named_parameters() if p.requires_grad]
        self.ratios = UpdateRatioMonitor(model, sharded) if self.ratio_every else None
        self.pending: tuple[int, int, bool, bool] | None = None  # (step, tokens, ratios, moments)
        self.records = 0
        self.off = off
        if self.every or self.ratio_every:
            optimizer.register_step_pre_hook(lambda *_: self._before_update())
            optimizer.register_step_post_hook(lambda *_: self._after_update())

    def due(self, step: int) -> bool:
        return bool(self.every) and step % self.every == 0

    def ratios_due(self, step: int) -> bool:
        return bool(self.ratio_every) and step % self.ratio_every == 0

    def note(self) -> str:
        """What the start record says about telemetry."""
        if self.off:
            return f"off: {self.off}"
        parts = [f"every {self.every} steps" if self.every else "off (train.telemetry_every = 0)"]
        if self.every and self.activations_off:
            parts.append(f"optimizer figures only: {self.activations_off}")
        parts.append(
            f"update ratios every {self.ratio_every} steps" if self.ratio_every else "update ratios off"
        )
        return "; ".join(parts)

    def state_dict(self) -> dict[str, Any]:
        return {"every": self.every, "ratio_every": self.ratio_every, "records": self.records}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.records = int(state.get("records", 0))

    # --- the trainer's call ----------------------------------------------------------------------

    def begin(self, step: int, tokens: int, parts: list[Any]) -> None:
        """Before step `step`'s forward and backward: the sampled forward when due, and arm the
        optimizer hooks for the update that may follow."""
        due, ratios = self.due(step), self.ratios_due(step)
        self.pending = (step, tokens, ratios, due) if due or ratios else None
        if due and not self.activations_off:
            record = {"kind": "telemetry", "step": step, "tokens": tokens, **self.capture(parts[0].micro[0])}
            self.write(record)
            self.records += 1

    # --- the sampled forward ---------------------------------------------------------------------

    def sample_rows(self, batch_rows: int, seq_len: int) -> int:
        by_tokens = SAMPLE_TOKENS // max(seq_len, 1)
        by_logits = LOGIT_VALUES // max(seq_len * self.vocab_size, 1)
        return max(1, min(batch_rows, by_tokens, by_logits))

    @torch.no_grad()
    def capture(self, batch: Any) -> dict[str, Any]:
        """Per-layer activation RMS, excess kurtosis and max attention logit, and the max output logit,
        of the first rows of `batch`, over every rank."""
        model = self.model
        device = next(iter(_local(p) for _, p in self.named)).device
        rows = self.sample_rows(batch.inputs.shape[0], batch.inputs.shape[1])
        inputs = batch.inputs[:rows].to(device)
        docs: dict[str, torch.Tensor] = {}
        if self.doc_masking and getattr(batch, "doc_ids", None) is not None:
            docs = {
                "doc_ids": batch.doc_ids[:rows].to(device),
                "position_ids": batch.position_ids[:rows].to(device),
            }
        blocks = list(model.blocks)  # type: ignore[attr-defined]
        n = len(blocks)
        sums = torch.zeros(n, 5, dtype=torch.float64, device=device)
        maxima = torch.full((n + 1,), -math.inf, dtype=torch.float32, device=device)
        doc_ids = docs.get("doc_ids")
        width = [1]  # the residual stream's width: the sampled tokens are its values over it

        def on_block(i: int) -> Callable[..., None]:
            def hook(_module: nn.Module, _args: Any, out: torch.Tensor) -> None:
                width[0] = out.shape[-1]
                # fp32 powers summed in fp64: no fp64 copy of the activations.
                x = _local(out).detach().float().flatten()
                squared = x * x
                f64 = torch.float64
                sums[i] += torch.stack(
                    [x.sum(dtype=f64), squared.sum(dtype=f64), (squared * x).sum(dtype=f64),
                     (squared * squared).sum(dtype=f64), torch.tensor(float(x.numel()), dtype=f64, device=x.device)]
                )  # fmt: skip

            return hook

        def on_attention(i: int) -> Callable[..., None]:
            def probe(q: torch.Tensor, k: torch.Tensor) -> None:
                maxima[i] = torch.maximum(maxima[i], max_attention_logit(q, k, doc_ids))

            return probe

        handles = [block.register_forward_hook(on_block(i)) for i, block in enumerate(blocks)]
        for i, block in enumerate(blocks):
            block.attn.probe = on_attention(i)
        was_training = model.training
        model.eval()  # MoE routers count no load in eval mode: the balancing state stays the training's
        try:
            with self.precision.autocast():
                logits, _ = model(inputs, **docs)
            maxima[n] = _local(logits).amax().float()
        finally:
            for handle in handles:
                handle.remove()
            for block in blocks:
                block.attn.probe = None
            model.train(was_training)
        all_reduce_sum(sums)
        all_reduce_max(maxima)
        sums = sums.cpu()
        rms, kurtosis = moments_to_figures(sums)
        peaks = maxima.cpu().tolist()
        return {
            "sample_tokens": round(float(sums[0, 4]) / width[0]) if n else 0,  # over the data-parallel ranks
            "act_rms": [_round(v) for v in rms],
            "act_kurtosis": [_round(v) for v in kurtosis],
            "attn_logit_max": [_round(v) for v in peaks[:n]],
            "logit_max": _round(peaks[n]),
        }

    # --- around the optimizer's step -------------------------------------------------------------

    def _before_update(self) -> None:
        if self.pending is not None and self.pending[2] and self.ratios is not None:
            self.ratios.snapshot()

    def _after_update(self) -> None:
        if self.pending is None:
            return
        step, tokens, ratios, moments = self.pending
        self.pending = None
        figures = self.ratios.measure() if ratios and self.ratios is not None and self.ratios.before else {}
        by_layer: dict[str, list[float | None]] = {}
        if moments:
            per_param, by_layer = self.moment_figures()
            for name, values in per_param.items():
                figures.setdefault(name, {}).update(values)
        if ratios and figures:
            by_layer.update(self.pooled_ratios(figures))
        if figures:
            self.write({"kind": "layers", "step": step, "tokens": tokens, "layers": figures,
                        **({"by_layer": by_layer} if by_layer else {})})  # fmt: skip

    def moment_figures(self) -> tuple[dict[str, dict[str, float]], dict[str, list[float | None]]]:
        """RMS of Adam's first and second moments per parameter (exp_avg, exp_avg_sq; Muon's momentum
        counts as a first moment) and pooled per layer, each element counted once over the ranks."""
        state = self.optimizer.state
        # Per parameter: [sum m^2, count m, sum v^2, count v].
        sums = torch.zeros(len(self.named), 4, dtype=torch.float64)
        world = dist.get_world_size() if self.sharded and dist.is_initialized() else 1
        for i, (_, p) in enumerate(self.named):
            s = state.get(p) or {}
            first = s.get("exp_avg", s.get("momentum_buffer"))
            second = s.get("exp_avg_sq")
            copies = float(element_copies(p, world)) if world > 1 else 1.0
            for column, moment in ((0, first), (2, second)):
                if moment is None:
                    continue
                local = _local(moment).detach()
                sums[i, column] = torch.linalg.vector_norm(local.double()).pow(2).cpu() / copies
                sums[i, column + 1] = local.numel() / copies
        if world > 1:
            all_reduce_sum(sums)
        per_param = {}
        for i, (name, _) in enumerate(self.named):
            values = {}
            if sums[i, 1] > 0:
                values["adam_m_rms"] = _round(math.sqrt(sums[i, 0] / sums[i, 1]))
            if sums[i, 3] > 0:
                values["adam_v_rms"] = _round(math.sqrt(sums[i, 2] / sums[i, 3]))
            if values:
                per_param[name] = values
        layers = self._layer_count()
        pooled = torch.zeros(layers, 4, dtype=torch.float64)
        for i, (name, _) in enumerate(self.named):
            layer = layer_of(name)
            if layer is not None and layer < layers:
                pooled[layer] += sums[i]
        by_layer = {
            "adam_m_rms": [_rms(row[0], row[1]) for row in pooled.tolist()],
            "adam_v_rms": [_rms(row[2], row[3]) for row in pooled.tolist()],
        }
        return per_param, by_layer

    def pooled_ratios(self, figures: dict[str, dict[str, float]]) -> dict[str, list[float | None]]:
        """Per layer, ||dW|| / ||W|| over all of the layer's parameters together."""
        layers = self._layer_count()
        update, weight = [0.0] * layers, [0.0] * layers
        for name, values in figures.items():
            layer = layer_of(name)
            ratio, norm = values.get("update_ratio"), values.get("weight_norm")
            if layer is None or layer >= layers or ratio is None or norm is None or not math.isfinite(ratio):
                continue
            update[layer] += (ratio * norm) ** 2
            weight[layer] += norm**2
        return {
            "update_ratio": [
                _round(math.sqrt(u / w)) if w > 0 else None for u, w in zip(update, weight, strict=True)
            ]
        }

    def _layer_count(self) -> int:
        found = [layer_of(name) for name, _ in self.named]
        return max((x for x in found if x is not None), default=-1) + 1


def _rms(square_sum: float, count: float) -> float | None:
    return _round(math.sqrt(square_sum / count)) if count > 0 else None


def _round(value: float) -> float | None:
    """Five significant digits; None for NaN or Inf (metrics.jsonl holds plain JSON)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.5g}")


def telemetry_for(t: Any) -> Telemetry:
    """The Telemetry of a Trainer (trainer.py), from its config and layout."""
    tc, layout = t.tc, t.mesh.layout
    off = "pipeline parallelism (each rank holds a stage of the layers)" if layout.pp > 1 else None
    cp = "context parallelism (each rank's attention gathers keys from the others)" if layout.cp > 1 else None
    return Telemetry(
        t.model, t.optimizer, lambda record: t.metrics.write(record), every=tc.telemetry_every,
        ratio_every=tc.monitor_every, sharded=t.sharded, precision=t.precision, doc_masking=tc.doc_masking,
        vocab_size=t.vocab_size, activations_off=cp, off=off,
    )  # fmt: skip
