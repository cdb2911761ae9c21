"""What a fork reads: its parent's data stream, continued (`train.fork_data`).

A fork (`train.init_from`, `smelt train CONFIG --from RUN[:STEP]`, `smelt anneal`) starts from a
committed checkpoint of another run. Under `train.fork_data = "continue"` (the default) its loader
starts every source the parent read where the parent's loader stood at that checkpoint: the
checkpoint's loader state holds how many sequences of each source the parent had consumed (its
cursors, which already count what the parent's own parent read), and the fork's data plan takes them
as each source's starting offset. A shared source then gives its sequences in exactly the order the
parent would have read them next (the same seeded shuffle per epoch), so nothing the model has
trained on comes back before that source's epoch is used up; a source new to the fork starts at its
beginning; the mixture, curriculum stages and batch size are the fork's own. The fork's first stage
also interleaves its sources from where the parent's plan stood (the parent's plan is rebuilt from
the config its checkpoint recorded and checked against the state's fingerprint), so a fork that
keeps the parent's mixture and batch trains at its step k on the rows of the parent's step S + k
(exactly while its per-source counts are proportional to the parent stage's; otherwise each source's
rows are still the parent's next ones and only the split of a batch among sources may differ by a
sequence).

`train.fork_data = "restart"` reads the fork's data from the beginning, as a fresh run would: the
model has seen its first batches. It is for a fork that means to reuse data (or cannot continue it).

Continuing needs the parent's windows: the same `train.seq_len`, `run.seed` and, for every shared
source, the same token shards (the same number of sequences); a checkpoint without a loader state
(weights only: an average, an import) has no position. Each of these stops with exit 2 naming
`train.fork_data`.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smelt.config import Config, config_from_dict
from smelt.errors import UserError
from smelt.layout import CHECKPOINTS, MARKER, META, checkpoints_dir, latest_checkpoint, step_dir_name
from smelt.tokens.mixture import build_plan, sequences_of

_STEP_SUFFIX = re.compile(r"^(.*):(\d+|latest)$")
RESTART = (
    "set train.fork_data = 'restart' to read this run's data from its beginning (the model has seen the "
    "parent's first batches)"
)


@dataclass(frozen=True)
class ForkStart:
    """The parent checkpoint a fork continues the data of, its loader state and its config."""

    checkpoint: Path
    state: dict[str, Any]
    config: dict[str, Any] | None = None

    def cursors(self, seq_len: int, seed: int, sequences: dict[str, int]) -> dict[str, int]:
        """Where each of this run's sources starts: the parent's cursor for a source it read, 0 for a
        new one. `sequences`: this run's sequences per source (one epoch)."""
        state, where = self.state, f"the parent checkpoint {self.checkpoint}"
        if state.get("seq_len") != seq_len:
            raise UserError(
                f"train.fork_data = 'continue' cannot continue the data of {where}: it read windows of "
                f"train.seq_len = {state.get('seq_len')} tokens, this run reads {seq_len}, so its order "
                f"says nothing about which of the new windows the model has seen. Keep train.seq_len = "
                f"{state.get('seq_len')}, or {RESTART}."
            )
        if state.get("seed") != seed:
            raise UserError(
                f"train.fork_data = 'continue' cannot continue the data of {where}: it was shuffled with "
                f"run.seed = {state.get('seed')}, this run has {seed}. Keep run.seed = {state.get('seed')}, "
                f"or {RESTART}."
            )
        saved: dict[str, int] = state.get("sources") or {}
        cursors: dict[str, int] = state.get("cursors") or {}
        changed = [
            f"{name} ({saved[name]:,} sequences there, {n:,} here)"
            for name, n in sorted(sequences.items())
            if name in saved and saved[name] != n and cursors.get(name, 0)
        ]
        if changed:
            raise UserError(
                f"train.fork_data = 'continue' cannot continue the data of {where}: the token shards of "
                f"{', '.join(changed)} differ from the ones the parent read, so its position in them means "
                f"nothing here. Fork with the parent's token shards, or {RESTART}."
            )
        return {name: int(cursors.get(name, 0)) if name in saved else 0 for name in sorted(sequences)}

    def phases(self, sizes: dict[str, int], seq_len: int, seed: int) -> tuple[dict[str, int], int] | None:
        """The interleave phases at which the parent's plan stood at the checkpoint (DataPlan.continuation),
        or None when that plan cannot be rebuilt exactly: no recorded config, a source the parent read
        missing here, or a rebuilt plan whose fingerprint is not the state's (a batch ramp, other shards).
        `sizes`: this run's tokens per source. Without them the fork's sources interleave by seeded phases."""
        state, tokens = self.state, {}
        for name, n in (state.get("sources") or {}).items():
            if name not in sizes or sequences_of(sizes[name], seq_len) != n:
                return None
            tokens[name] = sizes[name]
        if not self.config or not tokens:
            return None
        saved = state.get("phases")
        try:
            parent = config_from_dict(self.config, origin=f"{self.checkpoint}/meta.json")
            batch = int(state["batch_size"])
            plan = build_plan(
                parent.tokens, tokens, seq_len, batch, math.ceil(parent.train.tokens / (batch * seq_len)), seed,
                parent.train.tokens, state.get("start"), (saved["values"], saved["scale"]) if saved else None,
            )  # fmt: skip
        except (UserError, KeyError, TypeError, ValueError):
            return None
        if plan.fingerprint() != state.get("plan"):
            return None
        return plan.continuation(int(state["step"]))


