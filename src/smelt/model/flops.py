"""Parameter and FLOP counts, computed from the config alone (no module is built)."""

from __future__ import annotations

from smelt.config import ModelConfig

# Model dims the value embeddings' gate reads (nanochat's): a few channels suffice to set one scalar per head.
VE_GATE_CHANNELS = 32


def resolved_d_ff(cfg: ModelConfig) -> int:
    """MLP hidden size: cfg.d_ff, else for SwiGLU 8/3 d rounded up to 64 (d < 1024) or 256 (tensor-core
    friendly), for ReLU² 4 d (its two matrices then hold about as many parameters as SwiGLU's three)."""
    if cfg.d_ff:
        return cfg.d_ff
    if cfg.mlp == "relu2":
        return 4 * cfg.d_model
    multiple = 64 if cfg.d_model < 1024 else 256
    return -(-8 * cfg.d_model // (3 * multiple)) * multiple


def head_dim_of(cfg: ModelConfig) -> int:
    """Dims per attention head: cfg.head_dim, else d_model / n_heads."""
    return cfg.head_dim or cfg.d_model // cfg.n_heads


def mlp_matrices(cfg: ModelConfig) -> int:
    """Matrices of one dense MLP: gate, up and down for SwiGLU; up and down for ReLU²."""
    return 2 if cfg.mlp == "relu2" else 3


def value_embedding_layers(cfg: ModelConfig) -> list[int]:
    """The layers with a value embedding (model.value_embeddings): every other one, ending with the
    last, as nanochat places them."""
    if not cfg.value_embeddings:
        return []
    return [i for i in range(cfg.n_layers) if i % 2 == (cfg.n_layers - 1) % 2]


def ve_gate_channels(cfg: ModelConfig) -> int:
    return min(VE_GATE_CHANNELS, cfg.d_model)


def count_params(cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """{"total", "non_embedding", "embedding", "value_embedding", "active", "active_non_embedding"}.

    "embedding" is the token embedding matrix (V x d). "value_embedding" the value embedding tables
    (V x n_kv_heads x head_dim each), looked up like the embedding and so not non-embedding; their
    gates are. An untied LM head is a matmul and counts as non-embedding; a tied head shares the
    embedding matrix and is counted once. "active" counts what one token uses: on MoE layers the
    router, its top-k routed experts and the shared experts, not the other experts (for a dense model
    active = total).
    """
    from smelt.config.moe import moe_layers

    d = cfg.d_model
    head_dim = head_dim_of(cfg)
    q_dim = cfg.n_heads * head_dim
    kv_dim = (cfg.n_kv_heads or cfg.n_heads) * head_dim
    attn = d * q_dim + 2 * d * kv_dim + q_dim * d  # wq, wk, wv, wo
    qk_norm = 2 * head_dim if cfg.qk_norm else 0
    shared = attn + 2 * d + qk_norm  # + two RMSNorm weights
    dense_mlp = mlp_matrices(cfg) * d * resolved_d_ff(cfg)
    ve_layers = len(value_embedding_layers(cfg))
    value_embedding = ve_layers * vocab_size * kv_dim
    shared_extra = ve_layers * ve_gate_channels(cfg) * (cfg.n_kv_heads or cfg.n_heads)  # the gates
    sparse = moe_layers(cfg)
    expert = 3 * d * (cfg.moe_d_ff or resolved_d_ff(cfg))
    moe_fixed = d * cfg.moe_experts + cfg.moe_shared_experts * expert  # router + shared experts
    layers = cfg.n_layers * shared + (cfg.n_layers - len(sparse)) * dense_mlp + shared_extra
    embedding = vocab_size * d
    head = 0 if cfg.tie_embeddings else vocab_size * d
    non_embedding = layers + len(sparse) * (moe_fixed + cfg.moe_experts * expert) + d + head  # + final norm
    active_non_embedding = layers + len(sparse) * (moe_fixed + cfg.moe_top_k * expert) + d + head
    return {
        "total": embedding + value_embedding + non_embedding,
        "non_embedding": non_embedding,
        "embedding": embedding,
        "value_embedding": value_embedding,
        "active": embedding + value_embedding + active_non_embedding,
        "active_non_embedding": active_non_embedding,
    }


def head_params(cfg: ModelConfig, vocab_size: int) -> int:
    """The LM head's V x d matrix: a matmul every token pays for, whether or not it shares the
    embedding's storage (a tied head is counted here even though count_params counts its storage once)."""
    return vocab_size * cfg.d_model


def flops_per_token(cfg: ModelConfig, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token in PaLM's convention (Chowdhery et al. 2022, appendix B), the one MFU
    is quoted in: 6 N + 12 L d s, N = the non-embedding parameters a token uses (for MoE the active
    experts only) plus the LM head, tied or not; d is the attention width n_heads x head_dim and
    12 L d s the attention scores and values over the full s x s matrix. The embedding lookup is a
    gather, not a matmul, so it costs no FLOPs; so are the value embeddings' (their gates are matmuls)."""
    counts = count_params(cfg, vocab_size)
    untied_head = 0 if cfg.tie_embeddings else head_params(cfg, vocab_size)  # already non-embedding
    n = counts["active_non_embedding"] - untied_head + head_params(cfg, vocab_size)
    return float(6 * n + 12 * cfg.n_layers * cfg.n_heads * head_dim_of(cfg) * seq_len)


def model_flops_per_token(cfg: ModelConfig, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token of the matmuls themselves (forward 2 per multiply-add, backward twice
    the forward): the attention projections, the MLP (the router and the active and shared experts
    on MoE layers), the value embeddings' gates and the LM head, but not the norm weights; and causal
    attention as it needs to be computed: a query at position i sees i + 1 keys, (s + 1) / 2 on
    average, so the scores and values cost 6 L d (s + 1) rather than PaLM's full-matrix 12 L d s."""
    from smelt.config.moe import moe_layers

    d = cfg.d_model
    head_dim = head_dim_of(cfg)
    q_dim = cfg.n_heads * head_dim
    kv_dim = (cfg.n_kv_heads or cfg.n_heads) * head_dim
    projections = d * q_dim + 2 * d * kv_dim + q_dim * d
    sparse = len(moe_layers(cfg))
    expert = 3 * d * (cfg.moe_d_ff or resolved_d_ff(cfg))
    moe_active = d * cfg.moe_experts + (cfg.moe_shared_experts + cfg.moe_top_k) * expert
    ve_gates = len(value_embedding_layers(cfg)) * ve_gate_channels(cfg) * (cfg.n_kv_heads or cfg.n_heads)
    matmul = (
        cfg.n_layers * projections
        + (cfg.n_layers - sparse) * mlp_matrices(cfg) * d * resolved_d_ff(cfg)
        + ve_gates
        + sparse * moe_active
        + head_params(cfg, vocab_size)
    )
    return float(6 * matmul + 6 * cfg.n_layers * q_dim * (seq_len + 1))


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None) -> float | None:
    """Model FLOPs utilization: the FLOP/s the tokens imply over the peak; None when the peak is unknown,
    or when the figure passes 100%, which no run can: the peak is then wrong (a CPU peak measured while
    other work ran; set $SMELT_PEAK_FLOPS), and no figure is truer than an impossible one."""
    if not peak_flops:
        return None
    value = flops_per_token * tokens_per_s / peak_flops
    return value if value <= 1.0 else None


def flops_conventions(cfg: ModelConfig, vocab_size: int, seq_len: int) -> tuple[float, float]:
    """(PaLM's 6N + 12 L d s with the head counted, the matmul model FLOPs): the two per-token figures
    the trainer reports MFU in (as mfu and mfu_model)."""
    return flops_per_token(cfg, vocab_size, seq_len), model_flops_per_token(cfg, vocab_size, seq_len)
