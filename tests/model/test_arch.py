"""Partial RoPE, NoPE layers, z-loss, intra-document masking, init and step-0 loss."""

import math

import pytest
import torch

from helpers import build_model, tiny_model_config
from smelt.config import ModelConfig
from smelt.model.transformer import (
    Transformer,
    apply_rope,
    doc_ids_from_tokens,
    lm_loss,
    position_ids_from_doc_ids,
    resolved_head_init_std,
    rope_table,
    rotary_dim,
    uses_rope,
)

VOCAB = 384


def build(cfg: ModelConfig, vocab: int = VOCAB, seed: int = 0) -> Transformer:
    return build_model(cfg, vocab, seed).eval()


def test_partial_rope_rotates_only_the_first_dims():
    cfg = tiny_model_config(rope_fraction=0.5)
    assert rotary_dim(cfg) == 8  # head dim 16
    table = rope_table(8, 16, 10_000.0)
    x = torch.randn(1, 2, 16, 16)
    y = apply_rope(x, table)
    assert torch.equal(y[..., 8:], x[..., 8:])
    torch.testing.assert_close(y[..., :8], apply_rope(x[..., :8], table))
    assert not torch.allclose(y[:, :, 1:, :8], x[:, :, 1:, :8])
    model = build(cfg)
    assert model.rope.shape == (64, 4, 2)
    logits, _ = model(torch.randint(0, VOCAB, (2, 10)))
    assert torch.isfinite(logits).all()


def test_nope_every_kth_layer():
    cfg = tiny_model_config(n_layers=4, nope_every=2)
    assert [uses_rope(cfg, i) for i in range(4)] == [True, False, True, False]
    assert [uses_rope(tiny_model_config(rope_fraction=0.0), i) for i in range(2)] == [False, False]
    # One attention layer without RoPE is blind to key order: the last position's logits do not
    # depend on the order of the earlier tokens (with RoPE they do).
    model = build(tiny_model_config(rope_fraction=0.0, n_layers=1))
    x = torch.randint(0, VOCAB, (1, 12))
    perm = torch.cat((torch.randperm(11), torch.tensor([11])))
    a, _ = model(x)
    b, _ = model(x[:, perm])
    torch.testing.assert_close(a[0, -1], b[0, -1], atol=1e-5, rtol=1e-5)
    with_rope, _ = build(tiny_model_config(n_layers=1))(x)
    with_rope_perm, _ = build(tiny_model_config(n_layers=1))(x[:, perm])
    assert not torch.allclose(with_rope[0, -1], with_rope_perm[0, -1], atol=1e-4)


def test_z_loss_added_to_training_loss_but_ce_is_reported():
    x = torch.randint(0, VOCAB, (2, 16))
    y = torch.randint(0, VOCAB, (2, 16))
    y[0, :4] = -100
    plain = build(tiny_model_config())
    zl = build(tiny_model_config(z_loss=1e-4))
    logits, ce = plain(x, y)
    _, parts = zl(x, y, loss_parts=True)
    _, total = zl(x, y)
    lse = torch.logsumexp(logits.float(), -1)
    keep = y != -100
    expected_z = 1e-4 * (lse[keep] ** 2).mean()
    torch.testing.assert_close(parts["ce"], ce)
    torch.testing.assert_close(parts["z_loss"], expected_z)
    torch.testing.assert_close(total, ce + expected_z)
    assert parts["z_loss"].item() > 0
    # Per-token losses stay the pure cross-entropy scale plus z, 0 where ignored.
    per = lm_loss(logits, y, 1e-4, reduction="none")
    assert per["loss"].shape == (2, 16) and torch.all(per["loss"][0, :4] == 0)
    # The z term pulls log Z toward 0: its gradient is nonzero.
    total.backward()
    assert zl.tok_emb.weight.grad is not None


