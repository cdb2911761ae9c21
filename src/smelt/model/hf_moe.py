"""Hugging Face interop for mixture-of-experts models: Qwen3-MoE and Mixtral layouts.

smelt's MoE layer with softmax routing and no shared expert is the sparse block of two
`transformers` classes: `Qwen3MoeForCausalLM` (per-head QK-norm, any mix of dense and sparse
layers through `mlp_only_layers`, top-k weights renormalized or not by `norm_topk_prob`) and
`MixtralForCausalLM` (no QK-norm, every layer sparse, always renormalized). What neither computes is
refused, so an exported model never silently computes other logits: sigmoid gates, shared experts
and a trained auxiliary-loss-free selection bias. (OLMoE normalizes q and k over all heads at once,
not per head, so smelt's OLMoE-shaped preset exports as Qwen3-MoE.)

Weights: smelt keeps each layer's experts stacked as [E, d, f] / [E, f, d] for x @ W; `transformers`
keeps one nn.Linear per expert, [f, d] / [d, f]: a transpose per expert either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from smelt.config import ModelConfig
from smelt.config.moe import is_moe_layer
from smelt.errors import UserError

MOE_TYPES = ("qwen3_moe", "mixtral")
ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM"}


def moe_model_type(cfg: ModelConfig) -> str:
    """ "qwen3_moe" (with QK-norm) or "mixtral" (without); UserError naming the key otherwise."""
    problems = []
    if cfg.moe_gate != "softmax":
        problems.append(f"model.moe_gate = {cfg.moe_gate!r} (Qwen3-MoE and Mixtral route by softmax)")
    if cfg.moe_shared_experts:
        problems.append(
            f"model.moe_shared_experts = {cfg.moe_shared_experts} (neither class has a plain shared expert)"
        )
    if not cfg.qk_norm:
        if cfg.moe_first_dense or cfg.moe_every != 1:
            problems.append(
                "dense layers between MoE layers without model.qk_norm (Mixtral is sparse everywhere)"
            )
        if not cfg.moe_norm_topk:
            problems.append("model.moe_norm_topk = false without model.qk_norm (Mixtral always renormalizes)")
    if problems:
        raise UserError(
            f"cannot export this MoE model to Hugging Face: {'; '.join(problems)}. Qwen3-MoE takes softmax "
            f"routing with QK-norm; Mixtral softmax routing, renormalized top-k, on every layer."
        )
    return "qwen3_moe" if cfg.qk_norm else "mixtral"


def check_no_selection_bias(model: torch.nn.Module) -> None:
    """UserError if auxiliary-loss-free balancing left a bias in expert selection (export would drop it)."""
    from smelt.model.moe import moe_layers_of

    for i, layer in moe_layers_of(model):
        if bool(layer.expert_bias.abs().max() > 0):
            raise UserError(
                f"cannot export to Hugging Face: layer {i}'s experts carry the selection bias of "
                f"model.moe_bias_rate (auxiliary-loss-free balancing), which Qwen3-MoE and Mixtral routing "
                f"do not have, so the exported model would pick other experts. Export works for models "
                f"balanced by the auxiliary loss (model.moe_bias_rate = 0)."
            )


def moe_hf_fields(cfg: ModelConfig, model_type: str, expert_d_ff: int) -> dict[str, Any]:
    """The config.json keys of the sparse layers."""
    if model_type == "mixtral":
        return {
            "num_local_experts": cfg.moe_experts,
            "num_experts_per_tok": cfg.moe_top_k,
            "intermediate_size": expert_d_ff,
            "router_aux_loss_coef": cfg.moe_aux_loss,
            "router_jitter_noise": 0.0,
            "output_router_logits": False,
            "sliding_window": None,
        }
    return {
        "num_experts": cfg.moe_experts,
        "num_experts_per_tok": cfg.moe_top_k,
        "moe_intermediate_size": expert_d_ff,
        "norm_topk_prob": cfg.moe_norm_topk,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(cfg.n_layers) if not is_moe_layer(cfg, i)],
        "router_aux_loss_coef": cfg.moe_aux_loss,
        "output_router_logits": False,
    }


def _names(model_type: str, prefix: str) -> tuple[str, str, str, str]:
    """(router, gate, up, down) weight names of expert {j}: formatted with .format(j=...)."""
    if model_type == "mixtral":
        p = prefix + "block_sparse_moe."
        return (
            p + "gate.weight",
            p + "experts.{j}.w1.weight",
            p + "experts.{j}.w3.weight",
            p + "experts.{j}.w2.weight",
        )
    p = prefix + "mlp."
    return (
        p + "gate.weight",
        p + "experts.{j}.gate_proj.weight",
        p + "experts.{j}.up_proj.weight",
        p + "experts.{j}.down_proj.weight",
    )


def export_moe_layer(
    layer: torch.nn.Module, model_type: str, prefix: str, t: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    """One MoE layer's weights under `transformers` names (prefix "model.layers.{i}.")."""
    router, gate, up, down = _names(model_type, prefix)
    out = {router: t(layer.router.weight)}
    w_gate, w_up, w_down = (w.detach() for w in layer.expert_weights())
    for j in range(layer.n_experts):
        out[gate.format(j=j)] = t(w_gate[j].T)
        out[up.format(j=j)] = t(w_up[j].T)
        out[down.format(j=j)] = t(w_down[j].T)
    return out


