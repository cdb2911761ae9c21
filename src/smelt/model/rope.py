"""Rotary position embeddings, and the scalings that stretch a trained model to a longer context.

A head's rotary dims rotate in pairs by angles t * w_j, w_j = theta^(-2j / r) for position t. A model
trained at length L has only seen angles up to L * w_j; `model.rope_scaling` changes the frequencies
so that a continuation at k * L (k = model.rope_factor) starts from angles it knows:

    none    w_j unchanged. Raising model.rope_theta itself is "adjusted base frequency" (ABF, as in
            Code Llama and Llama 3's long-context stages): every frequency slows down.
    linear  position interpolation (Chen et al. 2023): w_j / k, positions squeezed into [0, L).
    ntk     "NTK-aware" base change: theta * k^(r / (r - 2)), which keeps the fastest pair as it was
            and slows the slowest by k (ABF with the base chosen from k).
    yarn    YaRN (Peng et al. 2023): pairs that turn fewer than beta_slow times over L are
            interpolated (w_j / k), pairs that turn more than beta_fast times are kept, with a linear
            ramp between; cos and sin are scaled by 0.1 ln k + 1, the attention temperature.

The formulas are those of transformers' modeling_rope_utils (_compute_linear_scaling_rope_parameters,
_compute_yarn_parameters), so an exported model (model.rope_scaling -> config.json's rope_scaling)
computes the same logits; `hf_rope_fields` and `rope_from_hf` translate in both directions.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import torch

from smelt.errors import UserError

if TYPE_CHECKING:
    from smelt.config import ModelConfig

ROPE_SCALINGS = ("none", "linear", "ntk", "yarn")


def rope_inv_freq(rot_dim: int, theta: float) -> torch.Tensor:
    """w_j = theta^(-2j / rot_dim) for j < rot_dim / 2, fp64."""
    return 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))


def ntk_theta(theta: float, factor: float, rot_dim: int) -> float:
    """The base of NTK-aware scaling: theta * factor^(r / (r - 2))."""
    return theta * factor ** (rot_dim / (rot_dim - 2)) if rot_dim > 2 else theta * factor


def yarn_attention_factor(factor: float) -> float:
    """YaRN's temperature on cos and sin (so on q . k, squared): 0.1 ln(factor) + 1, 1 for factor <= 1."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def yarn_inv_freq(
    rot_dim: int, theta: float, factor: float, original_len: int, beta_fast: float, beta_slow: float
) -> torch.Tensor:
    """YaRN's blend of interpolated (w_j / factor) and original frequencies, fp64.

    Pair j turns L w_j / (2 pi) times over the original length L; the ramp runs between the pair that
    turns beta_fast times (kept, above it) and the one that turns beta_slow times (interpolated, below
    it), with the bounds rounded outwards as transformers does (truncate = True).
    """

    def pair_turning(turns: float) -> float:
        return rot_dim * math.log(original_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), rot_dim - 1)
    if low == high:
        high += 0.001  # as transformers does: a ramp of zero width would divide by zero
    ramp = ((torch.arange(rot_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: the original frequency, 0: interpolated
    base = rope_inv_freq(rot_dim, theta)
    return base / factor * (1 - keep) + base * keep


def scaled_inv_freq(cfg: ModelConfig, rot_dim: int) -> tuple[torch.Tensor, float]:
    """(frequencies [rot_dim / 2] fp64, factor on cos and sin) under cfg's RoPE scaling."""
    kind, factor = cfg.rope_scaling, cfg.rope_factor
    if kind not in ROPE_SCALINGS:
        raise UserError(f"model.rope_scaling = {kind!r} is not one of {', '.join(ROPE_SCALINGS)}.")
    if kind == "linear":
        return rope_inv_freq(rot_dim, cfg.rope_theta) / factor, 1.0
    if kind == "ntk":
        return rope_inv_freq(rot_dim, ntk_theta(cfg.rope_theta, factor, rot_dim)), 1.0
    if kind == "yarn":
        if cfg.rope_original_max_seq_len <= 0:
            raise UserError(
                "model.rope_scaling = 'yarn' needs model.rope_original_max_seq_len: set it to the sequence "
                "length the model was trained at before the extension (e.g. 256)."
            )
        inv_freq = yarn_inv_freq(
            rot_dim,
            cfg.rope_theta,
            factor,
            cfg.rope_original_max_seq_len,
            cfg.yarn_beta_fast,
            cfg.yarn_beta_slow,
        )
        return inv_freq, yarn_attention_factor(factor)
    return rope_inv_freq(rot_dim, cfg.rope_theta), 1.0


def rope_table(
    rot_dim: int, max_seq_len: int, theta: float, inv_freq: torch.Tensor | None = None, scale: float = 1.0
) -> torch.Tensor:
    """(cos, sin) of the rotary angles t * w_j, times `scale`, [max_seq_len, rot_dim / 2, 2], fp32.

    w_j = theta^(-2j / rot_dim) unless `inv_freq` gives them. Angles are formed in fp64 so large
    positions keep their precision. The table is stored real, not complex, so that casting the module
    (model.to(torch.bfloat16)) cannot silently drop the sines.
    """
    if inv_freq is None:
        inv_freq = rope_inv_freq(rot_dim, theta)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq.double())
    return (torch.stack((angles.cos(), angles.sin()), dim=-1) * scale).float()


def model_rope_table(cfg: ModelConfig, rot_dim: int) -> torch.Tensor:
    """The rope table of a model: cfg.max_seq_len positions under cfg's scaling."""
    inv_freq, scale = scaled_inv_freq(cfg, rot_dim)
    return rope_table(rot_dim, cfg.max_seq_len, cfg.rope_theta, inv_freq, scale)


def extend_context(model: torch.nn.Module, max_seq_len: int) -> torch.nn.Module:
    """Widen a Transformer's RoPE table to max_seq_len positions, in place, under its own scaling (no
    new scaling): to measure how a model extrapolates past the length it was built for, e.g. passkey
    accuracy before a context extension. Returns the model."""
    model.cfg = dataclasses.replace(model.cfg, max_seq_len=max_seq_len)
    rot_dim = 2 * model.rope.shape[-2]
    model.rope = model_rope_table(model.cfg, rot_dim).to(model.rope.device)
    return model


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of x [B, H, T, hd] by the angles of table [..., T, r/2, 2], in fp32.

    The table broadcasts against x (e.g. [B, 1, T, r/2, 2] for per-sequence positions). With a
    partial rotary dim r < hd only the first r dims of each head rotate; the rest pass through.
    """
    rot = 2 * table.shape[-2]
    if rot < x.shape[-1]:
        return torch.cat((apply_rope(x[..., :rot], table), x[..., rot:]), dim=-1)
    table = table.float()
    xf = x.float().unflatten(-1, (-1, 2))
    if torch.compiler.is_compiling():
        # Inductor fuses this real form into one kernel; it cannot generate code for complex ops.
        cos, sin = table[..., 0], table[..., 1]
        x0, x1 = xf[..., 0], xf[..., 1]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    else:
        # Eager: one complex multiply is ~3x faster on CPU than the real form's separate ops and copies.
        out = torch.view_as_real(torch.view_as_complex(xf) * torch.view_as_complex(table.contiguous()))
    return out.flatten(-2).type_as(x)


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json


def hf_rope_fields(cfg: ModelConfig, rot_dim: int) -> dict[str, Any]:
    """config.json's "rope_theta" and "rope_scaling" for cfg, in transformers' terms.

    transformers has no static NTK type ("dynamic" changes with the input length), so ntk is written
    as what it is: the plain rope_theta it amounts to.
    """
    kind, factor = cfg.rope_scaling, float(cfg.rope_factor)
    if kind == "ntk":
        return {"rope_theta": ntk_theta(cfg.rope_theta, factor, rot_dim), "rope_scaling": None}
    if kind == "linear":
        return {"rope_theta": cfg.rope_theta, "rope_scaling": {"rope_type": "linear", "factor": factor}}
    if kind == "yarn":
        scaling = {
            "rope_type": "yarn",
            "factor": factor,
            "original_max_position_embeddings": cfg.rope_original_max_seq_len,
            "beta_fast": float(cfg.yarn_beta_fast),
            "beta_slow": float(cfg.yarn_beta_slow),
        }
        return {"rope_theta": cfg.rope_theta, "rope_scaling": scaling}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": None}


def rope_from_hf(config: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """The ModelConfig RoPE keys of a transformers config.json; UserError for a scaling smelt lacks."""
    keys: dict[str, Any] = {"rope_theta": float(config.get("rope_theta", 10_000.0))}
    scaling = config.get("rope_scaling")
    if not scaling:
        return keys
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return keys
    if kind not in ("linear", "yarn"):
        raise UserError(
            f"{where}: rope_scaling of type {kind!r} cannot be imported; smelt computes linear and yarn "
            f"(and NTK as a plain rope_theta)."
        )
    keys.update(rope_scaling=kind, rope_factor=float(scaling["factor"]))
    if kind == "linear":
        return keys
    factor = float(scaling["factor"])
    attention = scaling.get("attention_factor")
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    custom = attention is not None and not math.isclose(attention, yarn_attention_factor(factor))
    if custom or (mscale and mscale_all_dim) or scaling.get("truncate", True) is False:
        raise UserError(
            f"{where}: rope_scaling {scaling} sets attention_factor, mscale/mscale_all_dim or truncate; "
            f"smelt's yarn uses the default temperature 0.1 ln(factor) + 1 and rounded ramp bounds only."
        )
    keys.update(
        rope_original_max_seq_len=int(
            scaling.get("original_max_position_embeddings") or config.get("max_position_embeddings", 2048)
        ),
        yarn_beta_fast=float(scaling.get("beta_fast") or 32.0),
        yarn_beta_slow=float(scaling.get("beta_slow") or 1.0),
    )
    return keys
