"""Which layers are mixture-of-experts, and the MoE keys' consistency: config arithmetic, no torch.

Kept apart from moe.py so that config validation and the parameter/FLOP counts (plan, without a
module built) need not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smelt.config import ModelConfig


def is_moe_layer(cfg: ModelConfig, layer: int) -> bool:
    """Layer `layer` (0-based) is MoE: experts are on, it is past the first moe_first_dense layers and
    it is every moe_every-th layer counted from the first sparse one."""
    if not cfg.moe_experts or layer < cfg.moe_first_dense:
        return False
    return (layer - cfg.moe_first_dense) % cfg.moe_every == 0


def moe_layers(cfg: ModelConfig) -> list[int]:
    return [i for i in range(cfg.n_layers) if is_moe_layer(cfg, i)]


def check_moe(cfg: ModelConfig, origin: str) -> None:
    """ConfigError for MoE keys that cannot work together (or that would silently do nothing)."""
    from smelt.errors import ConfigError

    if not cfg.moe_experts:
        return
    if cfg.moe_top_k > cfg.moe_experts:
        raise ConfigError(
            f"{origin}: model.moe_top_k ({cfg.moe_top_k}) exceeds model.moe_experts ({cfg.moe_experts}); "
            f"a token cannot be routed to more experts than there are. Lower model.moe_top_k."
        )
    if cfg.moe_first_dense >= cfg.n_layers:
        raise ConfigError(
            f"{origin}: model.moe_first_dense ({cfg.moe_first_dense}) leaves no MoE layer among "
            f"model.n_layers ({cfg.n_layers}); lower it, or set model.moe_experts = 0 for a dense model."
        )
    if cfg.moe_capacity_factor and cfg.moe_capacity_factor < 1.0:
        raise ConfigError(
            f"{origin}: model.moe_capacity_factor = {cfg.moe_capacity_factor:g} would drop tokens even when "
            f"the load is perfectly even; use 0 (dropless) or a value >= 1 (1.25 is common)."
        )


def check_expert_parallel(cfg: ModelConfig, expert_parallel: int, parallel: str, origin: str) -> None:
    """ConfigError for train.expert_parallel settings no world size can run (the world size itself is
    checked when training starts, by moe_parallel.setup_expert_parallel)."""
    from smelt.errors import ConfigError

    if expert_parallel == 1:
        return
    if not cfg.moe_experts:
        raise ConfigError(
            f"{origin}: train.expert_parallel = {expert_parallel} needs experts to split, but model.moe_experts = 0. "
            f"Set model.moe_experts, or train.expert_parallel = 1."
        )
    if cfg.moe_experts % expert_parallel:
        raise ConfigError(
            f"{origin}: model.moe_experts ({cfg.moe_experts}) must be a multiple of train.expert_parallel "
            f"({expert_parallel}): each process holds the same number of experts."
        )
    if parallel != "fsdp":
        raise ConfigError(
            f"{origin}: train.expert_parallel = {expert_parallel} composes with FSDP2: set train.parallel = 'fsdp' "
            f"(it is {parallel!r})."
        )
