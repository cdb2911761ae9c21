"""Defaults that follow the model's size: where a config leaves `train.lr`, `model.init_std`,
`train.batch_tokens` or `train.warmup_tokens` unset, each comes from one rule of the field's experience
(docs/distributed.md, "Defaults that follow the model's size"), and a value set far from its rule is
named in a warning.

| key | rule | gives |
|---|---|---|
| train.lr | 3e-3 x min(1, 256 / d_model) | 3e-3 up to d 256 (small-5m's measured value), 1e-3 at 768, 3.75e-4 at 2048, 1.9e-4 at 4096, 9.4e-5 at 8192 |
| model.init_std | 0.02 x min(1, sqrt(2048 / d_model)) | 0.02 up to d 2048, 0.014 at 4096, 0.01 at 8192 (residual projections keep their 1/sqrt(2L)) |
| train.batch_tokens | below 100M non-embedding parameters: one micro batch per rank (0); else 2^19 x sqrt(N / 1e9) to the nearest power of two, 128K to 4M | 0.5M at 1B, 2M at 7-13B, 4M at 30B and beyond |
| train.warmup_tokens | 2% of train.tokens, at least 1,000 steps where those are at most 10% of the run | 2% on short runs; 1,000 steps on long runs at scale |
| train.weight_decay | 0.1 at every size (decoupled: the decay per step is lr x 0.1, so it shrinks with lr) | |
| train.muon_lr | 0.02 at every size (Muon's updates are orthogonalised and scaled by the matrix's shape) | |

The field's reference points: lr 6e-4 at 125M, 3e-4 at 1.3B, 2e-4 at 7B, 1.5e-4 at 13B, 0.6-1e-4 at 70B
(roughly 1/d); init std proportional to d^-0.5 above d about 2048; batch 0.5M tokens at 1B, 1-2M at 7B,
2-4M at 13-34B, at least 4M at 70B; warmup 0.5-2% of tokens with a floor of about 1k steps at scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

SMALL_LR, SMALL_WIDTH = 3e-3, 256
INIT_STD, INIT_WIDTH = 0.02, 2048
WARN_FACTOR = 3.0

RULES = {
    "train.lr": "3e-3 x min(1, 256 / d_model)",
    "model.init_std": "0.02 x min(1, sqrt(2048 / d_model))",
    "train.batch_tokens": "2^19 x sqrt(N / 1e9) tokens to a power of two in [128K, 4M]; "
    "0, one micro batch per rank, below N = 100M non-embedding parameters",
    "train.warmup_tokens": "2% of train.tokens, at least 1,000 steps where that is at most 10% of the run",
}


def rule_lr(d_model: int) -> float:
    return SMALL_LR * min(1.0, SMALL_WIDTH / d_model)


# Post-training's peak lr as a fraction of the pretraining rule: SFT 1.25e-5 at d 4096 (the field's 1-2e-5 at
# 7B), DPO 4.7e-7 (5e-7 to 1e-6 at scale, 2e-7 at 70B), GRPO 9.4e-7 (about 1e-6 at 7B).
POSTTRAIN_LR_DIVISOR = {"sft": 15.0, "dpo": 400.0, "grpo": 200.0}


def rule_posttrain_lr(stage: str, d_model: int) -> float:
    return rule_lr(d_model) / POSTTRAIN_LR_DIVISOR[stage]


def posttrain_lr_rule(stage: str) -> str:
    return f"{RULES['train.lr']} / {POSTTRAIN_LR_DIVISOR[stage]:g} ({stage})"


def rule_init_std(d_model: int) -> float:
    return INIT_STD * min(1.0, math.sqrt(INIT_WIDTH / d_model))


def rule_batch_tokens(non_embedding_params: float) -> int:
    if non_embedding_params < 1e8:
        return 0
    tokens = 2**19 * math.sqrt(non_embedding_params / 1e9)
    return 2 ** min(22, max(17, round(math.log2(tokens))))


def rule_warmup_tokens(tokens: int, batch_tokens: int) -> int:
    """0 keeps the schedule's own default (2% of tokens); a value where the 1,000-step floor applies."""
    floor = 1000 * batch_tokens
    if batch_tokens and floor > 0.02 * tokens and floor <= 0.1 * tokens:
        return floor
    return 0


def non_embedding_params(model: Any) -> float:
    """12 L d^2 (attention and a SwiGLU MLP of about 8/3 d), enough for a rule of thumb."""
    return 12.0 * model.n_layers * model.d_model**2


@dataclass(frozen=True)
class SizedValue:
    key: str
    value: float
    source: str  # "config" (set in the file or --set), "preset", or "rule"
    rule_value: float

    @property
    def far_from_rule(self) -> bool:
        if self.source == "rule" or not self.value or not self.rule_value:
            return False
        ratio = self.value / self.rule_value
        return ratio > WARN_FACTOR or ratio < 1 / WARN_FACTOR

    def describe(self) -> str:
        where = f"rule: {RULES[self.key]}" if self.source == "rule" else f"set in the {self.source}"
        far = f"; the rule gives {show(self.key, self.rule_value)}" if self.source != "rule" else ""
        return f"{show(self.key, self.value)} ({where}{far})"

    def warning(self) -> str:
        return (f"{self.key} = {show(self.key, self.value)} is more than {WARN_FACTOR:g}x from its size "
                f"rule's {show(self.key, self.rule_value)} ({RULES[self.key]}; docs/distributed.md, 'Defaults that follow the "
                f"model's size'). Keep it if you measured it.")  # fmt: skip


def show(key: str, value: float) -> str:
    return f"{int(value):,}" if key.endswith("_tokens") else f"{value:.3g}"


def apply_size_rules(cfg: Any, given: set[str], preset_keys: set[str]) -> list[SizedValue]:
    """Fill the unset keys of `cfg` from their rules; return every sized key with its source.

    `given`: the dotted keys the config file or --set gave; `preset_keys`: those a model preset gave.
    """
    model, train = cfg.model, cfg.train
    sized: list[SizedValue] = []

    def settle(key: str, current: float, rule: float, assign: Any) -> None:
        source = "config" if key in given else "preset" if key in preset_keys else "rule"
        if source == "rule":
            assign(rule)
            current = rule
        sized.append(SizedValue(key, current, source, rule))

    settle("train.lr", train.lr, rule_lr(model.d_model), lambda v: setattr(train, "lr", v))
    settle(
        "model.init_std",
        model.init_std,
        rule_init_std(model.d_model),
        lambda v: setattr(model, "init_std", v),
    )
    batch = rule_batch_tokens(non_embedding_params(model))
    settle("train.batch_tokens", train.batch_tokens, batch, lambda v: setattr(train, "batch_tokens", int(v)))
    warmup = rule_warmup_tokens(train.tokens, train.batch_tokens)
    settle(
        "train.warmup_tokens", train.warmup_tokens, warmup, lambda v: setattr(train, "warmup_tokens", int(v))
    )
    return sized
