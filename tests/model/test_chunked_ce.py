"""The chunked LM head + cross-entropy matches the whole-batch loss and its gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from helpers import build_model, tiny_model_config
from smelt.model.chunked_loss import chunked_lm_loss
from smelt.model.transformer import IGNORE_INDEX, lm_loss

VOCAB = 384


def _inputs(rows: int = 2, cols: int = 24, d: int = 32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, cols, d, generator=gen, dtype=torch.float64).float().requires_grad_()
    weight = (0.2 * torch.randn(VOCAB, d, generator=gen)).requires_grad_()
    targets = torch.randint(0, VOCAB, (rows, cols), generator=gen)
    targets[0, :5] = IGNORE_INDEX
    targets[1, -3:] = IGNORE_INDEX
    return hidden, weight, targets


@pytest.mark.parametrize("z_loss", [0.0, 1e-4])
@pytest.mark.parametrize("chunk_rows", [1, 7, 48, 1000])
def test_chunked_loss_and_gradients_match_the_whole_batch(z_loss, chunk_rows):
    hidden, weight, targets = _inputs()
    whole = lm_loss(F.linear(hidden, weight), targets, z_loss)
    grads = torch.autograd.grad(whole["loss"], (hidden, weight))
    chunked = chunked_lm_loss(hidden, weight, targets, z_loss, chunk_rows)
    chunked_grads = torch.autograd.grad(chunked["loss"] * 1.0, (hidden, weight))
    for key in ("loss", "ce", "z_loss"):
        assert chunked[key].item() == pytest.approx(whole[key].item(), abs=1e-6)
    for got, want in zip(chunked_grads, grads, strict=True):
        assert (got - want).abs().max().item() < 1e-6
    assert not chunked["ce"].requires_grad and not chunked["z_loss"].requires_grad


def test_the_incoming_gradient_scales_the_chunked_gradients():
    hidden, weight, targets = _inputs()
    whole = lm_loss(F.linear(hidden, weight), targets)["loss"] * 3.5
    chunked = chunked_lm_loss(hidden, weight, targets, chunk_rows=10)["loss"] * 3.5
    for got, want in zip(
        torch.autograd.grad(chunked, weight), torch.autograd.grad(whole, weight), strict=True
    ):
        assert (got - want).abs().max().item() < 1e-6


@pytest.mark.parametrize("tie", [True, False])
def test_a_model_with_chunked_loss_trains_as_the_whole_batch_one(tie):
    cfg = tiny_model_config(tie_embeddings=tie, z_loss=1e-4)
    whole, chunked = build_model(cfg), build_model(cfg)
    chunked.loss_chunk_rows = 20
    gen = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (2, 32), generator=gen)
    targets = torch.randint(0, VOCAB, (2, 32), generator=gen)
    logits, loss = whole(idx, targets)
    none, chunked_loss = chunked(idx, targets)
    assert none is None  # the whole batch's logits are never made
    assert chunked_loss.item() == pytest.approx(loss.item(), abs=1e-6)
    loss.backward()
    chunked_loss.backward()
    for (name, a), b in zip(whole.named_parameters(), chunked.parameters(), strict=True):
        assert (a.grad - b.grad).abs().max().item() < 1e-6, name


def test_without_autograd_or_per_token_losses_the_model_makes_whole_logits():
    model = build_model(tiny_model_config())
    model.loss_chunk_rows = 16
    idx = torch.randint(0, VOCAB, (2, 16))
    with torch.no_grad():  # evaluation: logits are wanted, and no gradient is taken in the forward
        logits, _ = model(idx, idx)
    assert logits.shape == (2, 16, VOCAB)
    logits, per_token = model(idx, idx, reduction="none")
    assert logits is not None and per_token.shape == (2, 16)


def test_chunk_rows_below_one_is_refused():
    hidden, weight, targets = _inputs()
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_lm_loss(hidden, weight, targets, chunk_rows=0)


def test_under_bf16_autocast_the_head_runs_in_bf16_and_the_loss_in_fp32():
    hidden, weight, targets = _inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        whole = lm_loss(F.linear(hidden, weight), targets)["loss"]
        chunked = chunked_lm_loss(hidden, weight, targets, chunk_rows=16)["loss"]
    assert whole.dtype == chunked.dtype == torch.float32
    # The same bf16 logits summed in fp32 in another order: equal to fp32 rounding, not to bf16's.
    assert chunked.item() == pytest.approx(whole.item(), abs=1e-5)
    for got, want in zip(
        torch.autograd.grad(chunked, (hidden, weight)),
        torch.autograd.grad(whole, (hidden, weight)),
        strict=True,
    ):
        assert got.dtype == want.dtype == torch.float32
        assert (got - want).abs().max().item() <= 1e-2 * want.abs().max().item()
