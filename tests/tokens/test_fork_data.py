"""What a fork reads (train.fork_data): by default its parent's data stream, continued from the
checkpoint; with 'restart' its own data from the beginning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from smelt.config import TokensConfig, config_from_dict
from smelt.errors import UserError
from smelt.layout import MARKER
from smelt.tokens.fork import ForkStart, fork_start
from smelt.tokens.loader import TokenLoader

from .conftest import make_stream, random_documents

MIXTURE = {"web": 0.6, "code": 0.3, "math": 0.1}
SEQ, BATCH, SEED = 16, 8, 11


def config(steps: int, mixture: dict[str, float] = MIXTURE, **tokens: object) -> dict:
    """A pipeline config (as a checkpoint's meta.json records it) whose loader is `loader`'s."""
    return config_from_dict({
        "run": {"seed": SEED}, "model": {"max_seq_len": SEQ},
        "train": {"seq_len": SEQ, "micro_batch": BATCH, "batch_tokens": SEQ * BATCH, "tokens": steps * SEQ * BATCH},
        "tokens": {"mixture": mixture, **tokens},
    }).to_dict()  # fmt: skip


def loader(tokens_dir: Path, steps: int, fork: ForkStart | None = None, mixture=MIXTURE, **kw) -> TokenLoader:
    cfg = TokensConfig(mixture=mixture, prefetch=0, **kw.pop("tokens", {}))
    options = {"seq_len": SEQ, "batch_size": BATCH, "seed": SEED, "verify": "none", **kw}
    return TokenLoader(tokens_dir, cfg, steps=steps, fork=fork, **options)


def parent_at(tokens_dir: Path, steps: int, step: int, mixture=MIXTURE) -> tuple[TokenLoader, ForkStart]:
    """A parent run's loader and the ForkStart of its checkpoint at `step`."""
    parent = loader(tokens_dir, steps, mixture=mixture)
    parent.step = step  # the state is a function of the step
    return parent, ForkStart(Path("parent/step"), parent.state_dict(), config(steps, mixture))


def rows(ld: TokenLoader, steps: range) -> list[tuple[str, int, int]]:
    """(source, epoch, sequence) of every row of these steps, in order."""
    out = []
    for step in steps:
        batch = ld.global_batch(step)
        out += zip(batch.sources, batch.epochs.tolist(), batch.sequences.tolist(), strict=True)
    return out


def same_batch(a, b) -> None:
    for name in ("inputs", "targets", "doc_ids", "position_ids", "cu_seqlens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.sources == b.sources and np.array_equal(a.sequences, b.sequences)


def test_a_same_mixture_fork_trains_on_the_parents_next_batches(mixed):
    parent, start = parent_at(mixed, steps=40, step=12)
    fork = loader(mixed, 20, fork=start)  # another length: its own plan, the parent's stream
    for k in range(1, 21):
        same_batch(fork.global_batch(k), parent.global_batch(12 + k))
    assert fork.cursors(5) == parent.cursors(17)
    assert not set(rows(fork, range(1, 21))) & set(rows(parent, range(1, 13)))
    assert (
        "continues the parent's data (train.fork_data = 'continue'): code from sequence" in fork.plan.table()
    )
    # 'restart' (no ForkStart): the old behaviour, the parent's first batches again.
    restarted = loader(mixed, 20)
    same_batch(restarted.global_batch(1), parent.global_batch(1))
    assert restarted.plan.fingerprint() != fork.plan.fingerprint()


def test_a_fork_of_a_fork_goes_on_with_the_grandparents_stream(mixed):
    grandparent, start = parent_at(mixed, steps=40, step=10)
    child = loader(mixed, 30, fork=start)
    child.step = 5
    grandchild = loader(mixed, 20, fork=ForkStart(Path("child/step"), child.state_dict(), config(30)))
    for k in range(1, 21):
        same_batch(grandchild.global_batch(k), grandparent.global_batch(15 + k))


@pytest.fixture
def new_data(tmp_path) -> tuple[Path, Path]:
    """A parent's shards (web, code) and a fork's: the same web and code, and a new source, math."""
    rng = np.random.default_rng(3)
    web, code, math = (
        random_documents(rng, n, lo, hi) for n, lo, hi in ((300, 2, 200), (80, 20, 480), (60, 5, 100))
    )
    make_stream(tmp_path / "parent", "train", {"web": web, "code": code}, shard_tokens=4000)
    make_stream(tmp_path / "fork", "train", {"web": web, "code": code, "math": math}, shard_tokens=4000)
    return tmp_path / "parent", tmp_path / "fork"


def test_a_mixture_fork_continues_the_shared_sources_and_starts_new_ones(new_data):
    parent_dir, fork_dir = new_data
    shared = {"web": 0.7, "code": 0.3}
    parent, start = parent_at(parent_dir, steps=30, step=9, mixture=shared)
    fork = loader(fork_dir, 15, fork=start, mixture={"web": 0.2, "code": 0.4, "math": 0.4})
    seen = rows(parent, range(1, 10))
    ahead = rows(parent, range(10, 31))  # what the parent read after the checkpoint
    read = rows(fork, range(1, 16))
    assert not set(read) & set(seen)
    for source in ("web", "code"):  # the same order, from where the parent stood
        mine = [r for r in read if r[0] == source]
        assert mine == [r for r in ahead if r[0] == source][: len(mine)] and mine
    counts = fork.plan.summary()["sources"]
    assert counts["math"]["consumed"] == 48 and fork.cursors(0) == {**parent.cursors(9), "math": 0}
    # math is new: it starts at the beginning of its stream, as in a fresh run with that mixture.
    fresh = loader(fork_dir, 15, mixture={"web": 0.2, "code": 0.4, "math": 0.4})
    assert [r for r in read if r[0] == "math"] == [r for r in rows(fresh, range(1, 16)) if r[0] == "math"]


def test_a_fork_resumes_exactly_and_a_changed_start_is_refused(mixed):
    parent, start = parent_at(mixed, steps=40, step=12)
    fork = loader(mixed, 20, fork=start)
    for _ in range(5):
        fork.next_step()
    state = json.loads(json.dumps(fork.state_dict()))
    assert (
        state["start"] == parent.cursors(12) and state["cursors"] == parent.cursors(17) and "phases" in state
    )
    resumed = loader(mixed, 20, fork=start)
    resumed.load_state_dict(state)
    same_batch(resumed.next_step().micro[0], fork.step_data(6).micro[0])
    with pytest.raises(UserError, match="where this fork's data starts in its parent's stream"):
        loader(mixed, 20).load_state_dict(state)  # now train.fork_data = 'restart'
    _, elsewhere = parent_at(mixed, steps=40, step=14)
    with pytest.raises(UserError, match="name it as RUN:STEP"):
        loader(mixed, 20, fork=elsewhere).load_state_dict(state)


def test_what_cannot_be_continued_stops_naming_train_fork_data(mixed):
    _, start = parent_at(mixed, steps=40, step=12)
    with pytest.raises(
        UserError, match=r"train.seq_len = 16 tokens, this run reads 32.*train.fork_data = 'restart'"
    ):
        loader(mixed, 10, fork=start, seq_len=32)
    with pytest.raises(
        UserError, match=r"run.seed = 11, this run has 5\. Keep run.seed = 11, or set train.fork_data"
    ):
        loader(mixed, 10, fork=start, seed=5)
    other = ForkStart(start.checkpoint, {**start.state, "sources": {**start.state["sources"], "web": 999}})
    with pytest.raises(UserError, match=r"token shards of web \(999 sequences there, 3,111 here\)"):
        loader(mixed, 10, fork=other)


def test_what_the_parent_read_counts_towards_running_out(mixed):
    # math has 182 sequences; the parent read about 148 of them, half of every batch for 37 steps.
    parent, start = parent_at(mixed, steps=40, step=37, mixture={"web": 0.5, "math": 0.5})
    read = parent.cursors(37)["math"]
    with pytest.raises(
        UserError,
        match=rf"'math' runs out .* 16 tokens after the {read} its parent read .* train.fork_data = 'restart'",
    ):
        loader(mixed, 10, fork=start, mixture={"web": 0.5, "math": 0.5})
    repeated = loader(mixed, 10, fork=start, mixture={"web": 0.5, "math": 0.5}, tokens={"allow_repeat": True})
    assert repeated.plan.epochs("math") == pytest.approx((read + 40) / 182)


def fake_checkpoint(run: Path, step: int, state: dict | None, cfg: dict) -> Path:
    checkpoint = run / "train" / "checkpoints" / f"step_{step:07d}"
    checkpoint.mkdir(parents=True)
    meta = {"step": step, "config": cfg, **({"loader": state} if state is not None else {})}
    (checkpoint / "meta.json").write_text(json.dumps(meta))
    (checkpoint / MARKER).write_text("{}")
    return checkpoint


def test_inspect_batches_of_a_fork_shows_the_parents_next_batches(tmp_path, mixed, monkeypatch):
    """The loader of a pipeline config (the trainer's, `smelt inspect batches`', a release's) finds the
    parent from train.init_from; 'restart' reads from the beginning; a weights-only parent has no data."""
    from smelt.tokens.decoded import describe_batch

    (tmp_path / "smelt.json").write_text('{"special_tokens": {}}')  # a tokenizer without FIM tokens
    raw = config(40)
    parent_cfg = config_from_dict(raw)
    parent = TokenLoader.from_config(parent_cfg, mixed, verify="none")
    parent.step = 12
    fake_checkpoint(tmp_path / "base", 12, parent.state_dict(), raw)
    fork_raw = {
        **raw,
        "train": {**raw["train"], "init_from": f"{tmp_path / 'base'}:12", "tokens": 20 * SEQ * BATCH},
    }
    fork = TokenLoader.from_config(config_from_dict(fork_raw), mixed, verify="none")
    for k in (1, 2, 20):
        same_batch(fork.global_batch(k), parent.global_batch(12 + k))

    class Plain:  # decodes token ids as numbers: these shards have no tokenizer
        @staticmethod
        def load(_):
            return Plain()

        def decode(self, ids):
            return " ".join(map(str, ids))

    monkeypatch.setattr("smelt.tokens.decoded.Tokenizer", Plain)

    def shown(cfg_dict: dict, step: int) -> list[str]:
        text = describe_batch(
            config_from_dict(cfg_dict), step, rows=0, tokens_dir=mixed, tokenizer_dir=tmp_path
        )
        return text.split("\n")[2:]  # the rows, without the step's header

    assert shown(fork_raw, 1) == shown(raw, 13)
    # A fork that has trained finds the parent checkpoint its run.json recorded (an absolute path), so
    # a command run from another directory, where train.init_from does not resolve, reads the same.
    moved = {
        **fork_raw,
        "run": {**fork_raw["run"], "dir": str(tmp_path), "name": "fork"},
        "train": {**fork_raw["train"], "init_from": "elsewhere/base:12"},
    }
    (tmp_path / "fork" / "train").mkdir(parents=True)
    parent_record = {"checkpoint": str(tmp_path / "base" / "train" / "checkpoints" / "step_0000012")}
    (tmp_path / "fork" / "train" / "run.json").write_text(
        json.dumps({"config": moved, "parent": parent_record})
    )
    assert shown(moved, 1) == shown(raw, 13)
    restart = {**fork_raw, "train": {**fork_raw["train"], "fork_data": "restart"}}
    assert fork_start(config_from_dict(restart)) is None
    assert shown(restart, 1) == shown(raw, 1)
    fake_checkpoint(tmp_path / "soup", 4, None, raw)
    weights_only = {**fork_raw, "train": {**fork_raw["train"], "init_from": str(tmp_path / "soup")}}
    with pytest.raises(UserError, match="records no data position .* set train.fork_data = 'restart'"):
        TokenLoader.from_config(config_from_dict(weights_only), mixed, verify="none")
