"""Named model shapes. Any key of `[model]` overrides the preset it starts from."""

from __future__ import annotations

# Head dims of 64-128 for the real presets; d_ff = 0 means 8/3 d rounded (to 64 below d=1024, else 256).
MODEL_PRESETS: dict[str, dict[str, object]] = {
    "tiny-1m": {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 512},
    "small-5m": {"d_model": 256, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 1024},
    "llama-124m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": 4, "max_seq_len": 2048},
    "llama-350m": {"d_model": 1024, "n_layers": 24, "n_heads": 16, "n_kv_heads": 8, "max_seq_len": 2048},
    "llama-1b": {
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 32,
        "n_kv_heads": 8,
        "max_seq_len": 4096,
        "tie_embeddings": True,
        "rope_theta": 500_000.0,
    },
    "llama-3b": {
        "d_model": 3072,
        "n_layers": 28,
        "n_heads": 24,
        "n_kv_heads": 8,
        "max_seq_len": 4096,
        "tie_embeddings": True,
        "rope_theta": 500_000.0,
    },
    "llama-7b": {
        "d_model": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "max_seq_len": 4096,
        "tie_embeddings": False,
        "rope_theta": 500_000.0,
    },
    "llama-8b": {
        "d_model": 4096,
        "n_layers": 32,
        "n_heads": 32,
        "n_kv_heads": 8,
        "d_ff": 14336,
        "max_seq_len": 8192,
        "tie_embeddings": False,
        "rope_theta": 500_000.0,
    },
}
