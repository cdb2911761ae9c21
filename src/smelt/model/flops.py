"""Parameter and FLOP counts, computed from the config alone (no module is built)."""

from __future__ import annotations

from smelt.config import ModelConfig


def resolved_d_ff(cfg: ModelConfig) -> int:
    """SwiGLU hidden size: cfg.d_ff, else 8/3 d rounded up to 64 (d < 1024) or 256 (tensor-core friendly)."""
    if cfg.d_ff:
        return cfg.d_ff
    multiple = 64 if cfg.d_model < 1024 else 256
    return -(-8 * cfg.d_model // (3 * multiple)) * multiple


def count_params(cfg: ModelConfig, vocab_size: int) -> dict[str, int]:
    """{"total", "non_embedding", "embedding"}.

    "embedding" is the token embedding matrix (V x d). An untied LM head is a matmul and counts as
    non-embedding; a tied head shares the embedding matrix and is counted once.
    """
    d = cfg.d_model
    head_dim = d // cfg.n_heads
    kv_dim = (cfg.n_kv_heads or cfg.n_heads) * head_dim
    attn = d * d + 2 * d * kv_dim + d * d  # wq, wk, wv, wo
    qk_norm = 2 * head_dim if cfg.qk_norm else 0
    mlp = 3 * d * resolved_d_ff(cfg)
    per_layer = attn + mlp + 2 * d + qk_norm  # + two RMSNorm weights
    embedding = vocab_size * d
    non_embedding = cfg.n_layers * per_layer + d  # + final norm
    if not cfg.tie_embeddings:
        non_embedding += vocab_size * d
    return {"total": embedding + non_embedding, "non_embedding": non_embedding, "embedding": embedding}


def flops_per_token(cfg: ModelConfig, vocab_size: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 N (N = non-embedding parameters) + 12 L d s for attention."""
    n = count_params(cfg, vocab_size)["non_embedding"]
    return float(6 * n + 12 * cfg.n_layers * cfg.d_model * seq_len)
