"""Typed pipeline configuration: TOML files, `--set a.b=c` overrides, validation with helpful errors.

A pipeline is one TOML file with the sections `[run]`, `[data]`, `[tokenizer]`, `[tokens]`,
`[model]`, `[train]`, `[checkpoint]` and `[eval]`. Every section is a dataclass (those of `[data]` are
in `smelt.config.data`); field metadata carries the allowed range or choices, so that an out-of-range
value names the range and an unknown key names the closest valid key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from smelt.config.data import (  # noqa: F401  (smelt.config is where every section is imported from)
    C4Config,
    CodeFilterConfig,
    DataConfig,
    DecontamConfig,
    EvalSetConfig,
    FineWebConfig,
    GopherQualityConfig,
    GopherRepetitionConfig,
    LangIdConfig,
    LineDedupConfig,
    NearDedupConfig,
    PiiConfig,
    QualityConfig,
    SourceConfig,
    UrlFilterConfig,
)
from smelt.config.engine import apply_override, build, read_toml, suggest
from smelt.config.engine import describe as engine_describe
from smelt.config.fields import option
from smelt.config.moe import check_expert_parallel, check_moe
from smelt.config.presets import MODEL_PRESETS
from smelt.config.size_rules import SizedValue, apply_size_rules
from smelt.config.train import TrainConfig  # noqa: F401  (every section is imported from smelt.config)
from smelt.errors import ConfigError


@dataclass
class RunConfig:
    name: str = option("run", help="run directory name under `dir`")
    dir: str = option("runs", help="parent directory of run directories")
    seed: int = option(1337, range=(0, 2**32 - 1), help="seed every stage derives its randomness from")


@dataclass
class TokenizerConfig:
    vocab_size: int = option(8192, range=(1, 1_048_576), help="BPE vocabulary incl. special tokens")
    pad_to_multiple: int = option(128, range=(1, 4096), help="embedding rows padded to a multiple of this")
    special_tokens: list[str] = option(
        ["<|bos|>", "<|eos|>", "<|pad|>"], help="special tokens; the first three are bos, eos, pad"
    )
    sample_bytes: int = option(50_000_000, range=(1_000, 10**13), help="training-sample byte budget")
    min_frequency: int = option(2, range=(1, 10**9), help="minimum pair count for a merge")
    pattern: str = option("gpt4", help="pre-tokenization regex: `gpt4`, `gpt2`, or a regex")
    fim_tokens: bool = option(True, help="add <|fim_prefix|>, <|fim_middle|>, <|fim_suffix|> special tokens")
    chat_tokens: bool = option(
        True, help="add chat-role special tokens (<|system|>, <|user|>, <|assistant|>, ...)"
    )
    spare_tokens: int = option(64, range=(0, 1_000_000), help="reserved special tokens kept free (at least)")
    source_alpha: float = option(
        1.0, range=(0.0, 1.0), help="sample temperature on source sizes (1: proportional, 0: uniform)"
    )
    lang_alpha: float = option(
        0.3, range=(0.0, 1.0), help="sample temperature on language sizes within a source (lang column)"
    )
    source_weights: dict = option({}, help="extra sample weight per source name (default 1)")
    lang_weights: dict = option({}, help="extra sample weight per language code (default 1)")


@dataclass
class StageConfig:
    name: str = option("", help="stage name for logs and metrics (empty: stage<N>)")
    tokens: int = option(0, range=(0, 10**15), help="this stage's training tokens (or set fraction)")
    fraction: float = option(0.0, range=(0.0, 1.0), help="this stage's share of train.tokens (or set tokens)")
    mixture: dict = option({}, help="source weights in this stage (empty: tokens.mixture / tokens.epochs)")


# The [tokens] keys that decide the shards (tokenize) and the ones that only decide the loader (train).
SHARD_KEYS = ("shard_tokens", "bos")


@dataclass
class TokensConfig:
    shard_tokens: int = option(100_000_000, range=(1_000, 10**11), help="tokens per shard file")
    batch_docs: int = option(1024, range=(1, 10**7), help="documents encoded per batch")
    batch_bytes: int = option(
        2_000_000, range=(1, 10**10), help="text bytes per batch at most (keeps the encoding processes even)"
    )
    workers: int = option(
        0, range=(0, 1024), help="encoding processes (0: one per CPU core, one per 32 MB of text at most)"
    )
    executor: str = option(
        "pool", choices=("pool", "ray"), help="where batches are encoded: `pool` (local processes) or `ray`"
    )
    ray_address: str = option(
        "", help="executor ray: empty starts a local Ray; `auto` or ray://HOST:10001 joins a running cluster"
    )
    retries: int = option(
        3, range=(0, 100), help="times a batch whose worker process (or Ray node) died is encoded again"
    )
    bos: bool = option(False, help="also put BOS before each document (EOS always follows it)")
    mixture: dict = option({}, help="weight per source, normalized (empty: natural proportions by tokens)")
    epochs: dict = option({}, help="epoch multiplier per source, e.g. {wiki = 6.0} (instead of mixture)")
    allow_repeat: bool = option(False, help="let a source run past one epoch (otherwise an error)")
    stages: list[StageConfig] = option([], help="[[tokens.stages]] curriculum (empty: one stage)")
    fim_rate: float = option(0.0, range=(0.0, 1.0), help="share of code documents turned fill-in-the-middle")
    fim_spm_rate: float = option(0.5, range=(0.0, 1.0), help="share of FIM documents in SPM (else PSM) order")
    fim_sources: list[str] = option([], help="sources that get FIM (empty: data.sources with code = true)")
    mixture_window: int = option(1000, range=(1, 10**9), help="sequences per realized-mixture metric")
    drift_tolerance: float = option(
        0.015, range=(0.0, 1.0), help="realized-minus-target share that raises a mixture_drift alert"
    )
    prefetch: int = option(2, range=(0, 1024), help="steps the loader prepares ahead in a thread (0: none)")

    def shard_settings(self) -> dict[str, Any]:
        """The keys the token shards depend on: the tokenize stage's cache key."""
        return {key: getattr(self, key) for key in SHARD_KEYS}

    def loader_settings(self) -> dict[str, Any]:
        """The keys only the training loader reads: part of the train stage's cache key."""
        skip = {*SHARD_KEYS, "batch_docs", "batch_bytes", "workers", "executor", "ray_address", "retries"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class ModelConfig:
    preset: str = option("", help="named shape; any key below overrides it")
    d_model: int = option(256, range=(8, 65536))
    n_layers: int = option(4, range=(1, 1024))
    n_heads: int = option(4, range=(1, 1024))
    n_kv_heads: int = option(0, range=(0, 1024), help="key/value heads for GQA (0: n_heads)")
    head_dim: int = option(0, range=(0, 4096), help="query/key/value dims per head (0: d_model / n_heads)")
    d_ff: int = option(0, range=(0, 10**6), help="MLP hidden size (0: SwiGLU 8/3 d rounded, ReLU² 4 d)")
    mlp: str = option(
        "swiglu",
        choices=("swiglu", "relu2"),
        help="dense MLP: swiglu (Llama) or relu2 (down(relu(up(x))^2), modded-nanogpt / nanochat)",
    )
    value_embeddings: bool = option(
        False,
        help="nanochat's value embeddings: every other layer, ending with the last, adds a token-indexed "
        "table to its values, gated per key/value head",
    )
    rope_theta: float = option(10_000.0, range=(1.0, 1e9))
    rope_scaling: str = option(
        "none",
        choices=("none", "linear", "ntk", "yarn"),
        help="RoPE scaling for a longer context: linear (position interpolation), ntk (base change), yarn",
    )
    rope_factor: float = option(
        1.0, range=(1.0, 1e6), help="context multiple the scaling is for (new length / trained length)"
    )
    rope_original_max_seq_len: int = option(
        0, range=(0, 10**7), help="yarn: the sequence length trained at before the extension"
    )
    yarn_beta_fast: float = option(32.0, range=(0.0, 1e6), help="yarn: pairs turning more often are kept")
    yarn_beta_slow: float = option(
        1.0, range=(0.0, 1e6), help="yarn: pairs turning less often are interpolated"
    )
    norm_eps: float = option(1e-5, range=(1e-12, 1e-1))
    qk_norm: bool = option(False, help="RMSNorm on queries and keys per head")
    tie_embeddings: bool = option(True)
    init_std: float = option(0.02, range=(1e-6, 1.0))
    max_seq_len: int = option(1024, range=(8, 10**7))
    rope_fraction: float = option(
        1.0, range=(0.0, 1.0), help="share of each head's dims that RoPE rotates (0: no RoPE anywhere)"
    )
    nope_every: int = option(0, range=(0, 1024), help="every k-th layer (k, 2k, ...) uses no RoPE (0: none)")
    z_loss: float = option(0.0, range=(0.0, 1.0), help="z-loss coefficient on log^2 Z (0: off; 1e-4 typical)")
    head_init_std: float = option(
        0.0,
        range=(0.0, 1.0),
        help="LM head init std, also the tied embedding's (0: tied min(init_std, 0.32/sqrt(d)), untied min(init_std, 1/d))",
    )
    activation_checkpointing: bool = option(False, help="recompute each block in the backward pass")
    attention: str = option(
        "auto",
        choices=("auto", "sdpa", "flex"),
        help="document-masked attention kernel: flex (BlockMask), sdpa (dense mask); auto: flex on CUDA",
    )
    # Mixture of experts (docs/moe.md; checked by smelt.config.moe.check_moe).
    moe_experts: int = option(0, range=(0, 4096), help="routed experts per MoE layer (0: dense model)")
    moe_top_k: int = option(2, range=(1, 4096), help="experts each token is routed to")
    moe_d_ff: int = option(0, range=(0, 10**6), help="hidden size of each expert (0: the dense d_ff)")
    moe_every: int = option(1, range=(1, 1024), help="every k-th layer is MoE (1: all); the rest dense")
    moe_first_dense: int = option(0, range=(0, 1024), help="the first k layers stay dense")
    moe_shared_experts: int = option(0, range=(0, 64), help="always-on experts of moe_d_ff each")
    moe_gate: str = option("softmax", choices=("softmax", "sigmoid"), help="router scores")
    moe_norm_topk: bool = option(True, help="renormalize the top-k gate weights to sum to 1")
    moe_capacity_factor: float = option(
        0.0, range=(0.0, 64.0), help="tokens per expert at most, x (tokens * top_k / experts); 0: dropless"
    )
    moe_aux_loss: float = option(0.01, range=(0.0, 10.0), help="load-balancing loss coefficient")
    moe_z_loss: float = option(0.001, range=(0.0, 10.0), help="router z-loss coefficient")
    moe_bias_rate: float = option(
        0.0, range=(0.0, 1.0), help="auxiliary-loss-free balancing: expert bias step per update (0: off)"
    )


@dataclass
class CheckpointConfig:
    every_steps: int = option(0, range=(0, 10**9), help="steps between checkpoints (0: final only)")
    keep_last: int = option(2, range=(1, 10**6), help="checkpoints kept besides the final one")
    async_save: bool = option(True, help="snapshot to host memory, write in the background")
    milestone_every_steps: int = option(0, range=(0, 10**9), help="keep every N-th step's checkpoint forever")
    milestone_every_tokens: int = option(
        0, range=(0, 10**18), help="keep a checkpoint every X tokens forever"
    )
    mtbf_hours: float = option(
        0.0, range=(0.0, 1e7),
        help="mean time between failures of the whole job, for the Young-Daly interval advice (0: none)",
    )  # fmt: skip


@dataclass
class EvalConfig:
    max_bytes: int = option(0, range=(0, 10**13), help="held-out bytes to score (0: all)")
    batch_size: int = option(8, range=(1, 10**5))
    prompts: list[str] = option(["def ", "import ", "class "], help="fixed prompts for samples")
    max_new_tokens: int = option(48, range=(1, 10**6))
    temperature: float = option(0.8, range=(0.0, 100.0), help="0: greedy")
    top_k: int = option(40, range=(0, 10**7), help="0: no top-k cut")
    tasks: list[str] = option(
        ["arc_easy", "hellaswag", "copa", "winogrande", "lambada"],
        help="benchmark tasks scored at each checkpoint (see docs/evaluation.md; [] : held-out loss only)",
    )
    tasks_dir: str = option(
        "", help="benchmark files (empty: $SMELT_SHARED_DATA/eval or ../shared/data/eval)"
    )
    limit: int = option(60, range=(0, 10**9), help="items per task, a fixed seeded subset (0: all)")
    shots: int = option(-1, range=(-1, 100), help="few-shot examples per prompt (-1: each task's default)")
    overlong: str = option(
        "skip", choices=("error", "skip"), help="an item longer than the context: skip and count it, or stop"
    )
    gallery_tokens: int = option(
        48, range=(0, 10**6), help="greedy tokens per gallery prompt (0: no gallery)"
    )
    every_steps: int = option(0, range=(0, 10**9), help="in-loop task evaluation every N steps (0: off)")
    inloop_items: int = option(100, range=(1, 10**9), help="items per task scored in the loop")
    inloop_tasks: list[str] = option(
        [], help="tasks scored in the loop (empty: `tasks` minus generative ones)"
    )
    convention: str = option(
        "lm-eval",
        choices=("lm-eval", "eos"),
        help="prompt tokens: lm-eval (no prefix token unless the context is empty) or eos (one EOS first)",
    )
    contamination_tasks: list[str] = option(
        [], help="tasks the contamination meter checks (empty: `tasks` but passkey; docs/evaluation.md)"
    )
    contamination_items: int = option(100, range=(2, 10**9), help="items per task the meter scores")
    contamination_k: float = option(
        4.0, range=(0.0, 1000.0), help="flag a task whose paired t statistic is below -k"
    )
    contamination_inloop: bool = option(False, help="run the contamination meter at every checkpoint")


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    tokens: TokensConfig = field(default_factory=TokensConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # The size-ruled keys with where each value came from (config_from_dict sets it); not a config key,
    # so not in the saved config or its hash.
    sized: ClassVar[list[SizedValue]] = []

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def section_hash(self, *sections: str) -> str:
        return hash_json({name: dataclasses.asdict(getattr(self, name)) for name in sections})


def hash_json(value: Any) -> str:
    """sha256 of the canonical JSON of a value: the hash of a resolved config."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Loading and validation


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a TOML file (or only defaults when `path` is None), apply `a.b=c` overrides, validate."""
    raw: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        raw = read_toml(path, "Pass the path of a TOML pipeline file, for example configs/quickstart.toml.")
    for item in overrides:
        apply_override(raw, item)
    return config_from_dict(raw, origin=str(path) if path else "<defaults>")


def config_from_dict(raw: dict[str, Any], origin: str = "<dict>") -> Config:
    raw = json.loads(json.dumps(raw))  # deep copy; TOML values are JSON values
    given = {
        f"{section}.{key}" for section, values in raw.items() if isinstance(values, dict) for key in values
    }
    preset_keys: set[str] = set()
    model = raw.get("model")
    if isinstance(model, dict) and model.get("preset"):
        name = model["preset"]
        if name not in MODEL_PRESETS:
            raise ConfigError(
                f"{origin}: model.preset = {name!r} is not a known preset{suggest(name, MODEL_PRESETS)}. "
                f"Known presets: {', '.join(MODEL_PRESETS)}."
            )
        raw["model"] = {**MODEL_PRESETS[name], **model}
        preset_keys = {f"model.{key}" for key in MODEL_PRESETS[name]}
    cfg = build(Config, raw, "", origin)
    # Unset lr, init_std, batch_tokens and warmup_tokens follow the model's size (size_rules.py).
    cfg.sized = apply_size_rules(cfg, given, preset_keys)
    _check_cross_fields(cfg, origin)
    return cfg


def _check_cross_fields(cfg: Config, origin: str) -> None:
    m = cfg.model
    kv = m.n_kv_heads or m.n_heads
    if m.d_model % m.n_heads and not m.head_dim:
        raise ConfigError(
            f"{origin}: model.d_model ({m.d_model}) must be divisible by model.n_heads ({m.n_heads})."
        )
    if m.n_heads % kv:
        raise ConfigError(
            f"{origin}: model.n_heads ({m.n_heads}) must be a multiple of model.n_kv_heads ({kv}) for GQA."
        )
    if (m.head_dim or m.d_model // m.n_heads) % 2:
        raise ConfigError(f"{origin}: the head dimension d_model / n_heads must be even for RoPE.")
    _check_rope_scaling(m, origin)
    if m.mlp == "relu2" and m.moe_experts:
        raise ConfigError(
            f"{origin}: model.mlp = 'relu2' is for dense models; MoE experts (model.moe_experts = "
            f"{m.moe_experts}) are SwiGLU. Set model.mlp = 'swiglu' or model.moe_experts = 0."
        )
    check_moe(m, origin)
    check_expert_parallel(m, cfg.train.expert_parallel, cfg.train.parallel, origin)
    if cfg.train.seq_len > m.max_seq_len:
        raise ConfigError(
            f"{origin}: train.seq_len ({cfg.train.seq_len}) exceeds model.max_seq_len ({m.max_seq_len}); "
            f"raise model.max_seq_len or lower train.seq_len."
        )
    if cfg.data.min_chars > cfg.data.max_chars:
        raise ConfigError(f"{origin}: data.min_chars ({cfg.data.min_chars}) exceeds data.max_chars.")
    names = [s.name for s in cfg.data.sources]
    for i, source in enumerate(cfg.data.sources):
        if not source.name:
            raise ConfigError(f"{origin}: data.sources[{i}].name is empty; give every source a name.")
        if not source.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(
                f"{origin}: data.sources[{i}].name = {source.name!r} must use letters, digits, - and _ only "
                f"(it becomes a directory name)."
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"{origin}: data.sources names must be unique; repeated: {', '.join(dupes)}.")
    t = cfg.tokenizer
    if len(t.special_tokens) < 3:
        raise ConfigError(f"{origin}: tokenizer.special_tokens needs at least bos, eos and pad.")
    if len(set(t.special_tokens)) != len(t.special_tokens):
        raise ConfigError(f"{origin}: tokenizer.special_tokens repeats a token; list each once.")
    specials = len(t.special_tokens) + 3 * t.fim_tokens + 5 * t.chat_tokens + t.spare_tokens
    smallest = 256 + specials
    if t.vocab_size < smallest:
        raise ConfigError(
            f"{origin}: tokenizer.vocab_size = {t.vocab_size} is too small: a byte-level BPE needs 256 byte "
            f"tokens plus {specials} special and spare tokens (special_tokens, fim_tokens, chat_tokens, "
            f"spare_tokens). Set tokenizer.vocab_size >= {smallest}, or reserve fewer special tokens."
        )


def _check_rope_scaling(m: ModelConfig, origin: str) -> None:
    """RoPE scaling keys that would silently do nothing, or that YaRN cannot compute without."""
    kind, factor = m.rope_scaling, m.rope_factor
    if kind == "none" and factor != 1.0:
        raise ConfigError(
            f"{origin}: model.rope_factor = {factor:g} has no effect while model.rope_scaling = 'none'. Set "
            f"model.rope_scaling to 'linear', 'ntk' or 'yarn' (or, for ABF, raise model.rope_theta instead)."
        )
    if kind != "none" and factor == 1.0:
        raise ConfigError(
            f"{origin}: model.rope_scaling = {kind!r} with model.rope_factor = 1 changes nothing. Set "
            f"model.rope_factor to the context multiple: new length / trained length (e.g. 4.0 for 256 -> 1024)."
        )
    if kind == "yarn" and not m.rope_original_max_seq_len:
        raise ConfigError(
            f"{origin}: model.rope_scaling = 'yarn' needs model.rope_original_max_seq_len: set it to the "
            f"sequence length the model was trained at before the extension (e.g. 256)."
        )
    if kind != "yarn" and m.rope_original_max_seq_len:
        raise ConfigError(
            f"{origin}: model.rope_original_max_seq_len is only read by model.rope_scaling = 'yarn' (it is "
            f"{kind!r}); remove it or set model.rope_scaling = 'yarn'."
        )
    if kind == "yarn" and m.yarn_beta_fast <= m.yarn_beta_slow:
        raise ConfigError(
            f"{origin}: model.yarn_beta_fast ({m.yarn_beta_fast:g}) must exceed model.yarn_beta_slow "
            f"({m.yarn_beta_slow:g}); the defaults are 32 and 1."
        )


def describe(cls: type = Config, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, help) for every key of the pipeline config (or of `cls`)."""
    return engine_describe(cls, prefix)
