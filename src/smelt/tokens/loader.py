"""The training loader: mixture and curriculum, packed sequences, global shuffle, exact O(1) resume.

Every optimizer step k (1-based, as in metrics.jsonl) has one global batch of B sequences of
seq_len + 1 tokens, a pure function of (shards, [tokens] plan, seed, k):

1. the data plan (`smelt.tokens.mixture`) says which stage step k is in and how many sequences each
   source gives that stage;
2. the stage's interleave (`smelt.tokens.order.Interleave`) says which source fills each of the
   B positions, keeping every window's realized mixture within a fraction of a point of the target;
3. the source's n-th sequence of the run is window permute(n mod N, epoch = n div N) of that source
   (a seeded bijection per source and epoch: a global shuffle, no repeats within an epoch);
4. the window is read from the memory-mapped shards, optionally FIM-rewritten, and packed with its
   document boundaries (`smelt.tokens.packing`).

Rank r of w takes rows [r B/w, (r+1) B/w) of the global batch, in micro batches of `micro_batch`
rows: the global batch does not depend on the world size or the micro batch, so a run can resume on
another number of processes and see the same data. Nothing grows with the run: the state is the step
(plus per-source cursors and a fingerprint of the plan, to check a resume), and restoring it costs
O(sources^2 log n). A background thread prepares the next steps (pinned when CUDA is present).

A fork continues its parent's data by default: every source starts at the parent checkpoint's cursor
(`smelt.tokens.fork`), so step 1 of a fork reads what the parent would have read next.

`eval_windows` gives the fixed validation windows used by the trainer and the held-out evaluation.
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from smelt.config import Config, TokensConfig
from smelt.errors import ConfigError, UserError
from smelt.tokenizer.load import read_info
from smelt.tokens.fork import ForkStart, fork_start
from smelt.tokens.mixture import DataPlan, Stage, build_plan
from smelt.tokens.order import name_key, permute
from smelt.tokens.packing import Batch, SourceStream, apply_fim, pack
from smelt.tokens.shards import ShardSet, list_sources

STATE_VERSION = 2
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>")


@dataclass
class StepData:
    """What one rank trains on at one optimizer step."""

    step: int
    stage: Stage
    micro: list[Batch]  # this rank's micro batches, in order
    source_counts: dict[str, int]  # sequences per source in the whole global batch


class TokenLoader:
    """Global batches of a split's token shards, per the data plan; see the module docstring."""

    def __init__(
        self,
        tokens_dir: str | Path,
        cfg: TokensConfig | None = None,
        *,
        seq_len: int,
        batch_size: int,
        steps: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        micro_batch: int = 0,
        split: str = "train",
        train_tokens: int | None = None,
        fim_sources: list[str] | None = None,
        fim_ids: tuple[int, int, int] | None = None,
        verify: str = "checksum",
        pin_memory: bool | None = None,
        fork: ForkStart | None = None,
    ):
        """`batch_size`: global sequences per step; `micro_batch`: rows per micro batch (0: the whole
        rank slice); `fim_sources`: sources FIM applies to when cfg.fim_rate > 0 (None: cfg.fim_sources);
        `fork`: the parent checkpoint whose data stream this run continues (smelt.tokens.fork)."""
        cfg = cfg or TokensConfig()
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        if batch_size % world_size:
            raise ConfigError(
                f"the global batch of {batch_size} sequences does not split over {world_size} processes; "
                f"make train.batch_tokens / train.seq_len a multiple of the world size."
            )
        self.per_rank = batch_size // world_size
        self.micro_batch = micro_batch or self.per_rank
        if self.per_rank % self.micro_batch:
            raise ConfigError(
                f"each process's {self.per_rank} sequences per step do not split into micro batches of "
                f"train.micro_batch = {self.micro_batch}; pick a micro_batch that divides {self.per_rank}."
            )
        self.cfg = cfg
        self.split = split
        self.seq_len = seq_len
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.pin_memory = torch.cuda.is_available() if pin_memory is None else pin_memory
        shards = ShardSet(tokens_dir, split, verify=verify)
        self.meta = shards.meta
        self.sources = shards.sources
        self.streams = [SourceStream(shards.select(name), seq_len) for name in self.sources]
        sizes = {s.name: s.total_tokens for s in self.streams}
        start = fork.cursors(seq_len, seed, {s.name: s.sequences for s in self.streams}) if fork else None
        phases = fork.phases(sizes, seq_len, seed) if fork else None
        self.plan: DataPlan = build_plan(
            cfg, sizes, seq_len, batch_size, steps, seed, train_tokens, start, phases
        )
        self.fim_rate = cfg.fim_rate
        self.fim_ids = fim_ids
        self.fim_sources = sorted(cfg.fim_sources if fim_sources is None else fim_sources)
        if self.fim_rate > 0:
            unknown = sorted(set(self.fim_sources) - set(self.sources))
            if unknown:
                raise UserError(
                    f"tokens.fim_sources names {', '.join(map(repr, unknown))}, not a source of the {split!r} "
                    f"shards ({', '.join(self.sources)}); fix tokens.fim_sources."
                )
            if not self.fim_sources:
                raise UserError(
                    f"tokens.fim_rate = {self.fim_rate} but no source gets FIM: list the code sources in "
                    f"tokens.fim_sources or mark them code = true in [[data.sources]], or set tokens.fim_rate = 0."
                )
            if fim_ids is None:
                raise UserError(
                    f"tokens.fim_rate = {self.fim_rate} needs the tokenizer's FIM tokens {', '.join(FIM_TOKENS)}, "
                    f"which it does not have: set tokenizer.fim_tokens = true and retrain the tokenizer (and "
                    f"re-tokenize), or set tokens.fim_rate = 0."
                )
        self._fim = [name in self.fim_sources and self.fim_rate > 0 for name in self.sources]
        self._bos = int(self.meta["bos_id"]) if cfg.bos and "bos_id" in self.meta else None
        self._name_keys = [name_key(name) for name in self.sources]
        self.step = 0  # optimizer steps consumed
        self._schedule: tuple[int, np.ndarray, np.ndarray] | None = None
        self.prefetch = cfg.prefetch
        self._thread: threading.Thread | None = None
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        tokens_dir: str | Path,
        tokenizer_dir: str | Path | None = None,
        rank: int = 0,
        world_size: int = 1,
        verify: str = "checksum",
        plan: Any = None,
        parent: str | Path | None = None,
    ) -> TokenLoader:
        """The training loader of a pipeline config (global batch = train.batch_tokens / seq_len).

        `plan`: the trainer's batch plan (smelt.train.batching.BatchPlan); its loader batch and loader
        steps then decide the loader's (under a batch ramp, the starting batch and the steps it takes).
        A fork (train.init_from) continues its parent's data unless train.fork_data = 'restart';
        `parent`: its checkpoint directory when the caller has resolved it (else from train.init_from)."""
        tc = cfg.train
        batch_tokens = tc.batch_tokens or tc.seq_len * tc.micro_batch * world_size
        if plan is not None:
            batch_tokens = plan.loader_batch_tokens
        if batch_tokens % tc.seq_len:
            raise ConfigError(
                f"train.batch_tokens = {batch_tokens} is not a multiple of train.seq_len = {tc.seq_len}; "
                f"use a whole number of sequences."
            )
        fim_ids = read_fim_ids(tokenizer_dir) if tokenizer_dir is not None else None
        fim_sources = cfg.tokens.fim_sources or [s.name for s in cfg.data.sources if s.code]
        if not cfg.tokens.fim_sources:
            present = set(list_sources(tokens_dir, "train"))
            fim_sources = [s for s in fim_sources if s in present]
        return cls(
            tokens_dir,
            cfg.tokens,
            seq_len=tc.seq_len,
            batch_size=batch_tokens // tc.seq_len,
            steps=plan.loader_steps if plan is not None else math.ceil(tc.tokens / batch_tokens),
            seed=cfg.run.seed,
            rank=rank,
            world_size=world_size,
            micro_batch=tc.micro_batch,
            train_tokens=tc.tokens,
            fim_sources=fim_sources,
            fim_ids=fim_ids,
            verify=verify,
            fork=fork_start(cfg, Path(parent) if parent is not None else None),
        )

    # -- the schedule (cheap: no token is read) -------------------------------------------------------

    def stage_at(self, step: int) -> Stage:
        """The curriculum stage of optimizer step `step` (1-based)."""
        return self.plan.stage_at(step)

    def schedule(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(source index, run-wide sequence number within that source) of each row of step's global batch."""
        cached = self._schedule
        if cached is not None and cached[0] == step:
            return cached[1], cached[2]
        stage = self.plan.stage_at(step)
        start = (step - stage.first_step) * self.batch_size
        source, j = stage.interleave.slice(start, start + self.batch_size)
        offsets = np.array([stage.offsets[s] for s in self.sources], dtype=np.int64)
        number = offsets[source] + j
        self._schedule = (step, source, number)  # micro batches of one step share it
        return source, number

    def source_counts(self, step: int) -> dict[str, int]:
        source, _ = self.schedule(step)
        counts = np.bincount(source, minlength=len(self.sources))
        return {name: int(c) for name, c in zip(self.sources, counts, strict=True)}

    def cursors(self, step: int) -> dict[str, int]:
        """Sequences each source has given after `step` steps (0 <= step <= plan steps), counting from
        the start of its stream (a fork: from before its parent's first step)."""
        if step == 0:
            return {s: self.plan.start.get(s, 0) for s in self.sources}
        stage = self.plan.stage_at(step)
        done = stage.interleave.cursors((step - stage.first_step + 1) * self.batch_size)
        return {s: stage.offsets[s] + done[i] for i, s in enumerate(self.sources)}

    # -- batches --------------------------------------------------------------------------------------

    def rows(self, step: int, lo: int, hi: int) -> Batch:
        """Rows [lo, hi) of step's global batch, read and packed."""
        source, number = self.schedule(step)
        source, number = source[lo:hi], number[lo:hi]
        windows = np.empty((hi - lo, self.seq_len + 1), dtype=np.int64)
        sequences = np.empty(hi - lo, dtype=np.int64)
        epochs = np.empty(hi - lo, dtype=np.int64)
        fim = np.zeros(hi - lo, dtype=bool)
        ends_rows, ends_positions = [], []
        for index, stream in enumerate(self.streams):
            mine = np.flatnonzero(source == index)
            if not len(mine):
                continue
            n = stream.sequences
            epoch, offset = np.divmod(number[mine], n)
            seq = np.empty_like(offset)
            for e in np.unique(epoch):
                at = epoch == e
                seq[at] = permute(offset[at], n, self.seed, stream.name, int(e))
            sequences[mine], epochs[mine] = seq, epoch
            for row, q in zip(mine.tolist(), seq.tolist(), strict=True):
                stream.read(q, windows[row])
            r, p = stream.boundaries(seq)
            if self._fim[index]:
                for k, row in enumerate(mine.tolist()):
                    rng = np.random.default_rng(
                        [self.seed, self._name_keys[index], int(epoch[k]), int(seq[k])]
                    )
                    fim[row] = apply_fim(
                        windows[row],
                        p[r == k],
                        rng,
                        self.fim_rate,
                        self.cfg.fim_spm_rate,
                        self.fim_ids,
                        self._bos,
                    )
            ends_rows.append(mine[r])
            ends_positions.append(p)
        inputs, targets, doc_ids, position_ids, cu_seqlens = pack(
            windows, np.concatenate(ends_rows), np.concatenate(ends_positions)
        )
        return Batch(
            inputs.contiguous(),
            targets.contiguous(),
            doc_ids,
            position_ids,
            cu_seqlens,
            sources=[self.sources[i] for i in source.tolist()],
            sequences=sequences,
            epochs=epochs,
            fim=fim,
        )

    def global_batch(self, step: int) -> Batch:
        """The whole global batch of `step` (every rank's rows): for inspection and tests."""
        return self.rows(step, 0, self.batch_size)

    def step_data(self, step: int) -> StepData:
        """This rank's micro batches for `step` (a pure function of the step)."""
        if not 1 <= step <= self.plan.steps:
            raise ValueError(f"step {step} is outside the data plan's steps 1..{self.plan.steps}")
        first = self.rank * self.per_rank
        micro = []
        for lo in range(first, first + self.per_rank, self.micro_batch):
            batch = self.rows(step, lo, lo + self.micro_batch)
            micro.append(batch.pin_memory() if self.pin_memory else batch)
        return StepData(step, self.plan.stage_at(step), micro, self.source_counts(step))

    def next_step(self) -> StepData:
        """The next step's data (from the prefetch thread when tokens.prefetch > 0); advances the state."""
        if self.step >= self.plan.steps:
            raise StopIteration(f"the data plan has {self.plan.steps} steps and all were consumed")
        if self.prefetch <= 0:
            data = self.step_data(self.step + 1)
        else:
            if self._thread is None:
                self._start()
            assert self._queue is not None
            data = self._queue.get()
            if isinstance(data, BaseException):
                self.close()
                raise data
        if data.step != self.step + 1:
            raise AssertionError(f"loader produced step {data.step}, expected {self.step + 1}")
        self.step = data.step
        return data

    def __iter__(self) -> Iterator[StepData]:
        while self.step < self.plan.steps:
            yield self.next_step()

    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=self.prefetch)
        stop, out, first = self._stop, self._queue, self.step + 1

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for step in range(first, self.plan.steps + 1):
                    if not put(self.step_data(step)):
                        return
            except BaseException as exc:  # handed to the consumer, raised there
                put(exc)

        self._thread = threading.Thread(target=work, name="smelt-loader", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the prefetch thread (the loader can be used again: it restarts at its step)."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
        self._thread, self._queue = None, None

    # -- state ----------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """O(sources) JSON: the step, where each source stands, and what the plan was."""
        stage = self.plan.stage_at(max(self.step, 1))
        return {
            "version": STATE_VERSION,
            "split": self.split,
            "step": self.step,
            "stage": stage.name,
            "tokens": self.step * self.batch_size * self.seq_len,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "cursors": self.cursors(self.step),
            "sources": {s.name: s.sequences for s in self.streams},
            "plan": self.plan.fingerprint(),
            **self.plan.state(),  # a fork that continues its parent's data: where it started
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the saved step; a state from other data or settings is a UserError."""
        if state.get("version") != STATE_VERSION:
            raise UserError(
                f"cannot resume the {self.split!r} loader: the saved state has format version "
                f"{state.get('version')}, this smelt writes {STATE_VERSION}. Start a fresh run (or resume with "
                f"the smelt version that wrote the checkpoint)."
            )
        changes = [
            f"{label} {state.get(key)} -> {value}"
            for key, label, value in (
                ("seq_len", "train.seq_len", self.seq_len),
                ("batch_size", "global batch (train.batch_tokens / seq_len)", self.batch_size),
                ("seed", "run.seed", self.seed),
                (
                    "sources",
                    "sequences per source (the token shards)",
                    {s.name: s.sequences for s in self.streams},
                ),
            )
            if state.get(key) != value
        ]
        fork = {k: state[k] for k in ("start", "phases") if k in state}
        if not changes and fork != self.plan.state():
            changes.append(
                f"where this fork's data starts in its parent's stream ({fork.get('start') or 'the beginning'} -> "
                f"{self.plan.continued or 'the beginning'}; train.fork_data, or a train.init_from that now names "
                f"another checkpoint of the parent: name it as RUN:STEP)"
            )
        if not changes and state.get("plan") != self.plan.fingerprint():
            changes.append("the data plan (tokens.mixture, tokens.epochs, tokens.stages or train.tokens)")
        if changes:
            raise UserError(
                f"cannot resume the {self.split!r} loader exactly: {'; '.join(changes)} changed since the "
                f"checkpoint. Resume with the original settings and shards, or start a fresh run."
            )
        step = int(state["step"])
        if not 0 <= step <= self.plan.steps or state.get("cursors") != self.cursors(step):
            raise UserError(
                f"cannot resume the {self.split!r} loader: the saved cursors at step {step} do not match "
                f"the data plan; the checkpoint's loader state is damaged. Use another checkpoint."
            )
        self.close()
        self.step = step


def read_fim_ids(tokenizer_dir: str | Path) -> tuple[int, int, int] | None:
    """(prefix, middle, suffix) ids from the tokenizer's smelt.json, or None when it has no FIM tokens."""
    specials = read_info(tokenizer_dir).get("special_tokens", {})
    ids = [specials.get(token) for token in FIM_TOKENS]
    return None if None in ids else (int(ids[0]), int(ids[1]), int(ids[2]))


def eval_windows(
    tokens_dir: Path, split: str, seq_len: int, max_tokens: int = 0, source: str | None = None
) -> Iterator[np.ndarray]:
    """Consecutive windows of seq_len + 1 tokens (int64) over the first `max_tokens` of a split (0: all).

    Windows start at 0, seq_len, 2 seq_len, ...; consecutive windows share one token, so each token but
    the first is a target exactly once. The last window is shorter when the stream does not divide evenly.
    """
    shards = ShardSet(tokens_dir, split, source)
    limit = shards.total_tokens if max_tokens <= 0 else min(max_tokens, shards.total_tokens)
    start = 0
    while start + 1 < limit:
        yield shards.read(start, min(seq_len + 1, limit - start)).astype(np.int64)
        start += seq_len
