"""`smelt plan model PRESET`: sizes, FLOPs and memory of a model shape, from the config alone."""

from __future__ import annotations

from smelt.config import ModelConfig
from smelt.config.moe import moe_layers
from smelt.config.presets import MODEL_PRESETS
from smelt.errors import UserError
from smelt.model.flops import count_params, flops_per_token, head_dim_of, resolved_d_ff

DEFAULT_VOCAB = 32_768


def preset_config(name: str, **overrides: object) -> ModelConfig:
    """The ModelConfig of a named preset, with any keys overridden."""
    if name not in MODEL_PRESETS:
        raise UserError(f"unknown model preset {name!r}. Known presets: {', '.join(MODEL_PRESETS)}.")
    return ModelConfig(preset=name, **{**MODEL_PRESETS[name], **overrides})


def kv_cache_bytes_per_token(cfg: ModelConfig, bytes_per_value: int = 2) -> int:
    """Keys and values of every layer for one token (bf16: 2 bytes per value)."""
    head_dim = head_dim_of(cfg)
    return 2 * cfg.n_layers * (cfg.n_kv_heads or cfg.n_heads) * head_dim * bytes_per_value


def _human(n: float, unit: str = "") -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}{unit}".rstrip()
    return f"{n:g} {unit}".rstrip()


def _bytes(n: float) -> str:
    for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n >= scale:
            return f"{n / scale:.2f} {suffix}"
    return f"{int(n)} B"


def expert_d_ff(cfg: ModelConfig) -> int:
    return cfg.moe_d_ff or resolved_d_ff(cfg)


def describe_config(
    cfg: ModelConfig, vocab_size: int = DEFAULT_VOCAB, seq_len: int | None = None
) -> list[tuple[str, str]]:
    """(label, value) rows: shape, parameters, FLOPs per token, KV cache and weight memory."""
    seq = seq_len or cfg.max_seq_len
    counts = count_params(cfg, vocab_size)
    head_dim = head_dim_of(cfg)
    kv = cfg.n_kv_heads or cfg.n_heads
    flops = flops_per_token(cfg, vocab_size, seq)
    kv_bytes = kv_cache_bytes_per_token(cfg)
    rows = [
        (
            "shape",
            f"d_model {cfg.d_model}, {cfg.n_layers} layers, {cfg.n_heads} heads x {head_dim}, "
            f"{kv} kv heads"
            + (f", d_ff {resolved_d_ff(cfg)}" if len(moe_layers(cfg)) < cfg.n_layers else ""),
        ),  # fmt: skip
        ("vocabulary", f"{vocab_size:,} ({'tied' if cfg.tie_embeddings else 'untied'} head)"),
        ("parameters (total)", f"{counts['total']:,} ({_human(counts['total'])})"),
        ("parameters (non-embedding)", f"{counts['non_embedding']:,} ({_human(counts['non_embedding'])})"),
    ]
    if cfg.moe_experts:
        sparse = moe_layers(cfg)
        shared = f" + {cfg.moe_shared_experts} shared" if cfg.moe_shared_experts else ""
        rows += [
            (
                "experts",
                f"{len(sparse)} of {cfg.n_layers} layers MoE: {cfg.moe_experts} experts{shared} of d_ff "
                f"{expert_d_ff(cfg)}, top-{cfg.moe_top_k} ({cfg.moe_gate})",
            ),
            ("parameters (active per token)", f"{counts['active']:,} ({_human(counts['active'])})"),
            (
                "parameters (active non-embedding)",
                f"{counts['active_non_embedding']:,} ({_human(counts['active_non_embedding'])})",
            ),
        ]
    active = " active" if cfg.moe_experts else ""
    return [
        *rows,
        (
            f"training FLOPs per token (6N{active} + 12 L d s, s = {seq})",
            f"{flops:.4g} ({_human(flops, 'FLOP')})",
        ),
        ("KV-cache bytes per token (bf16)", f"{kv_bytes:,} ({_bytes(kv_bytes)})"),
        (f"KV cache at {seq} tokens (bf16, batch 1)", _bytes(kv_bytes * seq)),
        ("weights (bf16)", _bytes(2 * counts["total"])),
        ("weights (fp32)", _bytes(4 * counts["total"])),
        ("weights + grads + AdamW states (fp32 master)", _bytes(16 * counts["total"])),
    ]


def describe_preset(
    name: str, seq_len: int | None = None, vocab_size: int = DEFAULT_VOCAB
) -> list[tuple[str, str]]:
    """Rows for `smelt plan model PRESET`: its shape and sizes, then the training values that follow its
    size where a config leaves them unset (config/size_rules.py), each with where it came from."""
    from smelt.config import config_from_dict

    sized = config_from_dict({"model": {"preset": name}}).sized
    return [("preset", name), *describe_config(preset_config(name), vocab_size, seq_len),
            *((f"{s.key} unless set", s.describe()) for s in sized)]  # fmt: skip


def preset_budget_rows(
    name: str, flops: float, vocab_size: int = DEFAULT_VOCAB, seq_len: int | None = None
) -> list[tuple[str, str]]:
    """`smelt plan budget --preset NAME`: what the compute buys for that fixed shape. For an MoE the
    compute is spent on the active parameters, so D = C / FLOPs per token counts active ones only."""
    cfg = preset_config(name)
    seq = seq_len or cfg.max_seq_len
    counts = count_params(cfg, vocab_size)
    per_token = flops_per_token(cfg, vocab_size, seq)
    tokens = flops / per_token
    rows = [
        ("model preset", f"{name} (vocabulary {vocab_size:,}, s = {seq})"),
        ("parameters (total)", f"{counts['total']:,} ({_human(counts['total'])})"),
    ]
    if cfg.moe_experts:
        rows.append(("parameters (active per token)", f"{counts['active']:,} ({_human(counts['active'])})"))
    rows += [
        ("training FLOPs per token", f"{per_token:.4g} ({_human(per_token, 'FLOP')})"),
        ("tokens the budget trains", f"{tokens:.4g} ({_human(tokens)})"),
        ("tokens per parameter (total)", f"{tokens / counts['total']:.1f}"),
    ]
    if cfg.moe_experts:
        rows.append(("tokens per active parameter", f"{tokens / counts['active']:.1f}"))
    return rows