def test_doc_and_position_ids_from_tokens():
    eos = 1
    idx = torch.tensor([[5, 6, 1, 7, 8, 9, 1, 4]])
    doc = doc_ids_from_tokens(idx, eos)
    assert doc.tolist() == [[0, 0, 1, 1, 1, 1, 2, 2]]
    assert position_ids_from_doc_ids(doc).tolist() == [[0, 1, 0, 1, 2, 3, 0, 1]]


@pytest.mark.parametrize("qk_norm", [False, True])
def test_no_attention_across_document_boundaries(qk_norm):
    model = build(tiny_model_config(qk_norm=qk_norm, n_layers=3))
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(2, VOCAB, (2, 24), generator=gen)
    doc = torch.zeros(2, 24, dtype=torch.long)
    doc[:, 10:] = 1
    doc[1, 18:] = 2
    pos = position_ids_from_doc_ids(doc)
    a, _ = model(x, doc_ids=doc, position_ids=pos)
    x2 = x.clone()
    x2[:, :10] = torch.randint(2, VOCAB, (2, 10), generator=gen)  # rewrite the first document
    b, _ = model(x2, doc_ids=doc, position_ids=pos)
    assert torch.equal(a[:, 10:], b[:, 10:])
    assert not torch.allclose(a[:, :10], b[:, :10])
    # With restarted positions, a later document scores exactly like the same text on its own.
    alone, _ = model(x[:1, 10:])
    torch.testing.assert_close(a[0, 10:], alone[0], atol=1e-5, rtol=1e-5)
    alone3, _ = model(x[1:, 18:])
    torch.testing.assert_close(a[1, 18:], alone3[0], atol=1e-5, rtol=1e-5)
    # Without doc ids the later document does see the earlier one.
    c, _ = model(x)
    d, _ = model(x2)
    assert not torch.allclose(c[:, 10:], d[:, 10:])


def test_position_ids_default_equals_arange():
    model = build(tiny_model_config())
    x = torch.randint(0, VOCAB, (2, 16))
    a, _ = model(x)
    b, _ = model(x, position_ids=torch.arange(16).expand(2, 16), doc_ids=torch.zeros(2, 16, dtype=torch.long))
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("d_model", [64, 256, 768])
@pytest.mark.parametrize("tie", [True, False])
@pytest.mark.slow
def test_step0_loss_is_ln_v_at_every_width(d_model, tie):
    vocab = 1024
    cfg = ModelConfig(d_model=d_model, n_layers=2, n_heads=d_model // 64, max_seq_len=32, tie_embeddings=tie)
    model = build(cfg, vocab=vocab)
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (4, 32), generator=gen)
    y = torch.randint(0, vocab, (4, 32), generator=gen)
    with torch.no_grad():
        _, loss = model(x, y)
    assert abs(loss.item() - math.log(vocab)) < 0.1
    # ...and on the input tokens themselves: an untied head does not start out predicting repeats. A
    # tied one scores its input token at about std * d (5 at d = 256), the price of keeping the input
    # embedding large enough for small models to train quickly (see resolved_head_init_std).
    with torch.no_grad():
        _, repeat = model(x, x)
    self_score = 0.0 if not tie else resolved_head_init_std(cfg) * d_model
    assert abs(repeat.item() - math.log(vocab)) < 1.0 + self_score


def test_init_is_truncated_at_three_sigma():
    model = build(tiny_model_config(d_model=128, n_layers=8))
    w = model.blocks[0].mlp.up.weight
    assert w.abs().max().item() <= 3 * 0.02 + 1e-6
    down = model.blocks[0].mlp.down.weight
    assert down.abs().max().item() <= 3 * 0.02 / 4 + 1e-6


def test_config_rejects_out_of_range_fields():
    from smelt.config import config_from_dict
    from smelt.errors import ConfigError

    with pytest.raises(ConfigError, match="rope_fraction"):
        config_from_dict({"model": {"rope_fraction": 1.5}})
    with pytest.raises(ConfigError, match="z_loss"):
        config_from_dict({"model": {"z_loss": -1.0}})