def parent_checkpoint(spec: str) -> Path:
    """The checkpoint directory `train.init_from` names, by the rules of smelt.checkpoint.lineage
    (`RUN`, `RUN:STEP`, `RUN/train/checkpoints[:STEP]`, a `step_NNNNNNN` directory; `RUN` alone is its
    newest committed checkpoint). The trainer passes the checkpoint lineage resolved (and verified)."""
    text, step = spec.strip(), None
    match = _STEP_SUFFIX.match(text)
    if match and not Path(text).exists():
        text, step = match.group(1), None if match.group(2) == "latest" else int(match.group(2))
    path = Path(text)
    if (path / MARKER).is_file() or path.name.startswith("step_"):
        return path
    folder = next((c for c in (checkpoints_dir(path), path / CHECKPOINTS, path) if c.is_dir()), None)
    found = None
    if folder is not None:
        found = latest_checkpoint(folder) if step is None else folder / step_dir_name(step)
    if found is None or not found.is_dir():
        raise UserError(
            f"train.init_from = {spec!r} names no committed checkpoint (RUN, RUN:STEP or a step_NNNNNNN "
            f"directory), so there is no data position to continue. Fix train.init_from, or {RESTART}."
        )
    return found


def recorded_parent(cfg: Config) -> Path | None:
    """The parent checkpoint a fork that has trained started from, as its train/run.json records it
    (an absolute path, whatever the directory a command runs in and however far the parent has trained
    since), when the run's train.init_from is still the one it recorded."""
    try:
        manifest = json.loads((cfg.run_dir / "train" / "run.json").read_text())
    except (OSError, ValueError):
        return None
    recorded = (manifest.get("parent") or {}).get("checkpoint")
    same = ((manifest.get("config") or {}).get("train") or {}).get("init_from") == cfg.train.init_from
    return Path(recorded) if same and recorded and Path(recorded).is_dir() else None


def fork_start(cfg: Config, checkpoint: Path | None = None) -> ForkStart | None:
    """The parent data a fork continues, or None (not a fork, or train.fork_data = 'restart').
    `checkpoint`: the parent checkpoint already resolved (else the one the fork's run.json records, else
    resolved from train.init_from)."""
    tc = cfg.train
    if not tc.init_from or tc.fork_data == "restart":
        return None
    if checkpoint is None:
        checkpoint = recorded_parent(cfg) or parent_checkpoint(tc.init_from)
    checkpoint = Path(checkpoint)
    path = checkpoint / META
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"cannot read {path} ({exc}) to continue the parent's data; fix it, or {RESTART}."
        ) from exc
    state = meta.get("loader")
    if not isinstance(state, dict) or "cursors" not in state:
        raise UserError(
            f"train.fork_data = 'continue': {checkpoint} records no data position (it holds weights only, "
            f"e.g. an average or an import), so there is no stream to continue: {RESTART}."
        )
    return ForkStart(checkpoint, state, meta.get("config"))
