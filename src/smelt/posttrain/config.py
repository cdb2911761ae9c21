"""The post-training config: one TOML file per stage (configs/posttrain/*.toml), read, typed and validated
by the pipeline config's engine (config/engine.py), with `--set section.key=value` overrides.

    stage = "sft"            # sft, dpo or grpo
    [run]   init_from (the parent checkpoint: RUN, RUN:STEP or a step directory), out, seed, device
    [data]  format and path of the training data, held-out items
    [optim] lr, steps, batch, schedule
    [dpo]   loss (dpo or simpo), beta, simpo_gamma
    [grpo]  group size, prompts per step, sampling, KL coefficient, reward plug-in
    [eval]  what `smelt posttrain eval` and the end of a stage measure
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

from smelt.config.engine import apply_override, build, read_toml
from smelt.config.fields import option
from smelt.errors import ConfigError

FORMATS = ("chat", "preferences", "gsm8k", "hh-rlhf", "addition")


@dataclass
class RunSection:
    init_from: str = option("", help="parent checkpoint: RUN, RUN:STEP, or a step_NNNNNNN directory")
    out: str = option("", help="the new run directory this stage writes")
    seed: int = option(0, range=(0, 2**63 - 1))
    device: str = option("auto", choices=("auto", "cpu", "cuda"))
    precision: str = option("fp32", choices=("auto", "bf16", "fp32"), help="autocast dtype of the matmuls")
    parallel: str = option(
        "fsdp", choices=("fsdp", "ddp"), help="under torchrun: FSDP2 shards the weights, DDP replicates them"
    )


@dataclass
class DataSection:
    format: str = option("chat", choices=FORMATS, help="how data.path is read")
    path: str = option("", help="JSONL (or .jsonl.gz) file; unused for the synthetic addition task")
    limit: int = option(0, range=(0, 10**9), help="read at most this many items (0: all)")
    heldout: int = option(
        64,
        range=(0, 10**7),
        help="items kept out of training for validation and eval (addition: distinct held-out problems)",
    )
    heldout_path: str = option(
        "",
        help="JSONL (or .jsonl.gz) of held-out items in data.format (e.g. a dataset's test split), used instead "
        "of holding out data.heldout items of data.path; data.heldout then caps how many (0: all)",
    )
    keep_calculations: bool = option(False, help="GSM8K: keep the <<48/2=24>> calculator annotations")
    addition_items: int = option(2000, range=(1, 10**7), help="addition: how many training items to draw")
    addition_digits: int = option(2, range=(1, 9), help="addition: digits per operand")


@dataclass
class OptimSection:
    lr: float = option(
        0.0, range=(0.0, 10.0), help="peak lr (0: by the stage and the model's width, config/size_rules.py)"
    )
    steps: int = option(100, range=(1, 10**9), help="optimizer steps")
    batch_size: int = option(8, range=(1, 10**6), help="rows (SFT), pairs (DPO) or prompts (GRPO) per step")
    seq_len: int = option(0, range=(0, 10**7), help="longest sequence (0: the parent's max_seq_len)")
    schedule: str = option("cosine", choices=("cosine", "constant", "wsd"))
    warmup_steps: int = option(0, range=(0, 10**9), help="linear warmup (0: 5% of the steps, at least 1)")
    min_lr_ratio: float = option(0.1, range=(0.0, 1.0))
    weight_decay: float = option(0.0, range=(0.0, 10.0))
    grad_clip: float = option(1.0, range=(0.0, 1e6))
    log_every: int = option(10, range=(1, 10**9))
    eval_every: int = option(0, range=(0, 10**9), help="validation every N steps (0: at the start and end)")
    checkpoint_every: int = option(
        50, range=(0, 10**9), help="a full, resumable checkpoint every N steps (0: at the end only)"
    )
    keep_last: int = option(2, range=(1, 10**6), help="checkpoints kept (older ones are deleted)")


@dataclass
class DPOSection:
    loss: str = option(
        "dpo", choices=("dpo", "simpo"), help="dpo (with a reference) or simpo (reference-free)"
    )
    beta: float = option(0.1, range=(0.0, 1e4), help="DPO: scale of the log-ratio margin")
    simpo_beta: float = option(2.0, range=(0.0, 1e4), help="SimPO: scale of the length-normalised margin")
    simpo_gamma: float = option(0.5, range=(0.0, 1e4), help="SimPO: target reward margin")


@dataclass
class GRPOSection:
    group_size: int = option(8, range=(2, 4096), help="completions sampled per prompt")
    max_new_tokens: int = option(32, range=(1, 10**6))
    temperature: float = option(1.0, range=(0.0, 100.0))
    top_k: int = option(0, range=(0, 10**7))
    kl_coef: float = option(0.04, range=(0.0, 1e4), help="weight of the KL to the reference")
    reward: str = option("exact_number", help="a registered reward name, or module:function")


@dataclass
class EvalSection:
    items: int = option(64, range=(0, 10**7), help="held-out items scored before and after (0: none)")
    max_new_tokens: int = option(64, range=(1, 10**6))
    few_shot: int = option(0, range=(0, 64), help="GSM8K few-shot prompt examples (0: the chat format only)")


@dataclass
class PostTrainConfig:
    stage: str = option("sft", choices=("sft", "dpo", "grpo"))
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    dpo: DPOSection = field(default_factory=DPOSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    eval: EvalSection = field(default_factory=EvalSection)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_posttrain_config(
    path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()
) -> PostTrainConfig:
    """Read a post-training TOML file (or defaults only), apply overrides, validate."""
    raw: dict[str, Any] = {}
    origin = "<defaults>"
    if path is not None:
        path, origin = Path(path), str(path)
        raw = read_toml(path, "Pass a post-training TOML file such as configs/posttrain/sft_gsm8k.toml.")
    if "stage" not in raw and any(key in raw for key in ("model", "train", "tokenizer", "tokens")):
        raise ConfigError(
            f"{origin} is a pipeline config (it has [model] or [train]); run it with `smelt run`. A "
            f'post-training config names its stage (stage = "sft", "dpo" or "grpo"), as in '
            f"configs/posttrain/sft_gsm8k.toml."
        )
    for item in overrides:
        if "=" in item and "." not in item.split("=", 1)[0]:  # a top-level key: stage=dpo
            key, text = item.split("=", 1)
            raw[key.strip()] = tomllib.loads(f"v = {text}")["v"] if text[:1] in "\"'" else text
        else:
            apply_override(raw, item)
    return build(PostTrainConfig, raw, "", origin)


def config_from_dict(raw: dict[str, Any]) -> PostTrainConfig:
    return build(PostTrainConfig, json.loads(json.dumps(raw)), "", "<dict>")
