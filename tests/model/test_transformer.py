import math

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.config import ModelConfig
from smelt.model.flops import count_params, flops_per_token, resolved_d_ff
from smelt.model.generate import generate
from smelt.model.transformer import Transformer

VOCAB = 384  # 256 byte tokens + specials, padded to a multiple of 128


def build(cfg: ModelConfig, vocab: int = VOCAB, seed: int = 0) -> Transformer:
    return build_model(cfg, vocab, seed)


def test_step0_loss_is_ln_vocab():
    model = build(tiny_model_config(d_model=128, n_layers=4))
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (8, 64), generator=gen)
    y = torch.randint(0, VOCAB, (8, 64), generator=gen)
    _, loss = model(x, y)
    assert abs(loss.item() - math.log(VOCAB)) < 0.1


def test_causal():
    model = build(tiny_model_config())
    x = torch.randint(0, VOCAB, (2, 32))
    x2 = x.clone()
    x2[:, 20] = (x2[:, 20] + 1) % VOCAB
    a, _ = model(x)
    b, _ = model(x2)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


@pytest.mark.parametrize("n_kv_heads", [0, 1, 2, 4])
def test_gqa_shapes(n_kv_heads):
    cfg = tiny_model_config(n_kv_heads=n_kv_heads, qk_norm=True)
    model = build(cfg)
    attn = model.blocks[0].attn
    kv = n_kv_heads or cfg.n_heads
    assert attn.wk.weight.shape == (kv * 16, 64)
    assert attn.wv.weight.shape == (kv * 16, 64)
    assert attn.wq.weight.shape == (64, 64)
    logits, loss = model(torch.randint(0, VOCAB, (3, 10)), torch.randint(0, VOCAB, (3, 10)))
    assert logits.shape == (3, 10, VOCAB) and loss.ndim == 0


@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_param_count_matches_module(tie, qk_norm):
    cfg = tiny_model_config(tie_embeddings=tie, qk_norm=qk_norm, d_ff=0)
    model = build(cfg)
    real = sum(p.numel() for p in model.parameters())  # shared parameters are counted once
    counts = count_params(cfg, VOCAB)
    assert counts["total"] == real
    assert counts["embedding"] == VOCAB * 64
    assert counts["non_embedding"] == real - VOCAB * 64
    head = VOCAB * 64 if tie else 0  # a tied head is a matmul too, counted once as the embedding's storage
    assert flops_per_token(cfg, VOCAB, 32) == 6 * (counts["non_embedding"] + head) + 12 * 2 * 64 * 32


def test_tied_and_untied():
    tied = build(tiny_model_config(tie_embeddings=True))
    assert tied.lm_head.weight is tied.tok_emb.weight
    untied = build(tiny_model_config(tie_embeddings=False))
    assert untied.lm_head.weight is not untied.tok_emb.weight
    # Default head std (see resolved_head_init_std): untied min(init_std, 1/d), tied min(init_std,
    # 0.32/sqrt(d)) = 0.02 at d = 64; an untied embedding keeps init_std.
    assert abs(untied.lm_head.weight.std().item() - 1 / 64) < 0.002
    assert abs(untied.tok_emb.weight.std().item() - 0.02) < 0.002
    assert abs(tied.tok_emb.weight.std().item() - 0.02) < 0.002
    custom = build(tiny_model_config(tie_embeddings=False, head_init_std=0.01))
    assert abs(custom.lm_head.weight.std().item() - 0.01) < 0.0015
    assert custom.lm_head.weight.abs().max().item() <= 0.03 + 1e-6  # truncated at 3 sigma


def test_resolved_d_ff():
    assert resolved_d_ff(ModelConfig(d_model=256)) == 704  # 682.7 -> 704 (multiple of 64)
    assert resolved_d_ff(ModelConfig(d_model=768)) == 2048
    assert resolved_d_ff(ModelConfig(d_model=2048)) == 5632  # multiple of 256
    assert resolved_d_ff(ModelConfig(d_model=4096, d_ff=14336)) == 14336


def test_residual_projection_init_scaled():
    model = build(tiny_model_config(d_model=128, n_layers=8))
    std = model.blocks[0].mlp.down.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(16)) < 0.001
    assert abs(model.blocks[0].mlp.up.weight.std().item() - 0.02) < 0.002


def test_per_token_loss_matches_mean():
    model = build(tiny_model_config())
    x = torch.randint(0, VOCAB, (2, 16))
    y = torch.randint(0, VOCAB, (2, 16))
    y[1, 8:] = -100
    _, mean = model(x, y)
    _, per = model(x, y, reduction="none")
    assert per.shape == (2, 16) and torch.all(per[1, 8:] == 0)
    torch.testing.assert_close(per.sum() / 24, mean)


@pytest.mark.slow
def test_overfits_tiny_batch():
    model = build(tiny_model_config())
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (4, 32))
    y = torch.roll(x, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    first = None
    for _ in range(50):
        _, loss = model(x, y)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3 * first


def test_bf16_autocast_forward_close_to_fp32():
    model = build(tiny_model_config())
    x = torch.randint(0, VOCAB, (2, 16))
    _, ref = model(x, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(x, x)
    assert logits.dtype == torch.bfloat16 and loss.dtype == torch.float32
    assert abs(loss.item() - ref.item()) < 0.05


def test_generate_deterministic_under_seed():
    model = build(tiny_model_config())
    a = generate(model, [1, 2, 3], 20, temperature=1.0, top_k=10, seed=7)
    b = generate(model, [1, 2, 3], 20, temperature=1.0, top_k=10, seed=7)
    c = generate(model, [1, 2, 3], 20, temperature=1.0, top_k=10, seed=8)
    assert a == b and len(a) == 23 and a[:3] == [1, 2, 3] and a != c
    assert all(0 <= t < VOCAB for t in a)


def test_generate_greedy_cache_matches_recompute():
    model = build(tiny_model_config(max_seq_len=24))
    prompt = list(range(5, 15))
    # 30 new tokens run past max_seq_len, exercising the cropped (no longer cached) path too.
    cached = generate(model, prompt, 30, temperature=0.0, use_cache=True)
    plain = generate(model, prompt, 30, temperature=0.0, use_cache=False)
    assert cached == plain and len(cached) == 40


def test_generate_stops_at_eos():
    model = build(tiny_model_config())
    greedy = generate(model, [3], 10, temperature=0.0)[1:]
    out = generate(model, [3], 10, temperature=0.0, eos_id=greedy[2])
    assert out == [3] + greedy[: greedy.index(greedy[2]) + 1]


def test_rope_depends_only_on_relative_position():
    from smelt.model.transformer import apply_rope, rope_table

    table = rope_table(16, 64, 10_000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def score(i: int, j: int) -> float:
        return float((apply_rope(q, table[i : i + 1]) * apply_rope(k, table[j : j + 1])).sum())

    assert score(5, 2) == pytest.approx(score(40, 37), abs=1e-4)
    assert score(0, 0) == pytest.approx(float((q * k).sum()), abs=1e-5)  # position 0 is the identity
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)


def test_rope_compiled_form_matches_eager(monkeypatch):
    from smelt.model.transformer import apply_rope, rope_table

    table = rope_table(16, 8, 10_000.0)
    x = torch.randn(2, 3, 8, 16)
    eager = apply_rope(x, table)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.testing.assert_close(apply_rope(x, table), eager)