def import_moe_layer(
    hf: dict[str, torch.Tensor], model_type: str, prefix: str, target: str, n_experts: int
) -> dict[str, torch.Tensor]:
    """smelt state-dict entries (under `target`, e.g. "blocks.3.mlp.") of one sparse layer."""
    router, gate, up, down = _names(model_type, prefix)
    stack = lambda name: torch.stack([hf[name.format(j=j)].T for j in range(n_experts)])  # noqa: E731
    return {
        target + "router.weight": hf[router],
        target + "w_gate": stack(gate),
        target + "w_up": stack(up),
        target + "w_down": stack(down),
        target + "expert_bias": torch.zeros(n_experts),  # transformers' routing has no selection bias
    }


def moe_config_from_hf(config: dict[str, Any], model_type: str, where: str) -> dict[str, Any]:
    """ModelConfig keys of a Qwen3-MoE or Mixtral config.json."""
    if model_type == "mixtral":
        return {
            "moe_experts": int(config["num_local_experts"]),
            "moe_top_k": int(config["num_experts_per_tok"]),
            "moe_d_ff": int(config["intermediate_size"]),
            "moe_norm_topk": True,
            "moe_aux_loss": float(config.get("router_aux_loss_coef", 0.01)),
        }
    n_layers, step = int(config["num_hidden_layers"]), int(config.get("decoder_sparse_step", 1))
    dense = set(config.get("mlp_only_layers") or [])
    sparse = [i for i in range(n_layers) if i not in dense and (i + 1) % step == 0]
    if not sparse:
        raise UserError(
            f"{where}: no layer is sparse (mlp_only_layers and decoder_sparse_step); nothing to import as MoE."
        )
    first, every = sparse[0], (sparse[1] - sparse[0] if len(sparse) > 1 else 1)
    keys = {"moe_first_dense": first, "moe_every": every}
    expected = [i for i in range(first, n_layers) if (i - first) % every == 0]
    if sparse != expected:
        raise UserError(
            f"{where}: sparse layers {sparse} are not 'the first k dense, then every m-th' "
            f"(model.moe_first_dense, model.moe_every), the layouts smelt builds."
        )
    return {
        **keys,
        "moe_experts": int(config["num_experts"]),
        "moe_top_k": int(config["num_experts_per_tok"]),
        "moe_d_ff": int(config["moe_intermediate_size"]),
        "moe_norm_topk": bool(config.get("norm_topk_prob", False)),
        "moe_aux_loss": float(config.get("router_aux_loss_coef", 0.001)),
    }
