"""torch.compile on CPU and per-block activation checkpointing."""

import shutil

import pytest
import torch

from smelt.config import ModelConfig
from smelt.model.transformer import Transformer, doc_ids_from_tokens, position_ids_from_doc_ids

VOCAB = 384


def build(**overrides) -> Transformer:
    base = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, z_loss=1e-4)
    base.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**base), VOCAB)


def grads(model: Transformer, x, y, **kwargs) -> dict[str, torch.Tensor]:
    model.zero_grad()
    _, loss = model(x, y, **kwargs)
    loss.backward()
    return {name.removeprefix("_orig_mod."): p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("with_docs", [False, True])
def test_activation_checkpointing_gives_the_same_gradients(with_docs):
    x = torch.randint(2, VOCAB, (2, 24))
    x[:, 9] = 1  # an EOS: two documents per row
    y = torch.roll(x, -1, dims=1)
    kwargs = {}
    if with_docs:
        doc = doc_ids_from_tokens(x, 1)
        kwargs = {"doc_ids": doc, "position_ids": position_ids_from_doc_ids(doc)}
    plain = grads(build(), x, y, **kwargs)
    ckpt_model = build(activation_checkpointing=True)
    ckpt = grads(ckpt_model, x, y, **kwargs)
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], atol=1e-6, rtol=1e-5, msg=name)
    # The flag really checkpoints: no block activations are kept between forward and backward.
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        ckpt_model(x, y, **kwargs)
    with_ckpt = sum(saved)
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        build()(x, y, **kwargs)
    assert with_ckpt < sum(saved)


@pytest.mark.slow  # ~45 s on 2 cores: inductor compiles the forward and the backward
@pytest.mark.skipif(
    shutil.which("cc") is None and shutil.which("gcc") is None, reason="inductor needs a C compiler"
)
@pytest.mark.slow
def test_torch_compile_matches_eager_on_cpu():
    torch._dynamo.reset()
    model = build(qk_norm=True, nope_every=2, rope_fraction=0.5)
    x = torch.randint(2, VOCAB, (2, 16))
    x[:, 5] = 1
    y = torch.roll(x, -1, dims=1)
    doc = doc_ids_from_tokens(x, 1)
    kwargs = {"doc_ids": doc, "position_ids": position_ids_from_doc_ids(doc)}
    eager_logits, eager_loss = model(x, y, **kwargs)
    eager = grads(model, x, y, **kwargs)
    compiled = torch.compile(model)
    logits, loss = compiled(x, y, **kwargs)
    torch.testing.assert_close(logits, eager_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(loss, eager_loss, atol=1e-5, rtol=1e-5)
    got = grads(compiled, x, y, **kwargs)
    for name in eager:
        torch.testing.assert_close(got[name], eager[name], atol=1e-4, rtol=1e-3, msg=name)
