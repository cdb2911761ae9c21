"""Context extension on a tiny model: trained at 64 tokens, continued at 256 with RoPE scaling, it
finds a pass key at 256 tokens where the same model unextended does not; and the held-out loss by
position gets an edge at each trained length."""

from __future__ import annotations

import dataclasses
import random
import re

import numpy as np
import pytest
import torch

from smelt.config import ModelConfig, TrainConfig
from smelt.eval import passkey as pk
from smelt.eval.heldout import position_bucket_names, position_edges, stream_nll, trained_lengths
from smelt.model.rope import extend_context
from smelt.model.transformer import Transformer
from smelt.train.optim import build_optimizer

TRAINED = 64
EXTENDED = 4 * TRAINED
CPU = torch.device("cpu")


class WordTokenizer:
    """One token per word, digit or punctuation mark of the passkey prompts; EOS is 0."""

    eos_id = 0

    def __init__(self) -> None:
        words: set[str] = set()
        for text in (pk.INTRO, *pk.FILLER, pk.NEEDLE, pk.QUESTION):
            words.update(self.split(text.replace("{key}", "")))
        self.vocab = ["<eos>", *"0123456789", *sorted(words)]
        self.ids = {w: i for i, w in enumerate(self.vocab)}

    @staticmethod
    def split(text: str) -> list[str]:
        return re.findall(r"\d|[A-Za-z]+|[^\sA-Za-z\d]", text)

    def encode(self, text: str) -> list[int]:
        return [self.ids[w] for w in self.split(text)]


def passkey_batches(
    tok: WordTokenizer, rows: int, length: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A passkey-rich corpus: every row is one prompt (key at a random depth) and its answer, EOS-padded
    to `length` + 1 tokens. Targets are the answer's tokens only, so every step trains retrieval."""
    rng = random.Random(seed)
    pieces = pk._Pieces(tok)
    inputs = torch.zeros((rows, length), dtype=torch.long)
    targets = torch.full((rows, length), -100, dtype=torch.long)
    for row in range(rows):
        key = str(rng.randrange(10_000, 100_000))
        answer = pieces(pk.ANSWER.format(key=key))
        context = pk.build_prompt(
            pieces, key, rng.random(), length, rng.getrandbits(32), [tok.eos_id], len(answer)
        )
        seq = torch.tensor(context + answer)
        inputs[row, : len(seq) - 1] = seq[:-1]
        targets[row, len(context) - 1 : len(seq) - 1] = seq[len(context) :]
    return inputs, targets


def train(model: Transformer, tok: WordTokenizer, length: int, steps: int, batch: int, seed: int) -> None:
    optimizer = build_optimizer(model, TrainConfig(lr=5e-3, weight_decay=0.0), CPU)
    inputs, targets = passkey_batches(tok, steps * batch, length, seed)
    model.train()
    for step in range(steps):
        rows = slice(step * batch, (step + 1) * batch)
        _, loss = model(inputs[rows], targets[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


@pytest.fixture
def one_thread():
    """A model this small trains fastest on one thread (more only add synchronisation)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_context_extension_beats_the_unextended_model_at_4x_its_training_length(one_thread):
    tok = WordTokenizer()
    # rope_theta 300 puts the slowest RoPE wavelength of a 16-dim head at about 13 x 64 tokens, as
    # theta 10,000 does for a 128-dim head trained at 4,096: at 4x its length the slow pairs turn
    # further than training ever showed, which is what a context extension has to repair. (With
    # theta 10,000 at 64 tokens the slow pairs barely turn even at 256, and nothing needs extending.)
    base = ModelConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=TRAINED, rope_theta=300.0)
    torch.manual_seed(0)
    model = Transformer(base, len(tok.vocab))
    train(model, tok, TRAINED, steps=500, batch=16, seed=1)
    at_trained = pk.evaluate_passkey(model, tok, (TRAINED,), per_cell=4)
    assert at_trained["acc"] >= 0.7  # it learned to retrieve the key within its training length

    unextended = Transformer(base, len(tok.vocab))
    unextended.load_state_dict(model.state_dict())
    extend_context(unextended, EXTENDED)  # the same model, its RoPE table merely longer
    before = pk.evaluate_passkey(unextended, tok, (EXTENDED,), per_cell=4)

    scaled = dataclasses.replace(base, max_seq_len=EXTENDED, rope_scaling="linear", rope_factor=4.0)
    extended = Transformer(scaled, len(tok.vocab))
    extended.load_state_dict(model.state_dict())
    train(extended, tok, EXTENDED, steps=120, batch=8, seed=2)
    after = pk.evaluate_passkey(extended, tok, (EXTENDED,), per_cell=4)

    # Beyond its training length the unextended model only finds a key placed near the question.
    assert before["by_depth"]["1.0"]["acc"] >= 0.75
    assert after["acc"] >= before["acc"] + 0.3, (before["by_depth"], after["by_depth"])


def test_position_edges_mark_each_trained_length():
    assert position_edges(1024, (256,)) == (0, 8, 32, 128, 256, 512, 2048, 8192)
    assert position_edges(256, (256,)) == (0, 8, 32, 128, 512, 2048, 8192)  # not past it: no edge
    assert position_edges(100_000)[-1] == 32768  # continued past 8192 for a long evaluation
    assert position_bucket_names(position_edges(1024, (256,)))[3:5] == ["128-255", "256-511"]
    yarn = ModelConfig(max_seq_len=1024, rope_scaling="yarn", rope_factor=4.0, rope_original_max_seq_len=256)
    assert trained_lengths(yarn, {"config": {"train": {"seq_len": 1024}}}) == (256, 1024)
    linear = ModelConfig(max_seq_len=1024, rope_scaling="linear", rope_factor=4.0)
    assert trained_lengths(linear, {"config": {"train": {"seq_len": 1024}}}) == (256, 1024)
    assert trained_lengths(ModelConfig(), {"config": {"train": {"seq_len": 256}}}) == (256,)
    assert trained_lengths(ModelConfig(), {}) == ()


def test_loss_by_position_counts_the_tokens_beyond_the_trained_length():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(d_model=32, n_layers=1, n_heads=2, max_seq_len=64), 50)
    edges = position_edges(64, (48,))
    by_position = np.zeros((len(edges), 2))
    stream = np.arange(129) % 50  # two windows of 64 targets
    stream_nll(model, stream, 64, 2, CPU, by_position=by_position, edges=edges)
    counts = dict(zip(position_bucket_names(edges), by_position[:, 1].tolist(), strict=True))
    assert counts["32-47"] == 2 * 16 and counts["48-127"] == 2 * 16
