"""Mixtures and curricula: how many sequences of each source every stage of a run takes.

The plan is fixed before the first step, from the shard sizes and `[tokens]`: a list of stages
(boundaries on whole optimizer steps), each with a target weight and an exact sequence count per
source. A source's sequences are consumed as one stream across stages (an epoch-by-epoch shuffled
order), so a later stage continues where the earlier one stopped and nothing repeats until the
whole source has been seen. Everything the loader does follows from this plan and the step number.

Forms of `tokens.mixture` / `tokens.epochs` / `[[tokens.stages]]`:
- `mixture = {web = 3, code = 1}`: weights, normalized; unnamed sources get 0.
- `epochs = {wiki = 6.0, web = 1.0}`: weights proportional to multiplier x source size. They fix the
  proportions; the epochs realized depend on train.tokens and are printed in the plan table.
- neither: every source in its natural proportion (by usable tokens).
- stages: each takes `tokens` or a `fraction` of train.tokens and may override the mixture.

A fork that continues its parent's data (`train.fork_data = "continue"`, smelt.tokens.fork) starts
each source at the parent's cursor (`start`): the run's first stage continues the parent's stream of
that source as a later stage continues an earlier one, and the epochs counted (and the check that a
source does not run out) include what the parent read. Its first stage also takes the interleave
phases at which the parent's plan stood (`phases`, from `DataPlan.continuation`), so that with the
parent's mixture and batch its batches are the ones the parent would have trained on next.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from smelt.config import StageConfig, TokensConfig
from smelt.errors import ConfigError, UserError
from smelt.tokens.order import Interleave, Q, phase

EPOCH_WARNING = 4.0  # beyond ~4 epochs repeated data is worth little (Muennighoff et al.)


@dataclass
class Stage:
    index: int
    name: str
    first_step: int  # 1-based, inclusive
    last_step: int  # inclusive
    batch_size: int  # global sequences per step
    weights: dict[str, float]  # target share per source
    counts: dict[str, int]  # sequences per source in this stage
    offsets: dict[str, int]  # sequences of each source consumed before this stage
    interleave: Interleave = field(repr=False)

    @property
    def steps(self) -> int:
        return self.last_step - self.first_step + 1

    @property
    def sequences(self) -> int:
        return self.steps * self.batch_size

    @property
    def first_position(self) -> int:
        return (self.first_step - 1) * self.batch_size


@dataclass
class DataPlan:
    sources: list[str]  # every source of the split, sorted
    sequences: dict[str, int]  # windows of seq_len + 1 tokens per source (one epoch)
    tokens: dict[str, int]  # tokens per source
    seq_len: int
    batch_size: int
    steps: int
    stages: list[Stage]
    warnings: list[str]
    start: dict[str, int] = field(default_factory=dict)  # sequences per source read before step 1 (a fork)
    phases: tuple[dict[str, int], int] | None = None  # the first stage's interleave phases and scale (a fork)

    def stage_at(self, step: int) -> Stage:
        """The stage optimizer step `step` (1-based) belongs to."""
        if not 1 <= step <= self.steps:
            raise ValueError(f"step {step} is outside the plan's steps 1..{self.steps}")
        for stage in self.stages:
            if step <= stage.last_step:
                return stage
        raise AssertionError("stages do not cover the plan")

    def consumed(self, source: str) -> int:
        """Sequences of `source` the whole run takes."""
        return sum(stage.counts[source] for stage in self.stages)

    def epochs(self, source: str) -> float:
        """Epochs of `source` read by the end of the run, what a fork's parent read included."""
        n = self.sequences[source]
        return (self.start.get(source, 0) + self.consumed(source)) / n if n else 0.0

    @property
    def continued(self) -> dict[str, int]:
        """The sources a fork continues from its parent's cursor (start > 0)."""
        return {s: n for s, n in self.start.items() if n}

    def continuation(self, step: int) -> tuple[dict[str, int], int]:
        """Interleave phases (per source, and their scale) that continue this plan after `step` steps: the
        first stage of a fork from there orders its sources as this plan would have gone on (exactly,
        while the fork's counts are proportional to the stage's). After the last step, the last stage
        goes on."""
        stage = self.stage_at(min(step + 1, self.steps))
        position = step * self.batch_size - stage.first_position
        phases, scale = stage.interleave.continuation(position)
        return {s: a for s, a in zip(self.sources, phases, strict=True) if a is not None}, scale

    def state(self) -> dict[str, Any]:
        """What a fork's plan holds beyond its keys (where it starts, its first stage's phases): in the
        summary, the fingerprint and the loader state, so a resume or a rebuild checks them."""
        out: dict[str, Any] = {"start": self.continued} if self.continued else {}
        if self.phases is not None:
            out["phases"] = {"values": self.phases[0], "scale": self.phases[1]}
        return out

    def summary(self) -> dict[str, Any]:
        """The plan as JSON (for metrics.jsonl and the state's fingerprint)."""
        return {
            "seq_len": self.seq_len,
            "batch_size": self.batch_size,
            "steps": self.steps,
            "sources": {
                s: {
                    "tokens": self.tokens[s],
                    "sequences": self.sequences[s],
                    "consumed": self.consumed(s),
                    "epochs": round(self.epochs(s), 4),
                }
                for s in self.sources
            },
            "stages": [
                {
                    "name": st.name,
                    "first_step": st.first_step,
                    "last_step": st.last_step,
                    "tokens": st.sequences * self.seq_len,
                    "weights": {s: round(w, 6) for s, w in st.weights.items()},
                    "counts": st.counts,
                }
                for st in self.stages
            ],
            **self.state(),  # only a fork that continues its parent's data has one (and another fingerprint)
        }

    def fingerprint(self) -> str:
        blob = json.dumps(self.summary(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def table(self) -> str:
        """The plan as a text table: per stage and source, weight, tokens, sequences, epochs so far."""
        total = self.steps * self.batch_size * self.seq_len
        lines = [
            f"data plan: {len(self.sources)} source(s), {len(self.stages)} stage(s); {self.steps:,} steps x "
            f"{self.batch_size:,} sequences x {self.seq_len:,} tokens = {total:,} tokens; no padding "
            f"(documents packed end to end, EOS-separated)",
            f"{'stage':<12} {'steps':>17} {'source':<14} {'weight':>7} {'tokens':>15} {'sequences':>12} "
            f"{'epochs so far':>13}",
        ]
        if self.continued:
            lines.insert(1, "continues the parent's data (train.fork_data = 'continue'): " + ", ".join(
                f"{s} from sequence {n:,} ({n / self.sequences[s]:.2f} epochs read)"
                for s, n in self.continued.items()
            ) + "; any other source from its beginning")  # fmt: skip
        for st in self.stages:
            steps = f"{st.first_step:,}-{st.last_step:,}"
            for s in self.sources:
                if not st.counts[s]:
                    continue
                n = self.sequences[s]
                epochs = (st.offsets[s] + st.counts[s]) / n if n else 0.0
                lines.append(
                    f"{st.name:<12} {steps:>17} {s:<14} {st.weights[s]:>7.3f} "
                    f"{st.counts[s] * self.seq_len:>15,} {st.counts[s]:>12,} {epochs:>13.2f}"
                )
                steps = ""
        lines.append(f"{'source':<14} {'tokens':>15} {'used':>15} {'epochs':>7}")
        for s in self.sources:
            used = self.consumed(s) * self.seq_len
            lines.append(f"{s:<14} {self.tokens[s]:>15,} {used:>15,} {self.epochs(s):>7.2f}")
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)


def sequences_of(tokens: int, seq_len: int) -> int:
    """Windows of seq_len + 1 tokens at stride seq_len that fit in a stream of `tokens` tokens."""
    return max(0, (tokens - 1) // seq_len)


def _weights(
    key: str, given: dict[str, Any], sources: list[str], sequences: dict[str, int], epochs: bool = False
) -> dict[str, float]:
    unknown = sorted(set(given) - set(sources))
    if unknown:
        raise UserError(
            f"{key} names source(s) {', '.join(map(repr, unknown))} that the token shards do not have; the "
            f"sources present are {', '.join(sources)}. Fix the names in {key} (or tokenize those sources)."
        )
    raw = {}
    for name in sources:
        value = given.get(name, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{key}.{name} = {value!r} must be a number; give each source a number >= 0.")
        if value < 0:
            raise ConfigError(f"{key}.{name} = {value} is negative; weights and epochs must be >= 0.")
        raw[name] = float(value) * (sequences[name] if epochs else 1.0)
    total = sum(raw.values())
    if total <= 0:
        raise ConfigError(f"{key} gives every source weight 0; give at least one source a positive value.")
    return {name: value / total for name, value in raw.items()}


def _split_counts(weights: dict[str, float], total: int) -> dict[str, int]:
    """Largest-remainder rounding of weights x total: integer counts that sum to total exactly."""
    exact = {s: w * total for s, w in weights.items()}
    counts = {s: math.floor(v) for s, v in exact.items()}
    short = total - sum(counts.values())
    by_remainder = sorted(exact, key=lambda s: (-(exact[s] - counts[s]), s))
    for s in by_remainder[:short]:
        counts[s] += 1
    return counts


def _stage_steps(stages: list[StageConfig], train_tokens: int, batch_tokens: int, steps: int) -> list[int]:
    """Each stage's last step: at the step nearest its cumulative token budget (the last at `steps`)."""
    shares = []
    for i, st in enumerate(stages):
        if (st.tokens > 0) == (st.fraction > 0):
            raise ConfigError(
                f"tokens.stages[{i}] ({st.name or f'stage{i}'}) must set exactly one of tokens and fraction "
                f"(it has tokens = {st.tokens}, fraction = {st.fraction})."
            )
        shares.append(st.tokens / train_tokens if st.tokens else st.fraction)
    if abs(sum(shares) - 1.0) > 1e-6:
        raise ConfigError(
            f"tokens.stages budgets add up to {sum(shares) * train_tokens:,.0f} tokens, "
            f"{sum(shares):.4f} of train.tokens = {train_tokens:,}; make the fractions sum to 1 or the tokens "
            f"sum to train.tokens."
        )
    ends, running = [], 0.0
    for share in shares[:-1]:
        running += share
        ends.append(min(steps, round(running * train_tokens / batch_tokens)))
    ends.append(steps)
    previous = 0
    for i, end in enumerate(ends):
        if end <= previous:
            name = stages[i].name or f"stage{i}"
            raise ConfigError(
                f"tokens.stages[{i}] ({name}) gets no optimizer step: stage boundaries fall on whole steps of "
                f"train.batch_tokens = {batch_tokens:,} tokens. Give it more tokens or raise train.tokens."
            )
        previous = end
    return ends


def build_plan(
    cfg: TokensConfig,
    source_tokens: dict[str, int],
    seq_len: int,
    batch_size: int,
    steps: int,
    seed: int,
    train_tokens: int | None = None,
    start: dict[str, int] | None = None,
    phases: tuple[dict[str, int], int] | None = None,
) -> DataPlan:
    """The data plan of a run: stages, per-source weights and sequence counts; checks every key.

    `source_tokens`: tokens per source of the split; `batch_size`: global sequences per step;
    `train_tokens`: the budget the stage fractions refer to (default: steps x batch x seq_len);
    `start`: sequences of each source read before step 1 (a fork continuing its parent's data);
    `phases`: the first stage's interleave phases and scale (from the parent's `continuation`; a source
    without one gets its seeded phase).
    Raises UserError/ConfigError naming the key and the fix for every inconsistency.
    """
    if seq_len < 1 or batch_size < 1 or steps < 1:
        raise ValueError(
            f"seq_len ({seq_len}), batch_size ({batch_size}) and steps ({steps}) must be positive"
        )
    sources = sorted(source_tokens)
    if not sources:
        raise UserError("the split has no token sources; run `smelt tokenize CONFIG` first.")
    sequences = {s: sequences_of(source_tokens[s], seq_len) for s in sources}
    if not any(sequences.values()):
        raise UserError(
            f"the split has {sum(source_tokens.values()):,} tokens in {len(sources)} source(s), too few for one "
            f"sequence of train.seq_len + 1 = {seq_len + 1:,} tokens from any source; lower train.seq_len or "
            f"add data."
        )
    batch_tokens = batch_size * seq_len
    train_tokens = train_tokens or steps * batch_tokens
    if cfg.mixture and cfg.epochs:
        raise ConfigError(
            "tokens.mixture and tokens.epochs are both set; give the mixture one way: weights in "
            "tokens.mixture or epoch multipliers in tokens.epochs."
        )
    if cfg.mixture:
        default = _weights("tokens.mixture", cfg.mixture, sources, sequences)
    elif cfg.epochs:
        default = _weights("tokens.epochs", cfg.epochs, sources, sequences, epochs=True)
    else:
        default = _weights(
            "natural proportions", dict.fromkeys(sources, 1.0), sources, sequences, epochs=True
        )
    configs = cfg.stages or [StageConfig(name="main", fraction=1.0)]
    ends = _stage_steps(configs, train_tokens, batch_tokens, steps)
    names = [st.name or f"stage{i}" for i, st in enumerate(configs)]
    if len(set(names)) != len(names):
        raise ConfigError(f"tokens.stages names repeat ({', '.join(names)}); give each stage its own name.")

    stages: list[Stage] = []
    start = {s: int((start or {}).get(s, 0)) for s in sources}
    continued: tuple[dict[str, int], int] | None = None
    if phases is not None:
        values, scale = phases
        if any(s not in values for s in sources):  # seeded phases (scale Q) and continued ones on one scale
            values = {s: values[s] * Q if s in values else phase(seed, 0, s) * scale for s in sources}
            scale *= Q
        continued = {s: int(values[s]) for s in sources}, int(scale)
    consumed = dict(start)
    first = 1
    for i, (st, last) in enumerate(zip(configs, ends, strict=True)):
        weights = (
            _weights(f"tokens.stages[{i}].mixture", st.mixture, sources, sequences) if st.mixture else default
        )
        counts = _split_counts(weights, (last - first + 1) * batch_size)
        if i == 0 and continued is not None:
            interleave = Interleave(
                [counts[s] for s in sources], [continued[0][s] for s in sources], continued[1]
            )
        else:
            interleave = Interleave([counts[s] for s in sources], [phase(seed, i, s) for s in sources])
        stages.append(
            Stage(i, names[i], first, last, batch_size, weights, counts, dict(consumed), interleave)
        )
        for s in sources:
            consumed[s] += counts[s]
        first = last + 1

    warnings = []
    for s in sources:
        if consumed[s] == start[s]:  # this run takes none of it
            continue
        if sequences[s] == 0:
            raise UserError(
                f"source {s!r} has {source_tokens[s]:,} tokens, fewer than one sequence of train.seq_len + 1 = "
                f"{seq_len + 1:,}; give it weight 0 in the mixture, lower train.seq_len or add data."
            )
        epochs = consumed[s] / sequences[s]
        if epochs > 1.0 and not cfg.allow_repeat:
            stage = next(st for st in stages if st.offsets[s] + st.counts[s] > sequences[s])
            parent = f" after the {start[s]:,} its parent read" if start[s] else ""
            restart = ", or set train.fork_data = 'restart' to read from the beginning" if start[s] else ""
            raise UserError(
                f"source {s!r} runs out in stage {stage.name!r}: the plan takes {consumed[s] - start[s]:,} "
                f"sequences of {seq_len} tokens{parent} ({epochs:.2f} epochs) but it has {sequences[s]:,}. Set "
                f"tokens.allow_repeat = true to repeat it, lower its weight, add data or lower train.tokens"
                f"{restart}."
            )
        if epochs > EPOCH_WARNING:
            warnings.append(
                f"source {s!r} is repeated {epochs:.1f} times (more than {EPOCH_WARNING:g} epochs adds little); "
                f"lower its weight or add data."
            )
    plan = DataPlan(sources, sequences, dict(source_tokens), seq_len, batch_size, steps, stages, warnings)
    plan.start, plan.phases = start, continued
    return plan


class MixtureMonitor:
    """The realized mixture per window of about `window` sequences, compared with the target.

    Windows close on a fixed grid (the first step at which the run has consumed another `window`
    sequences), so a resumed run reports the same windows as an uninterrupted one. Each window gives
    one `mixture` event; a source whose realized share is off its target by more than `tolerance`
    gives a `mixture_drift` alert as well.
    """

    def __init__(self, plan: DataPlan, window: int = 1000, tolerance: float = 0.015):
        self.plan = plan
        self.window = window
        self.tolerance = tolerance
        self.realized = dict.fromkeys(plan.sources, 0)
        self.target = dict.fromkeys(plan.sources, 0.0)
        self.first_step = 1

    def closes(self, step: int) -> bool:
        b = self.plan.batch_size
        return step == self.plan.steps or (step * b) // self.window > ((step - 1) * b) // self.window

    def update(self, step: int, counts: dict[str, int]) -> list[dict[str, Any]]:
        """Add step `step`'s global source counts; the events to log when a window closes."""
        weights = self.plan.stage_at(step).weights
        for s in self.plan.sources:
            self.realized[s] += counts.get(s, 0)
            self.target[s] += weights[s] * self.plan.batch_size
        if not self.closes(step):
            return []
        total = sum(self.realized.values())
        realized = {s: self.realized[s] / total for s in self.plan.sources}
        target = {s: self.target[s] / total for s in self.plan.sources}
        drift = {s: realized[s] - target[s] for s in self.plan.sources}
        worst = max(self.plan.sources, key=lambda s: abs(drift[s]))
        base = {"kind": "event", "step": step, "tokens": step * self.plan.batch_size * self.plan.seq_len}
        events = [
            {
                **base,
                "event": "mixture",
                "stage": self.plan.stage_at(step).name,
                "first_step": self.first_step,
                "window_sequences": total,
                "realized": {s: round(v, 6) for s, v in realized.items()},
                "target": {s: round(v, 6) for s, v in target.items()},
                "max_drift": round(abs(drift[worst]), 6),
            }
        ]
        if abs(drift[worst]) > self.tolerance:
            events.append(
                {
                    **base,
                    "event": "alert",
                    "alert": "mixture_drift",
                    "source": worst,
                    "realized": round(realized[worst], 6),
                    "target": round(target[worst], 6),
                    "tolerance": self.tolerance,
                    "message": f"source {worst!r} made up {realized[worst]:.1%} of steps "
                    f"{self.first_step}..{step} against a target of {target[worst]:.1%}",
                }
            )
        self.realized = dict.fromkeys(self.plan.sources, 0)
        self.target = dict.fromkeys(self.plan.sources, 0.0)
        self.first_step = step + 1
        return events

    def window_start(self, step: int) -> int:
        """The first step of the window that holds `step`."""
        first = step
        while first > 1 and not self.closes(first - 1):
            first -= 1
        return first

    def resume(self, step: int, counts: Callable[[int], dict[str, int]]) -> None:
        """Refill the window open at `step` with its earlier steps (their counts from `counts(step)`),
        so that a run resumed at `step` reports the same windows as an uninterrupted one."""
        self.first_step = self.window_start(step)
        for earlier in range(self.first_step, step):
            self.update(earlier, counts(earlier))
