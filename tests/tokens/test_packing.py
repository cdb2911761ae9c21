"""Packing details: document structure of a batch and fill-in-the-middle."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smelt.config import TokensConfig
from smelt.errors import UserError
from smelt.tokens.loader import TokenLoader
from smelt.tokens.packing import apply_fim, document_structure, fim_segment

FIM = (2000, 2001, 2002)  # prefix, middle, suffix: outside the fixtures' 10..999 content tokens


def test_document_structure():
    ends = np.zeros((2, 6), dtype=bool)
    ends[0, 2] = True  # row 0: a document ends (its EOS) at position 2 -> a new segment opens there
    ends[1, [0, 4]] = True
    doc_ids, position_ids, cu_seqlens = document_structure(ends)
    assert doc_ids.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 2, 2]]
    assert position_ids.tolist() == [[0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 0, 1]]
    assert cu_seqlens.tolist() == [0, 2, 6, 10, 12]


@pytest.mark.parametrize("spm", [False, True])
def test_fim_segment_keeps_length_and_tokens(spm):
    content = np.arange(100, 140, dtype=np.int64)
    out = fim_segment(content, np.random.default_rng(0), spm, FIM)
    assert len(out) == len(content) and out[0] == FIM[0]
    assert sorted(out[~np.isin(out, FIM)].tolist()) == list(range(100, 137))  # the last 3 made room
    pre, mid, suf = (int(np.flatnonzero(out == t)[0]) for t in FIM)
    if spm:  # <pre> <suf> suffix <mid> prefix middle
        assert suf == 1 and mid > suf
        assert out[2:mid].tolist() == sorted(out[2:mid].tolist())
    else:  # <pre> prefix <suf> suffix <mid> middle
        assert pre < suf < mid
        prefix, suffix, middle = out[1:suf], out[suf + 1 : mid], out[mid + 1 :]
        assert np.concatenate([prefix, middle, suffix]).tolist() == list(range(100, 137))


def test_apply_fim_keeps_document_boundaries():
    window = np.concatenate([np.arange(10, 30), [1], np.arange(40, 45), [1], np.arange(50, 80)]).astype(
        np.int64
    )
    ends = np.flatnonzero(window == 1)
    untouched = window.copy()
    assert not apply_fim(window, ends, np.random.default_rng(0), 0.0, 0.5, FIM)
    assert np.array_equal(window, untouched)
    assert apply_fim(window, ends, np.random.default_rng(0), 1.0, 0.5, FIM)
    assert np.array_equal(np.flatnonzero(window == 1), ends)  # EOS positions stay
    assert window[0] == FIM[0] and window[ends[1] + 1] == FIM[0]  # both long segments rewritten
    assert np.array_equal(window[ends[0] + 1 : ends[1]], np.arange(40, 45))  # 5 tokens: too short


def fim_loader(mixed, rate, **kw):
    cfg = TokensConfig(mixture={"web": 0.5, "code": 0.5}, fim_rate=rate, fim_spm_rate=0.5, prefetch=0)
    options = {"seq_len": 64, "batch_size": 8, "steps": 10, "seed": 1, "verify": "none", "fim_ids": FIM}
    return TokenLoader(mixed, cfg, **{**options, "fim_sources": ["code"], **kw})


def test_fim_on_code_sources_only(mixed):
    plain, fim = fim_loader(mixed, 0.0).global_batch(4), fim_loader(mixed, 1.0).global_batch(4)
    assert fim_loader(mixed, 1.0).global_batch(4).inputs.equal(fim.inputs)  # seeded
    assert plain.sources == fim.sources and torch.equal(plain.doc_ids, fim.doc_ids)
    for row, source in enumerate(fim.sources):
        has_sentinel = bool(np.isin(fim.inputs[row].numpy(), FIM).any())
        assert has_sentinel == (source == "code") == bool(fim.fim[row])
        if source == "web":
            assert torch.equal(fim.inputs[row], plain.inputs[row])
    assert torch.equal(fim.inputs[:, 1:], fim.targets[:, :-1])
    half = fim_loader(mixed, 0.5)
    rewritten = [bool(half.global_batch(step).fim[i]) for step in range(1, 11) for i in range(8)]
    assert (
        0
        < sum(rewritten)
        < sum(s == "code" for step in range(1, 11) for s in half.global_batch(step).sources)
    )


def test_fim_errors_name_the_keys(mixed):
    with pytest.raises(
        UserError, match=r"tokens.fim_rate = 0.5 needs the tokenizer's FIM tokens.*tokenizer.fim_tokens"
    ):
        fim_loader(mixed, 0.5, fim_ids=None)
    with pytest.raises(UserError, match=r"tokens.fim_sources names 'python'.*code, math, web"):
        fim_loader(mixed, 0.5, fim_sources=["python"])
    with pytest.raises(UserError, match="no source gets FIM.*code = true"):
        fim_loader(mixed, 0.5, fim_sources=[])
