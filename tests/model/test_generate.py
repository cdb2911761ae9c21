"""Batched KV-cache decoding: logits equal to a full recompute, sampling filters, EOS."""

import pytest
import torch

from smelt.config import ModelConfig
from smelt.model.generate import KVCache, generate, sample_next
from smelt.model.transformer import Transformer

VOCAB = 384


def build(**overrides) -> Transformer:
    base = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=48)
    base.update(overrides)
    torch.manual_seed(0)
    return Transformer(ModelConfig(**base), VOCAB).eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"qk_norm": True, "nope_every": 2, "rope_fraction": 0.5},
        {"value_embeddings": True, "mlp": "relu2"},
    ],
)
def test_cached_logits_equal_full_forward(overrides):
    model = build(**overrides)
    x = torch.randint(0, VOCAB, (3, 20))
    full, _ = model(x)
    cache = KVCache(model, 3, 48, torch.float32, "cpu")
    with torch.no_grad():
        parts = [model(x[:, :8], cache=cache)[0]]  # prefill
        parts.append(model(x[:, 8:12], cache=cache)[0])  # a chunk against the cache
        for t in range(12, 20):  # then one token at a time
            parts.append(model(x[:, t : t + 1], cache=cache)[0])
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=1e-5)


def test_batched_generation_equals_one_at_a_time():
    model = build()
    prompts = [[5, 6, 7, 8, 9], [11], [20, 21, 22]]
    batched = generate(model, prompts, 12, temperature=0.0)
    alone = [generate(model, p, 12, temperature=0.0) for p in prompts]
    assert batched == alone
    nocache = generate(model, prompts, 12, temperature=0.0, use_cache=False)
    assert nocache == alone


def test_batched_generation_past_max_seq_len():
    model = build(max_seq_len=16)
    prompts = [list(range(3, 13)), [4, 5]]
    cached = generate(model, prompts, 12, temperature=0.0)
    plain = generate(model, prompts, 12, temperature=0.0, use_cache=False)
    assert cached == plain and [len(s) for s in cached] == [22, 14]


def test_batched_eos_stops_each_row():
    model = build()
    prompts = [[3], [9, 10]]
    free = generate(model, prompts, 10, temperature=0.0)
    eos = free[0][3]  # the third token row 0 generates
    out = generate(model, prompts, 10, temperature=0.0, eos_id=eos)
    for prompt, row, full in zip(prompts, out, free, strict=True):
        new = full[len(prompt) :]
        expected = prompt + (new[: new.index(eos) + 1] if eos in new else new)
        assert row == expected
    assert len(out[0]) < len(free[0])


def test_top_k_and_top_p_filters():
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[4.0, 3.0, 2.0, -1.0, -2.0]]).repeat(200, 1)
    top1 = sample_next(logits, 1.0, 1, 1.0, gen)
    assert torch.all(top1 == 0)
    top2 = sample_next(logits, 1.0, 2, 1.0, gen)
    assert set(top2.tolist()) == {0, 1}
    # p(0) = 0.66, p(1) = 0.24: top_p 0.8 keeps exactly those two, top_p 0.5 only the first.
    assert set(sample_next(logits, 1.0, 0, 0.8, gen).tolist()) == {0, 1}
    assert set(sample_next(logits, 1.0, 0, 0.5, gen).tolist()) == {0}
    greedy = sample_next(logits, 0.0, 0, 1.0, gen)
    assert torch.all(greedy == 0)


def test_top_p_generation_is_seeded():
    model = build()
    a = generate(model, [[1, 2], [3]], 10, temperature=0.9, top_p=0.9, seed=3)
    b = generate(model, [[1, 2], [3]], 10, temperature=0.9, top_p=0.9, seed=3)
    assert a == b and all(0 <= t < VOCAB for row in a for t in row)


def test_empty_prompt_rejected():
    with pytest.raises(ValueError, match="prompt token"):
        generate(build(), [[1], []], 3)
