"""The training loader: exact resume, world-size independence, mixture, shuffling, boundaries, state."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from smelt.config import StageConfig, TokensConfig
from smelt.errors import ConfigError, UserError
from smelt.model.transformer import doc_ids_from_tokens, position_ids_from_doc_ids
from smelt.tokens.loader import TokenLoader, eval_windows

from .conftest import make_stream

CURRICULUM = TokensConfig(
    mixture={"web": 0.6, "code": 0.3, "math": 0.1},
    stages=[
        StageConfig(name="broad", fraction=0.5),
        StageConfig(name="anneal", fraction=0.5, mixture={"code": 0.5, "math": 0.5}),
    ],
    allow_repeat=True,  # math (about 190 windows) is repeated in the anneal stage
)


def loader(tokens_dir, cfg=CURRICULUM, prefetch=0, **kw):
    options = {"seq_len": 16, "batch_size": 8, "steps": 120, "seed": 11, "verify": "none", **kw}
    cfg = TokensConfig(**{**cfg.__dict__, "prefetch": prefetch})
    return TokenLoader(tokens_dir, cfg, **options)


def same_step(a, b) -> None:
    assert a.step == b.step and a.stage.name == b.stage.name and a.source_counts == b.source_counts
    assert len(a.micro) == len(b.micro)
    for x, y in zip(a.micro, b.micro, strict=True):
        for name in ("inputs", "targets", "doc_ids", "position_ids", "cu_seqlens"):
            assert torch.equal(getattr(x, name), getattr(y, name)), name
        assert x.sources == y.sources and np.array_equal(x.sequences, y.sequences)


def math_epoch_crossing(ld) -> int:
    """A step whose global batch holds math windows of two epochs."""
    for step in range(1, ld.plan.steps + 1):
        batch = ld.global_batch(step)
        epochs = {int(e) for e, s in zip(batch.epochs, batch.sources, strict=True) if s == "math"}
        if len(epochs) == 2:
            return step
    raise AssertionError("no step crosses an epoch of math")


@pytest.mark.slow
def test_resume_is_exact_mid_epoch_at_stages_and_across_epochs(mixed):
    reference = loader(mixed)
    crossing = math_epoch_crossing(reference)
    assert reference.stage_at(crossing).name == "anneal" and crossing + 6 <= 120
    # mid-epoch, the last step of a stage, the first of the next, just before an epoch boundary of math
    for taken in (7, 60, 61, crossing - 1, crossing):
        original = loader(mixed, prefetch=2)
        for _ in range(taken):
            original.next_step()
        state = json.loads(json.dumps(original.state_dict()))  # what a checkpoint stores
        assert state["step"] == taken and state["stage"] == reference.stage_at(max(taken, 1)).name
        restored = loader(mixed, prefetch=1)
        restored.load_state_dict(state)
        for _ in range(6):
            expected, got = original.next_step(), restored.next_step()
            same_step(expected, got)
            same_step(expected, reference.step_data(expected.step))  # a pure function of the step
        assert original.state_dict() == restored.state_dict()
        original.close()
        restored.close()


@pytest.mark.slow
def test_global_batch_is_the_same_for_any_world_size_and_micro_batch(mixed):
    for step in (1, 60, 61, 120):
        whole = loader(mixed).global_batch(step)
        for world, micro in ((1, 8), (1, 2), (2, 4), (2, 1), (4, 2), (4, 1)):
            parts = []
            for rank in range(world):
                data = loader(mixed, rank=rank, world_size=world, micro_batch=micro).step_data(step)
                assert len(data.micro) == 8 // world // micro
                parts += data.micro
            assert torch.equal(torch.cat([p.inputs for p in parts]), whole.inputs)
            assert torch.equal(torch.cat([p.doc_ids for p in parts]), whole.doc_ids)
            assert [s for p in parts for s in p.sources] == whole.sources


def test_ranks_are_disjoint_slices(mixed):
    world = 4
    rows = [loader(mixed, rank=r, world_size=world).step_data(5).micro[0] for r in range(world)]
    keys = [
        {(s, int(q), int(e)) for s, q, e in zip(b.sources, b.sequences, b.epochs, strict=True)} for b in rows
    ]
    assert sum(len(k) for k in keys) == 8 and len(set().union(*keys)) == 8


def test_realized_mixture_stays_within_a_point_of_every_window(mixed):
    cfg = TokensConfig(mixture={"web": 0.5, "code": 0.35, "math": 0.15}, allow_repeat=True)
    ld = loader(mixed, cfg=cfg, seq_len=8, batch_size=10, steps=600)
    sources = np.array([s for step in range(1, 601) for s in ld.schedule(step)[0].tolist()])
    assert ld.global_batch(77).sources == [ld.sources[i] for i in ld.schedule(77)[0].tolist()]
    for index, name in enumerate(ld.sources):
        hits = np.concatenate(([0], np.cumsum(sources == index)))
        shares = (hits[1000:] - hits[:-1000]) / 1000  # every window of 1,000 consecutive sequences
        assert np.abs(shares - cfg.mixture[name]).max() <= 0.01


def test_no_window_repeats_within_an_epoch(mixed):
    cfg = TokensConfig(mixture={"math": 1.0}, allow_repeat=True)
    ld = loader(mixed, cfg=cfg, steps=60)  # 480 windows of math: more than two epochs
    n = ld.plan.sequences["math"]
    seen: dict[int, list[int]] = {}
    for step in range(1, 61):
        batch = ld.global_batch(step)
        for epoch, q in zip(batch.epochs.tolist(), batch.sequences.tolist(), strict=True):
            seen.setdefault(epoch, []).append(q)
    assert len(seen) >= 3
    for epoch, windows in seen.items():
        assert len(windows) == len(set(windows))  # no repeats within an epoch
        if epoch < max(seen):
            assert sorted(windows) == list(range(n))  # a whole epoch is every window once
    assert seen[0] != seen[1][: len(seen[0])] and seen[0] != sorted(seen[0])  # shuffled, differently


def test_running_out_without_repetition_is_an_error(mixed):
    with pytest.raises(
        UserError, match=r"source 'math' runs out in stage 'anneal'.*tokens.allow_repeat = true"
    ):
        loader(mixed, cfg=TokensConfig(**{**CURRICULUM.__dict__, "allow_repeat": False}))


def test_boundaries_and_positions_on_hand_built_shards(counting_stream):
    tokens_dir, _ = counting_stream  # token value = position in the split; documents end at cuts - 1
    cuts = {"a": [37, 500, 1234, 3000, 5000], "b": [5001, 7777, 10_001]}
    base = {"a": 0, "b": 5000}
    seq_len = 64
    ld = TokenLoader(tokens_dir, TokensConfig(prefetch=0), seq_len=seq_len, batch_size=6, steps=10, seed=3)
    checked_boundaries = 0
    for step in range(1, 11):
        batch = ld.global_batch(step)
        assert torch.equal(batch.inputs[:, 1:], batch.targets[:, :-1])
        for row, source in enumerate(batch.sources):
            start = base[source] + int(batch.sequences[row]) * seq_len
            assert batch.inputs[row].tolist() == list(range(start, start + seq_len))
            assert batch.targets[row].tolist() == list(range(start + 1, start + seq_len + 1))
            ends = [c - 1 for c in cuts[source] if start <= c - 1 < start + seq_len]  # each doc's EOS
            expected_ids = [sum(e <= g for e in ends) for g in range(start, start + seq_len)]
            expected_pos = [
                g - max([start] + [e for e in ends if e <= g]) for g in range(start, start + seq_len)
            ]
            assert batch.doc_ids[row].tolist() == expected_ids
            assert batch.position_ids[row].tolist() == expected_pos
            checked_boundaries += len(ends)
        # cu_seqlens: the start of every segment of the flattened batch, then its size
        flat = batch.doc_ids + torch.arange(len(batch.sources))[:, None] * 1000
        changes = torch.nonzero(torch.diff(flat.reshape(-1))).flatten() + 1
        assert batch.cu_seqlens.tolist() == [0, *changes.tolist(), batch.inputs.numel()]
    assert checked_boundaries >= 3


def test_boundaries_match_the_model_convention(mixed):
    ld = loader(mixed)
    batch = ld.global_batch(3)  # the mixed shards end every document with EOS (1) and use 1 nowhere else
    doc_ids = doc_ids_from_tokens(batch.inputs, eos_id=1)
    assert torch.equal(doc_ids, batch.doc_ids)
    assert torch.equal(position_ids_from_doc_ids(doc_ids), batch.position_ids)
    assert (batch.doc_ids[:, -1] > 0).any()  # some rows hold several documents


def test_state_size_does_not_grow(mixed):
    cfg = TokensConfig(
        stages=[StageConfig(fraction=0.5), StageConfig(fraction=0.5)], allow_repeat=True, prefetch=0
    )
    ld = TokenLoader(mixed, cfg, seq_len=16, batch_size=4, steps=2_000_000, seed=0, verify="none")
    for _ in range(10):
        ld.next_step()
    early = ld.state_dict()
    ld.step = 10**6  # the state is a function of the step: jump instead of replaying a million steps
    late = ld.state_dict()
    assert set(early) == set(late) and set(early["cursors"]) == set(late["cursors"])
    assert len(json.dumps(early)) <= 400 and len(json.dumps(late)) <= 400
    assert sum(late["cursors"].values()) == 4 * 10**6 and late["stage"] == "stage0"
    restored = TokenLoader(mixed, cfg, seq_len=16, batch_size=4, steps=2_000_000, seed=0, verify="none")
    restored.load_state_dict(late)
    same_step(restored.next_step(), ld.step_data(10**6 + 1))


def test_resume_with_other_settings_is_a_user_error(mixed):
    state = loader(mixed).state_dict()
    with pytest.raises(
        UserError, match=r"loader exactly: train.seq_len 16 -> 32.*changed since the checkpoint"
    ):
        loader(mixed, seq_len=32).load_state_dict(state)
    other = TokensConfig(**{**CURRICULUM.__dict__, "mixture": {"web": 1.0, "code": 0.3, "math": 0.1}})
    with pytest.raises(UserError, match=r"the data plan \(tokens.mixture"):
        loader(mixed, cfg=other).load_state_dict(state)
    with pytest.raises(UserError, match="damaged"):
        loader(mixed).load_state_dict({**state, "cursors": {"web": 1, "code": 0, "math": 0}})
    with pytest.raises(UserError, match="format version 1"):
        loader(mixed).load_state_dict({"epoch": 0, "cursor": 3, "version": 1})


def test_batch_shape_errors(mixed):
    with pytest.raises(ConfigError, match="does not split over 3 processes"):
        loader(mixed, world_size=3)
    with pytest.raises(ConfigError, match="micro batches of train.micro_batch = 3"):
        loader(mixed, micro_batch=3)
    with pytest.raises(ValueError, match="outside the data plan's steps 1..120"):
        loader(mixed).step_data(121)
    done = loader(mixed, steps=2, prefetch=1)
    assert [d.step for d in done] == [1, 2]
    with pytest.raises(StopIteration):
        done.next_step()


def test_too_few_tokens(tmp_path):
    make_stream(tmp_path / "tokens", "val", {"x": [np.arange(100)]})
    with pytest.raises(UserError, match=r"100 tokens in 1 source\(s\), too few for one sequence.*128"):
        TokenLoader(tmp_path / "tokens", split="val", seq_len=127, batch_size=8, steps=1)


def test_eval_windows_cover_the_stream(counting_stream):
    tokens_dir, stream = counting_stream
    windows = list(eval_windows(tokens_dir, "train", seq_len=64))
    assert all(len(w) == 65 for w in windows[:-1]) and 2 <= len(windows[-1]) <= 65
    assert all(w.dtype == np.int64 for w in windows)
    targets = np.concatenate([w[1:] for w in windows])
    assert np.array_equal(targets, stream[1:])
    assert [int(w[0]) for w in windows] == list(range(0, 10_000, 64))
    limited = list(eval_windows(tokens_dir, "train", seq_len=64, max_tokens=200))
    assert np.array_equal(np.concatenate([w[1:] for w in limited]), stream[1:200])
    again = list(eval_windows(tokens_dir, "train", seq_len=64))
    assert all(np.array_equal(a, b) for a, b in zip(windows, again, strict=True))
