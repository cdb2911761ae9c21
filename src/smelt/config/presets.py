"""Named model shapes. Any key of `[model]` overrides the preset it starts from."""

from __future__ import annotations

# Head dims of 64-128 for the real presets (tiny-1m, for tests, has 32); d_ff = 0 means 8/3 d rounded
# up to a multiple of 64 below d = 1024, else of 256. Parameter totals at the vocabulary of the model
# the shape follows (`smelt plan model PRESET --vocab N` for others): llama-124m is GPT-2 small
# (124M at V = 50,304, tied); llama-350m 335M at V = 50,304; llama-1b 0.98B and llama-3b 3.2B
# (Llama 3.2 3B) at V = 128,256, tied; llama-7b is Llama 2 7B (6.74B at V = 32,000, MHA, untied);
# llama-8b is Llama 3 8B (8.03B at V = 128,256). Mixtures of experts (docs/moe.md): tiny-moe is tiny-1m
# with 8 experts of d_ff 192, top-2, so the same active FLOPs per token as tiny-1m (d_ff 384) with
# about 4x its MLP weights; olmoe-1b-7b is OLMoE-1B-7B (6.92B total, 1.28B active at V = 50,304;
# OLMoE normalises q and k over all heads, smelt per head: 61,440 norm weights fewer); qwen3-30b-a3b is
# Qwen3-30B-A3B (30.5B total, 3.3B active at V = 151,936). The tests check these figures.
MODEL_PRESETS: dict[str, dict[str, object]] = {
    "tiny-1m": {"d_model": 128, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 512},
    "small-5m": {"d_model": 256, "n_layers": 6, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 1024},
    "llama-124m": {"d_model": 768, "n_layers": 12, "n_heads": 12, "n_kv_heads": 12, "max_seq_len": 2048},
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
        "n_kv_heads": 32,
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
    "tiny-moe": {
        "d_model": 128,
        "n_layers": 4,
        "n_heads": 4,
        "n_kv_heads": 2,
        "max_seq_len": 512,
        "moe_experts": 8,
        "moe_top_k": 2,
        "moe_d_ff": 192,
    },
    "olmoe-1b-7b": {
        "d_model": 2048,
        "n_layers": 16,
        "n_heads": 16,
        "n_kv_heads": 16,
        "max_seq_len": 4096,
        "qk_norm": True,
        "tie_embeddings": False,
        "moe_experts": 64,
        "moe_top_k": 8,
        "moe_d_ff": 1024,
        "moe_norm_topk": False,
        "moe_aux_loss": 0.01,
        "moe_z_loss": 0.001,
    },
    "qwen3-30b-a3b": {
        "d_model": 2048,
        "n_layers": 48,
        "n_heads": 32,
        "n_kv_heads": 4,
        "head_dim": 128,
        "d_ff": 6144,
        "max_seq_len": 40960,
        "qk_norm": True,
        "tie_embeddings": False,
        "rope_theta": 1_000_000.0,
        "norm_eps": 1e-6,
        "moe_experts": 128,
        "moe_top_k": 8,
        "moe_d_ff": 768,
        "moe_norm_topk": True,
        "moe_aux_loss": 0.001,
    },
}
