"""Training speed: the FLOPs conventions MFU is reported in, the AdamW kernel, compile caching and auto."""

from __future__ import annotations

import pytest

from helpers import tiny_model_config
from smelt.model.flops import count_params, flops_conventions, flops_per_token, mfu, model_flops_per_token
from smelt.summary import mfu_text

VOCAB = 384


def test_the_head_counts_in_palm_flops_whether_tied_or_not():
    """The tied head is a V x d matmul like the untied one; the embedding lookup is a gather (no FLOPs)."""
    tied, untied = tiny_model_config(tie_embeddings=True), tiny_model_config(tie_embeddings=False)
    assert flops_per_token(tied, VOCAB, 32) == flops_per_token(untied, VOCAB, 32)
    n = count_params(tied, VOCAB)["non_embedding"] + VOCAB * 64
    assert flops_per_token(tied, VOCAB, 32) == 6 * n + 12 * 2 * 64 * 32


def test_model_flops_count_the_matmuls_and_causal_attention_by_hand():
    cfg = tiny_model_config(d_ff=128)  # d 64, 2 layers, 4 heads x 16, 2 kv heads
    projections = 64 * 64 + 2 * 64 * 32 + 64 * 64
    mlp = 3 * 64 * 128
    forward = 2 * (2 * (projections + mlp) + VOCAB * 64) + 2 * 2 * (2 * 64 * (32 + 1) / 2)
    assert model_flops_per_token(cfg, VOCAB, 32) == pytest.approx(3 * forward, rel=1e-12)
    palm, model = flops_conventions(cfg, VOCAB, 32)
    # PaLM's counts the norm weights and the full s x s score matrix; the matmul figure neither.
    norms = 2 * (2 * 64) + 64
    assert palm - model == 6 * norms + 12 * 2 * 64 * 32 - 6 * 2 * 64 * 33


def test_moe_model_flops_count_the_router_and_the_active_experts_only():
    dense = tiny_model_config(d_ff=128)
    sparse = tiny_model_config(d_ff=128, moe_experts=4, moe_top_k=1)
    router = 2 * 64 * 4  # both layers
    assert model_flops_per_token(sparse, VOCAB, 32) - model_flops_per_token(dense, VOCAB, 32) == 6 * router


def test_mfu_and_its_terminal_line():
    assert mfu(1e6, 100.0, 1e9) == pytest.approx(0.1)
    assert mfu(1e6, 100.0, None) is None
    assert mfu_text({"train_mfu": 0.3125, "train_mfu_model": 0.28}) == (
        "31.2% (6N + attention), 28.0% (matmul model FLOPs)"
    )
    assert mfu_text({"train_mfu": None, "train_mfu_model": None}) == "-"
